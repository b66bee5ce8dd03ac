"""LoRA on the rollout engine, a real vLLM (CPU build): the adapter a trainer publishes is
served with the log-probs the trainer computes, and a sync replaces it under requests in
flight (partial rollout). One warm engine for the module."""

import asyncio
import threading
import time

import pytest
import torch

from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import BOS, build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.lora import LoraLinear
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.weights import lora_format
from tests.unit.test_trainer import batch

pytestmark = pytest.mark.integration
PROMPT = [BOS, 7, 14, 9, 17]
LORA = {"rank": 8, "alpha": 16.0}


def recipe(path):
    return build_config(
        {
            "model": {"path": str(path), "max_seq_len": 512, "lora": LORA},
            "train": {"lr": 1e-2},
            "engine": {"kv_cache_memory_bytes": 64 << 20},
            "workload": {"max_response_tokens": 400},
        }
    )


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_pretrained(build_model(seed=0), build_tokenizer(), tmp_path_factory.mktemp("b"))


def trained(base, seed: int, boost: float) -> TorchTrainer:
    """A LoRA trainer after one step, its adapters' B scaled by ``boost`` so the adapter
    moves the log-probs far more than rounding does (still the trainer's own model)."""
    t = TorchTrainer(TorchTrainerConfig.from_config(recipe(base)), str(base))
    torch.manual_seed(seed)
    t.train_step(batch(seed))
    with torch.no_grad():
        for m in t.model.modules():
            if isinstance(m, LoraLinear):
                m.lora_B.weight.mul_(boost)
    return t


def published(t: TorchTrainer, folder) -> str:
    lora_format.write_adapter(folder, t.for_rollout(t.export_weights()), t.config.model.lora, "b")
    return str(folder)


def teacher_forced(model: torch.nn.Module, tokens: list[int]) -> list[float]:
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([PROMPT + tokens])).logits[0, :-1], -1)
    return [lp[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(tokens)]


@pytest.fixture(scope="module")
def engine(base):
    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    eng = VLLMEngine(str(base), VLLMEngineConfig.from_config(recipe(base)))
    assert eng.serves_adapter

    def run(coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    run(eng.start(0), timeout=600)
    yield eng, run, loop
    eng.shutdown()
    loop.call_soon_threadsafe(loop.stop)


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_before_a_sync_the_engine_serves_the_base_exactly(engine, base):
    from transformers import AutoModelForCausalLM

    eng, run, _ = engine
    assert eng.lora_request is not None  # the zero adapter: every request carries one
    tokens, logprobs, _, _ = run(eng.generate("zero", PROMPT, 24, ignore_eos=True))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    assert gap(logprobs, teacher_forced(model, tokens)) < 1e-3


def test_the_loaded_adapter_gives_the_trainers_logprobs(engine, base, tmp_path):
    eng, run, _ = engine
    t = trained(base, 1, 40.0)
    run(eng.update_weights(published(t, tmp_path / "v1"), 1))
    tokens, logprobs, spans, _ = run(eng.generate("v1", PROMPT, 32, ignore_eos=True))
    assert spans == [(1, 0, 32)]
    t.model.eval()
    assert gap(logprobs, teacher_forced(t.model, tokens)) < 1e-3
    plain = TorchTrainer(
        TorchTrainerConfig.from_config(recipe(base)), str(base)
    )  # its B = 0: the base
    assert gap(logprobs, teacher_forced(plain.model, tokens)) > 5e-2  # the adapter mattered


def test_a_sync_replaces_the_adapter_under_requests_in_flight(engine, base, tmp_path):
    eng, run, loop = engine
    old, new = trained(base, 2, 40.0), trained(base, 3, 40.0)
    run(eng.update_weights(published(old, tmp_path / "v2"), 2))
    held = asyncio.run_coroutine_threadsafe(
        eng.generate("held", PROMPT, 380, ignore_eos=True), loop
    )
    time.sleep(0.3)
    assert not held.done(), "generation finished before the sync; make it longer"
    run(eng.update_weights(published(new, tmp_path / "v3"), 3))
    tokens, logprobs, spans, _ = held.result(300)
    assert [v for v, _, _ in spans] == [2, 3], spans
    cut = spans[0][2]
    old.model.eval()
    new.model.eval()
    by_old, by_new = teacher_forced(old.model, tokens), teacher_forced(new.model, tokens)
    before, after = range(cut), range(cut + 1, len(tokens))
    assert max(abs(logprobs[i] - by_old[i]) for i in before) < 1e-3
    assert max(abs(logprobs[i] - by_new[i]) for i in after) < 1e-3
    assert max(abs(logprobs[i] - by_old[i]) for i in after) > 1e-2
