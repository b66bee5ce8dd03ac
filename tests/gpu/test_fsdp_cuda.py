"""The trainer on CUDA: FSDP2 over NCCL, and the rollout/trainer mismatch that off-policy
correction exists for (vLLM's bf16 kernels against the trainer's).

Marked ``gpu`` (by folder): ``make test`` leaves it out. What has run where is in
docs/trainer.md.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import random
import threading
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from runtime.config.recipe import build_config
from runtime.data.sample import Sample
from runtime.embedded.arith import sample_problem
from runtime.embedded.tiny_qwen3 import SMALL, build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.rank.collective import Collective

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def small_model(path: Path) -> str:
    shape = {k: v for k, v in SMALL.items() if k != "seed"}
    return str(save_pretrained(build_model(seed=3, **shape), build_tokenizer(), path))


def samples_from(logprobs_of, n: int = 16) -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        prob = sample_problem(rng)
        resp = prob.solution_ids()
        out.append(
            Sample(
                sample_id=i,
                group_id=i // 4,
                prompt_id=i,
                versions=[(0, 0, len(resp))],
                prompt_token_ids=prob.prompt_ids(),
                token_ids=resp,
                logprobs=logprobs_of(prob.prompt_ids(), resp),
                n_valid=len(resp),
                reward=0.0,
                advantage=[1.0, -1.0][i % 2],
            )
        )
    return out


def cfg_for(model: str, world: int, dtype: str = "bfloat16", **train) -> object:
    return build_config(
        {
            "model": {"path": model, "dtype": dtype, "max_seq_len": 256},
            "workload": {"max_response_tokens": 64},
            "train": {"lr": 1e-4, "steps": 10, **train},
            "resources": {
                "device": "cuda",
                "gpus_per_node": world + 1,
                "trainer_gpus_per_replica": world,
                "initial_ratio": f"1:{world}",
            },
        }
    )


def nccl_rank(rank: int, world: int, model: str, out: str, param_dtype: str) -> None:
    os.environ["LOCAL_RANK"] = str(rank)
    c = Collective.join(
        rank=rank,
        world_size=world,
        rendezvous=Path(out) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="cpu:gloo,cuda:nccl",
        bucket_bytes=1 << 22,
        timeout_s=300,
        trainer_group_size=world,
    )
    c.regroup(0, ("trainer",) * world)
    cfg = cfg_for(model, world, "float32", strategy="fsdp2", param_dtype=param_dtype)
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg), model, rank, c.mesh)
    assert t.sharded and t.device.type == "cuda"
    m = t.train_step(
        samples_from(lambda prompt, resp: [-2.0] * len(resp)), c.data_parallel, rank, world
    )
    weights = t.gather_weights()  # float32 masters (model.dtype float32)
    if rank == 0:
        torch.save({"weights": weights, "loss": m["loss"]}, f"{out}/weights.pt")
    c.close()


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("world", [1, 2], ids=["1-rank", "2-ranks"])
def test_fsdp2_over_nccl_makes_the_update_one_process_makes(tmp_path, world, param_dtype):
    """FSDP2 over NCCL (``world`` ranks, one GPU each; bf16 is FSDP2's
    ``MixedPrecisionPolicy``) against one replicated process on the whole batch (bf16:
    ``autocast``). AdamW's first update is ``lr * g / (|g| + eps)``, about ``+-lr`` per
    element, so the updates are compared, not the weights they barely move: in float32
    equal to rounding, in bf16 the same direction nearly everywhere."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices (one per NCCL rank)")
    model = small_model(tmp_path / "m")
    mp.start_processes(
        nccl_rank,
        args=(world, model, str(tmp_path), param_dtype),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    got = torch.load(tmp_path / "weights.pt")
    assert torch.isfinite(torch.tensor(got["loss"]))
    cfg = cfg_for(model, world, "float32", strategy="replicate", param_dtype=param_dtype)
    single = TorchTrainer(TorchTrainerConfig.from_config(cfg), model)
    before = single.export_weights()
    single.train_step(samples_from(lambda prompt, resp: [-2.0] * len(resp)))
    lr = cfg.train.lr
    moved = agree = 0
    for k, v in single.export_weights().items():
        want, have = v - before[k], got["weights"][k] - before[k]
        assert (have - want).abs().max() <= 2 * lr * 1.01  # never the opposite of a full step
        close = (have - want).abs() <= (1e-6 if param_dtype == "float32" else 0.1 * lr)
        moved += int((want != 0).sum())
        agree += int((close & (want != 0)).sum())
    assert moved > 0
    share = agree / moved
    assert share >= (0.999 if param_dtype == "float32" else 0.97), share


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_vllm_bf16_against_the_trainer_is_a_small_mismatch_that_tis_bounds(tmp_path):
    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    model = small_model(tmp_path / "m")
    cfg = cfg_for(model, 1, strategy="replicate", param_dtype="bfloat16")
    cfg.algorithm.recompute_old_logprobs = True
    cfg.algorithm.tis_cap = 2.0
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    eng = VLLMEngine(model, VLLMEngineConfig.from_config(cfg))
    asyncio.run_coroutine_threadsafe(eng.start(0), loop).result(600)
    try:
        rng = random.Random(1)
        batch = []
        for i in range(16):
            prompt = sample_problem(rng).prompt_ids()
            coro = eng.generate(f"r{i}", prompt, 32, ignore_eos=True)
            tokens, logprobs, spans, _ = asyncio.run_coroutine_threadsafe(coro, loop).result(300)
            batch.append(
                Sample(
                    sample_id=i,
                    group_id=i // 4,
                    prompt_id=i,
                    versions=[tuple(s) for s in spans],
                    prompt_token_ids=prompt,
                    token_ids=tokens,
                    logprobs=logprobs,
                    n_valid=len(tokens),
                    reward=0.0,
                    advantage=[1.0, -1.0][i % 2],
                )
            )
    finally:
        eng.shutdown()
        loop.call_soon_threadsafe(loop.stop)
    trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), model)
    m = trainer.train_step(batch)
    # Same weights on both sides: what is left is the kernels' and dtypes' mismatch.
    assert 0.0 < m["mismatch_k3"] < 0.05
    assert 0.5 < m["is_ratio_min"] <= m["is_ratio_mean"] <= m["is_ratio_max"] < 4.0
    assert m["truncated_share"] < 0.05
