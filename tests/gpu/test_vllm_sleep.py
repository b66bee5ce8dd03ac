"""vLLM sleep mode on CUDA: what an inactive rollout side does on a GPU node.

Level 1 offloads the weights to host memory and level 2 drops them (the rank gets them
again on joining the rollout pool); either frees the GPU for the trainer side, and after
waking (and, after level 2, a reload) the engine generates exactly what it did before.
The role switch itself (``deactivate`` / ``activate`` of the rollout side) is run too; its
level-2 path with weights arriving over NCCL is in tests/gpu/test_nccl_weight_sync.py.

Marked ``gpu`` (by folder): ``make test`` leaves it out and it has not been run on the
CPU-only machines this project is built on.
"""

import asyncio
import importlib.util
import threading
from pathlib import Path

import pytest
import torch

from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import BOS, build_model, build_tokenizer, save_pretrained

# A marker, not a skip at import: `make test` deselects this folder (`-m "not gpu"`).
# The GPU check (scripts/gpu-check.sh) runs this folder where vLLM is not installed;
# find_spec, not an import: collecting must stay cheap where vLLM is there.
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM"),
]

PROMPT = [BOS, 5, 6]
GREEDY = 1e-6  # a temperature this low samples the argmax


def cuda_cfg(path: Path):
    return build_config(
        {
            "model": {"path": str(path), "max_seq_len": 256},
            "workload": {"max_response_tokens": 64},
            "resources": {"device": "cuda"},
            "engine": {"kv_cache_memory_bytes": 1 << 30},
            "algorithm": {"temperature": 1.0},
        }
    )


@pytest.fixture
def engine(tmp_path):
    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    path = save_pretrained(build_model(seed=0), build_tokenizer(), tmp_path / "m")
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(300)

    eng = VLLMEngine(str(path), VLLMEngineConfig.from_config(cuda_cfg(path)))
    run(eng.start(0))
    eng.temperature = GREEDY
    try:
        yield eng, run, path
    finally:
        eng.shutdown()
        loop.call_soon_threadsafe(loop.stop)


def test_level_1_offloads_and_wakes_up_generating_the_same(engine):
    eng, run, _ = engine
    before = run(eng.generate("a", PROMPT, 16))[0]
    free_awake = torch.cuda.mem_get_info()[0]
    run(eng.sleep(1))
    assert eng.sleep_level == 1 and eng.weights_valid
    assert torch.cuda.mem_get_info()[0] > free_awake  # KV cache and weights released
    run(eng.wake_up())
    assert eng.sleep_level == 0
    assert run(eng.generate("b", PROMPT, 16))[0] == before


def test_level_2_drops_the_weights_and_a_reload_brings_them_back(engine):
    eng, run, path = engine
    before = run(eng.generate("a", PROMPT, 16))[0]
    free_awake = torch.cuda.mem_get_info()[0]
    run(eng.sleep(2))
    assert eng.sleep_level == 2 and not eng.weights_valid  # a reload is owed
    assert torch.cuda.mem_get_info()[0] > free_awake
    run(eng.wake_up())
    run(eng.update_weights(str(path), 1))  # what a rank joining the rollout pool gets
    assert eng.weights_valid and eng.version == 1
    assert run(eng.generate("b", PROMPT, 16))[0] == before


def test_a_role_switch_frees_the_gpu_for_the_trainer_and_comes_back(tmp_path):
    """Without a process group the side sleeps at level 1 (nothing would send weights
    back); the memory it frees can be taken by the trainer side meanwhile."""
    from runtime.engines.vllm.rollout import VLLMRolloutSide
    from runtime.store.run_dir import RunPaths

    path = save_pretrained(build_model(seed=0), build_tokenizer(), tmp_path / "m")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    side = VLLMRolloutSide(cuda_cfg(path), 0, RunPaths(run_dir), None)
    try:
        side.engine.temperature = GREEDY
        side.activate()
        before = side._call(side.engine.generate("a", PROMPT, 16)).result(300)[0]
        free_awake = torch.cuda.mem_get_info()[0]
        side.deactivate()
        assert side.sleep_level() == 1 and side.last_switch["sleep_level"] == 1.0
        assert side.last_switch["slept_on_device"] == 1.0 and side.last_switch["sleep_s"] > 0
        freed = torch.cuda.mem_get_info()[0] - free_awake
        assert freed > 0
        # the trainer side's turn: most of what the engine freed is there to take
        taken = torch.empty(int(freed * 0.8), dtype=torch.uint8, device="cuda")
        del taken
        torch.cuda.empty_cache()
        side.activate()
        assert side.last_switch["wake_s"] > 0 and side.engine.sleep_level == 0
        after = side._call(side.engine.generate("b", PROMPT, 16)).result(300)[0]
        assert after == before
    finally:
        side.close()
