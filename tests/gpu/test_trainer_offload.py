"""The trainer's offload on a role switch, on CUDA, and the shard handoff over NCCL.

Offloading must free at least the parameters' and AdamW's bytes on the device (into
pinned host memory), take them back on restore, and change no value; the trainer trains
on after. Replicated in this process; FSDP2 in a one-rank NCCL group (a spawned process);
with two GPUs, a joining FSDP2 replica receives its state over NCCL, bit-exact.

Marked ``gpu`` (by folder): ``make test`` leaves it out. What has run where is in
docs/trainer.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from runtime.config.layout import LayoutChange
from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import SMALL, build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.offload import local_tensor
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.shard_handoff import training_tensors
from runtime.engines.torch.trainer import TorchTrainer
from runtime.rank.collective import Collective
from tests.gpu.test_fsdp_cuda import samples_from

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    shape = {k: v for k, v in SMALL.items() if k != "seed"}
    path = tmp_path_factory.mktemp("small")
    return str(save_pretrained(build_model(seed=3, **shape), build_tokenizer(), path))


def cfg_for(model: str, strategy: str, world: int = 1, group: int = 1):
    return build_config(
        {
            "model": {"path": model, "dtype": "bfloat16", "max_seq_len": 256},
            "workload": {"max_response_tokens": 64},
            "train": {"lr": 1e-4, "steps": 10, "strategy": strategy},
            "resources": {
                "device": "cuda",
                "gpus_per_node": world + 1,
                "trainer_gpus_per_replica": group,
                "initial_ratio": f"1:{world}",
            },
        }
    )


def batch():
    return samples_from(lambda prompt, resp: [-2.0] * len(resp), n=8)


def state_bytes(t: TorchTrainer) -> int:
    """The device bytes of this rank's parameters (local shards) and AdamW moments."""
    return sum(
        x.numel() * x.element_size()
        for x in training_tensors(t.model, t.opt)
        if x.device.type == "cuda"
    )


def offload_round_trip(t: TorchTrainer) -> dict:
    """Offload and restore ``t`` after a step: device memory and values at each point."""
    t.train_step(batch())
    torch.cuda.synchronize()
    before = [x.detach().clone() for x in training_tensors(t.model, t.opt)]
    held = torch.cuda.memory_allocated()
    need = state_bytes(t)
    moved = t.offload()
    out = {
        "need": need,
        "moved": moved.bytes,
        "freed": held - torch.cuda.memory_allocated(),
        "pinned": t.residency.held is not None and t.residency.held.host.is_pinned(),
        "state": t.offload_state,
    }
    # the grown-back storages, minus the gradients the offload dropped
    t.reload()
    out["back"] = torch.cuda.memory_allocated() - (held - out["freed"])
    after = [x.detach().clone() for x in training_tensors(t.model, t.opt)]
    out["equal"] = all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    out["loss"] = t.train_step(batch())["loss"]
    return out


def check(out: dict) -> None:
    assert out["state"] == "offloaded" and out["pinned"]
    assert out["moved"] >= out["need"] > 0
    assert out["freed"] >= out["need"]  # parameters and AdamW left the device
    assert out["back"] >= out["need"]  # and came back
    assert out["equal"]
    assert torch.isfinite(torch.tensor(out["loss"]))


def test_a_replicated_trainer_offloads_to_pinned_memory_and_back(model_dir):
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg_for(model_dir, "replicate")), model_dir)
    check(offload_round_trip(t))


def _join(rank: int, world: int, out: str) -> Collective:
    os.environ["LOCAL_RANK"] = str(rank)
    return Collective.join(
        rank=rank,
        world_size=world,
        rendezvous=Path(out) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="cpu:gloo,cuda:nccl",
        bucket_bytes=8 << 20,
        timeout_s=300,
        trainer_group_size=1,
    )


def fsdp_offload_rank(rank: int, model: str, out: str) -> None:
    c = _join(rank, 1, out)
    c.regroup(0, ("trainer",))
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg_for(model, "fsdp2")), model, rank, c.mesh)
    assert t.sharded
    torch.save(offload_round_trip(t), f"{out}/offload.pt")
    c.close()


