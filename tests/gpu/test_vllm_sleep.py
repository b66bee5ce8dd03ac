"""vLLM sleep mode on CUDA: what an inactive rollout side does on a GPU node.

Marked ``gpu`` (by folder): ``make test`` leaves it out and it has not been run on the
CPU-only machines this project is built on.
"""

import asyncio
import threading

import pytest
import torch

from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import BOS, build_model, build_tokenizer, save_pretrained

# A marker, not a skip at import: `make test` deselects this folder (`-m "not gpu"`).
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_sleep_frees_memory_and_wake_up_generates_the_same(tmp_path):
    from runtime.engines.vllm.rollout import VLLMEngine

    path = save_pretrained(build_model(seed=0), build_tokenizer(), tmp_path / "m")
    cfg = build_config(
        {
            "model": {"path": str(path), "max_seq_len": 256},
            "resources": {"device": "cuda"},
            "algorithm": {"temperature": 1.0},
        }
    )
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(300)

    eng = VLLMEngine(str(path), cfg)
    run(eng.start(0))
    try:
        greedy = build_config({"algorithm": {"temperature": 1e-6}})
        eng.temperature = greedy.algorithm.temperature
        before = run(eng.generate("a", [BOS, 5, 6], 16))[0]
        free_awake = torch.cuda.mem_get_info()[0]
        run(eng.sleep())
        assert torch.cuda.mem_get_info()[0] > free_awake  # KV cache and weights released
        run(eng.wake_up())
        assert run(eng.generate("b", [BOS, 5, 6], 16))[0] == before
    finally:
        eng.shutdown()
        loop.call_soon_threadsafe(loop.stop)
