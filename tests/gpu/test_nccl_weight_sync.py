"""Weight sync over NCCL straight into vLLM's GPU memory (runtime/engines/vllm/
weight_transfer.py), from a replicated trainer and from a 2-rank FSDP2 one.

Each case runs real ranks: the trainers (one GPU each) train a step, so their weights
differ from the model file, and stream them (bf16, many buckets) to a rank running the
real rollout side on a GPU of its own. That rank goes through a role switch first: asleep
at level 2 (its weights dropped), awake, then it joins the rollout pool and receives the
weights in ``on_layout``. A second stream of the same version is drained (no pause, no
reload). The engine's log-probs of what it then samples must match the trainer's teacher
forcing within the band truncated importance sampling is for (bf16 kernels on both
sides), and not the model file's.

NCCL cannot put two ranks of one group on one GPU, so the cases need 2 and 3 devices.
Marked ``gpu`` (by folder); never run on the CPU-only machines this project is built on.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.config.layout import LayoutChange
from runtime.config.recipe import build_config
from runtime.data.sample import Sample
from runtime.embedded.arith import sample_problem
from runtime.embedded.tiny_qwen3 import SMALL, build_model, build_tokenizer, save_pretrained
from runtime.rank.collective import Collective

# The GPU check (scripts/gpu-check.sh) runs this folder where vLLM is not installed;
# find_spec, not an import: collecting must stay cheap where vLLM is there.
pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM"),
]

N_PROMPTS, N_TOKENS = 8, 32
TIS_CAP = 2.0


def small_model(path: Path) -> str:
    shape = {k: v for k, v in SMALL.items() if k != "seed"}
    return str(save_pretrained(build_model(seed=3, **shape), build_tokenizer(), path))


def cfg_for(model: str, world: int, group: int, strategy: str):
    return build_config(
        {
            "model": {"path": model, "dtype": "bfloat16", "max_seq_len": 256},
            "workload": {"max_response_tokens": 64},
            "train": {"lr": 1e-2, "steps": 10, "strategy": strategy},
            # 25M parameters in bf16 = 50 MB: dozens of buckets, the large tensors alone
            "engine": {"weight_bucket_mb": 1.0, "kv_cache_memory_bytes": 1 << 30},
            "algorithm": {"temperature": 1.0},
            "resources": {
                "device": "cuda",
                "gpus_per_node": world,
                "trainer_gpus_per_replica": group,
                "initial_ratio": f"1:{world - 1}",
            },
        }
    )


def train_batch() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for i in range(8):
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
                logprobs=[-2.0] * len(resp),
                n_valid=len(resp),
                reward=0.0,
                advantage=[1.0, -1.0][i % 2],
            )
        )
    return out


def prompts() -> list[list[int]]:
    rng = random.Random(1)
    return [sample_problem(rng).prompt_ids() for _ in range(N_PROMPTS)]


def share_tokens(src: int, rows: list[list[int]] | None) -> list[list[int]]:
    """The rollout rank's sampled rows (all N_TOKENS long), on every rank (gloo, CPU)."""
    t = (
        torch.tensor(rows)
        if rows is not None
        else torch.zeros(N_PROMPTS, N_TOKENS, dtype=torch.long)
    )
    dist.broadcast(t, src=src)
    return t.tolist()