def test_an_fsdp2_trainer_offloads_its_shards_and_trains_on(model_dir, tmp_path):
    mp.start_processes(
        fsdp_offload_rank, args=(model_dir, str(tmp_path)), nprocs=1, start_method="spawn"
    )
    check(torch.load(tmp_path / "offload.pt", weights_only=False))


def fsdp_leaving_rank(rank: int, model: str, out: str) -> None:
    """The trainer side of a sharded trainer's rank leaving the trainer (the worker's
    ``deactivate``): its shards freed on the device, nothing copied to the host."""
    from runtime.engines.torch.trainer_side import TorchTrainerSide
    from runtime.store.run_dir import RunPaths

    c = _join(rank, 1, out)
    c.regroup(0, ("trainer",))
    side = TorchTrainerSide(cfg_for(model, "fsdp2"), rank, RunPaths(Path(out)), c)
    side.trainer.train_step(batch(), c.data_parallel, 0, 1)
    torch.cuda.synchronize()
    need, held = state_bytes(side.trainer), torch.cuda.memory_allocated()
    side.deactivate()
    out_ = {
        "need": need,
        "freed": held - torch.cuda.memory_allocated(),
        "state": side.offload_state,
        "switch": dict(side.last_switch),
    }
    torch.save(out_, f"{out}/leaving.pt")
    c.close()


def test_a_sharded_trainers_leaving_rank_frees_its_shards_without_a_copy(model_dir, tmp_path):
    mp.start_processes(
        fsdp_leaving_rank, args=(model_dir, str(tmp_path)), nprocs=1, start_method="spawn"
    )
    out = torch.load(tmp_path / "leaving.pt")  # plain numbers and strings: weights_only
    assert out["state"] == "none"
    assert out["switch"]["offload_bytes"] == 0.0  # no copy to the host
    assert out["switch"]["dropped_bytes"] >= out["need"] > 0
    assert out["freed"] >= out["need"]  # parameters and AdamW left the device


def handoff_rank(rank: int, model: str, out: str) -> None:
    """Rank 0 trains alone, then rank 1 joins as a second replica group (of one rank)
    and receives rank 0's shards over NCCL; both train a step in agreement."""
    from runtime.engines.torch.trainer_side import TorchTrainerSide
    from runtime.store.run_dir import RunPaths

    before, after = ("trainer", "rollout"), ("trainer", "trainer")
    c = _join(rank, 2, out)
    c.regroup(0, before)
    side = TorchTrainerSide(cfg_for(model, "fsdp2", world=2), rank, RunPaths(Path(out)), c)
    if rank == 0:
        side.trainer.train_step(batch(), c.data_parallel, 0, 1)
    else:
        side.deactivate()
        side.activate()  # the worker's switch: cheap, the shards come in on_layout
    change = LayoutChange(1, before, after)
    c.regroup(1, after)
    side.on_layout(change)
    mine = [
        local_tensor(x).detach().cpu()
        for x in training_tensors(side.trainer.model, side.trainer.opt)
    ]
    side.trainer.train_step(batch(), c.data_parallel, rank, 2)
    spread = c.data_parallel.replica_spread(side.trainer.checksum())
    torch.save({"state": mine, "switch": side.last_switch, "spread": spread}, f"{out}/r{rank}.pt")
    c.close()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_a_joining_fsdp2_replica_receives_its_shards_over_nccl(model_dir, tmp_path):
    mp.start_processes(
        handoff_rank, args=(model_dir, str(tmp_path)), nprocs=2, start_method="spawn"
    )
    r0, r1 = (torch.load(tmp_path / f"r{i}.pt", weights_only=False) for i in range(2))
    assert all(torch.equal(a, b) for a, b in zip(r0["state"], r1["state"], strict=True))
    assert r1["switch"]["received_bytes"] == r0["switch"]["sent_bytes"] > 0
    assert r0["spread"] == 0.0