def rank_script(rank: int, world: int, group: int, strategy: str, model: str, out: str) -> None:
    rollout = world - 1
    if rank == rollout:  # its own GPU: the trainers hold devices 0..world-2
        os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    else:
        os.environ["LOCAL_RANK"] = str(rank)
    c = Collective.join(
        rank=rank,
        world_size=world,
        rendezvous=Path(out) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="cpu:gloo,cuda:nccl",
        bucket_bytes=1 << 22,
        timeout_s=600,  # the engine starts before it receives
        trainer_group_size=group,
    )
    roles = ("trainer",) * rollout + ("rollout",)
    c.regroup(0, roles)
    cfg = cfg_for(model, world, group, strategy)
    result: dict = {}
    if rank < rollout:
        from runtime.engines.torch.settings import TorchTrainerConfig
        from runtime.engines.torch.trainer import TorchTrainer
        from runtime.weights.send import WeightStreamer
        from runtime.weights.settings import WeightPathConfig

        trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), model, rank, c.mesh)
        trainer.train_step(train_batch(), c.data_parallel, rank, rollout)
        streamer = WeightStreamer(WeightPathConfig.from_config(cfg), c.sync, c.mesh)
        if streamer.takes_part(trainer.sharded):
            first = streamer.stream(trainer.model, trainer.version)  # the joining rank
            again = streamer.stream(trainer.model, trainer.version)  # drained: same version
            result["records"] = [first.as_dict(), again.as_dict()]
        rows = share_tokens(rollout, None)
        samples = [
            Sample(
                sample_id=i,
                group_id=i,
                prompt_id=i,
                versions=[(1, 0, N_TOKENS)],
                prompt_token_ids=p,
                token_ids=r,
                logprobs=[0.0] * N_TOKENS,
                n_valid=N_TOKENS,
                reward=0.0,
            )
            for i, (p, r) in enumerate(zip(prompts(), rows, strict=True))
        ]
        with torch.no_grad():  # teacher forcing, every trainer rank (FSDP2 is collective)
            result["trainer"] = trainer._forward(samples).float().cpu().tolist()
        streamer.close()
    else:
        from runtime.engines.vllm.rollout import VLLMRolloutSide
        from runtime.store.run_dir import RunPaths

        side = VLLMRolloutSide(cfg, rank, RunPaths(Path(out)), c)
        try:
            side.deactivate()
            result["slept"] = dict(side.last_switch)
            result["valid_asleep"] = side.engine.weights_valid
            side.activate()
            side.on_layout(LayoutChange(1, ("trainer",) * world, roles))
            result["joined"] = dict(side.last_switch)
            side._receive_weights(wait=True)  # the same version again
            result["syncs"] = list(side.sync_records)
            result["version"] = side.engine.version
            rows, logprobs = [], []
            for i, p in enumerate(prompts()):
                coro = side.engine.generate(f"g{i}", p, N_TOKENS, ignore_eos=True)
                tokens, lps, _, _ = side._call(coro).result(300)
                rows.append(tokens)
                logprobs.append(lps)
            share_tokens(rollout, rows)
            result["rows"], result["vllm"] = rows, logprobs
        finally:
            side.close()
    torch.save(result, f"{out}/rank{rank}.pt")
    c.close()


def file_logprobs(model: str, rows: list[list[int]]) -> list[list[float]]:
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16).cuda()
    out = []
    with torch.no_grad():
        for p, r in zip(prompts(), rows, strict=True):
            lp = torch.log_softmax(m(torch.tensor([p + r]).cuda()).logits[0, :-1].float(), -1)
            out.append([lp[len(p) - 1 + i, t].item() for i, t in enumerate(r)])
    return out


@pytest.mark.parametrize(
    ("world", "group", "strategy"),
    [(2, 1, "replicate"), (3, 2, "fsdp2")],
    ids=["replicated-trainer", "fsdp2-2-ranks"],
)
def test_nccl_weight_sync_gives_vllm_the_trainers_logprobs_within_the_tis_band(
    world, group, strategy, tmp_path
):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} CUDA devices (one per NCCL rank)")
    model = small_model(tmp_path / "m")
    mp.start_processes(
        rank_script,
        args=(world, group, strategy, model, str(tmp_path)),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    r = [torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(world)]
    leader, roll = r[0], r[-1]
    first, again = leader["records"]
    assert first["transport"] == "nccl" and first["buckets"] > 10 and first["bytes"] > 40e6
    assert first["peak_gathered_bytes"] < first["bytes"] / 4  # never the whole state
    # the role switch: level 2 dropped the weights, joining brought them over NCCL
    assert roll["slept"]["sleep_level"] == 2.0 and roll["slept"]["slept_on_device"] == 1.0
    assert not roll["valid_asleep"] and roll["version"] == 1
    assert roll["joined"]["wake_s"] > 0 and roll["joined"]["weights_bytes"] == first["bytes"]
    loaded, drained = roll["syncs"][-2:]
    assert loaded["nccl"] == drained["nccl"] == 1.0
    assert loaded["loaded"] == 1.0 and drained["loaded"] == 0.0  # same version: drained
    assert again["bytes"] == first["bytes"]
    # log-probs: the trainer's teacher forcing against vLLM's sampling, both bf16
    diffs = [
        t - v
        for trow, vrow in zip(leader["trainer"], roll["vllm"], strict=True)
        for t, v in zip(trow, vrow, strict=True)
    ]
    k3 = sum(math.exp(d) - 1 - d for d in diffs) / len(diffs)  # KL(rollout || trainer)
    inside = sum(1 / TIS_CAP <= math.exp(d) <= TIS_CAP for d in diffs) / len(diffs)
    assert k3 < 0.05 and inside > 0.95, (k3, inside)
    # ... while the model file's weights are far off: the trained ones arrived
    stale = [
        f - v
        for frow, vrow in zip(file_logprobs(model, roll["rows"]), roll["vllm"], strict=True)
        for f, v in zip(frow, vrow, strict=True)
    ]
    assert sum(abs(d) for d in stale) / len(stale) > 10 * sum(abs(d) for d in diffs) / len(diffs)
