"""A sharded (FSDP2) trainer's state moving shard to shard when replica groups join and
leave, through the real trainer side over four gloo processes on loopback.

Replica groups of 2 (``trainer_gpus_per_replica: 2``). Epoch 0: ranks 0 and 1 train one
step (AdamW state is not zeros), ranks 2 and 3 play rollout and hold no model. Epoch 1:
all four are trainers; ranks 2 and 3 (a joining replica group) receive shards 0 and 1
from ranks 0 and 1, who keep their own; the two replicas train a step in agreement, with
rank 0's and rank 3's state offloaded and restored before it (the storage-resize
mechanism of the GPU path, run on the CPU). Epoch 2: back to one replica group; ranks 2
and 3 free their shards without copying them (stale after the next step), send nothing,
and receive the leader's weights
as new rollout ranks; ranks 0 and 1 keep their shards and train on. Each switch runs
the worker's order: the side left is deactivated or the one taken activated,
the regroup, ``on_layout``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from runtime.config.layout import LayoutChange
from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.offload import local_tensor
from runtime.engines.torch.shard_handoff import training_tensors
from runtime.weights import p2p
from tests.integration.test_fsdp_trainer import batch, cfg_for, join

pytestmark = pytest.mark.integration

WORLD, GROUP = 4, 2
ONE = ("trainer", "trainer", "rollout", "rollout")
TWO = ("trainer",) * 4


def snapshot(side) -> list[torch.Tensor]:
    """Copies of this rank's local training tensors (parameters, exp_avg, exp_avg_sq,
    step per parameter)."""
    return [t.detach().clone() for t in training_tensors(side.trainer.model, side.trainer.opt)]


def switch(side, c, rank: int, epoch: int, before: tuple, after: tuple) -> dict:
    """One role switch in the worker's order (runtime/rank/worker.py ``_switch``)."""
    change = LayoutChange(epoch, before, after)
    if before[rank] != after[rank]:
        (side.deactivate if before[rank] == "trainer" else side.activate)()
    entered = side.offload_state
    c.regroup(epoch, after)
    side.on_layout(change)
    return {"entered": entered, "state": side.offload_state, **side.last_switch}


def handoff_script(rank: int, model_dir: str, out: str, lora: dict | None = None) -> None:
    from runtime.engines.torch.trainer_side import TorchTrainerSide
    from runtime.store.run_dir import RunPaths

    c = join(rank, WORLD, out, GROUP)
    c.regroup(0, ONE)
    cfg = cfg_for(model_dir, WORLD, GROUP, strategy="fsdp2", **({"lora": lora} if lora else {}))
    side = TorchTrainerSide(cfg, rank, RunPaths(Path(out)), c)
    # the worker's first role: the side not played starts asleep
    side.activate() if ONE[rank] == "trainer" else side.deactivate()
    r: dict = {"start": side.offload_state, "handoff_dirs": []}
    if rank < 2:
        side.trainer.train_step(batch(), c.data_parallel, rank, 2)
        r["one"] = snapshot(side)

    r["switch1"] = switch(side, c, rank, 1, ONE, TWO)
    r["handoff_dirs"].append((Path(out) / "handoff").exists())
    r["after1"] = snapshot(side)
    r["bytes"] = sum(t.numel() * t.element_size() for t in r["after1"])
    r["step1"] = (side.trainer.step, side.trainer.version)

    if rank in (0, 3):  # a sender and a receiver: the copy-and-resize path, on the CPU
        held = snapshot(side)
        moved = side.trainer.offload(move=True)
        live = training_tensors(side.trainer.model, side.trainer.opt)
        r["offloaded_storage"] = sum(local_tensor(t).untyped_storage().nbytes() for t in live)
        r["offloaded_bytes"] = moved.bytes
        side.trainer.reload()
        r["reloaded_equal"] = all(
            torch.equal(a, b) for a, b in zip(held, snapshot(side), strict=True)
        )
    side.trainer.train_step(batch(), c.data_parallel, rank, WORLD)
    r["spread2"] = c.data_parallel.replica_spread(side.trainer.checksum())
    r["two"] = snapshot(side)
    # a sync point, as train_batch makes one: the full weights gathered for the leader,
    # who sends them to the ranks that join the rollout pool when the layout changes
    side._gathered = side.trainer.gather_weights()

    r["switch2"] = switch(side, c, rank, 2, TWO, ONE)
    if rank >= 2:  # what the rollout side does on joining the pool
        r["weights_v"], weights = p2p.receive_whole(c.sync)
        r["weights_sum"] = float(sum(w.double().sum() for w in weights.values()))
    elif rank == 0:
        r["weights_sum"] = float(sum(w.double().sum() for w in side._gathered.values()))
    r["handoff_dirs"].append((Path(out) / "handoff").exists())
    if rank < 2:
        r["back"] = snapshot(side)
        metrics = side.trainer.train_step(batch(), c.data_parallel, rank, 2)
        r["loss3"] = metrics["loss"]
        r["step3"] = side.trainer.step
        r["adam_steps3"] = {float(s["step"]) for s in side.trainer.opt.state.values()}
        r["three"] = snapshot(side)
    torch.save(r, f"{out}/rank{rank}.pt")
    c.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return str(save_pretrained(build_model(seed=5), build_tokenizer(), path))


@pytest.fixture(scope="module")
def ranks(model_dir, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(
        handoff_script, args=(model_dir, str(out)), nprocs=WORLD, join=True, start_method="spawn"
    )
    return [torch.load(out / f"rank{i}.pt", weights_only=False) for i in range(WORLD)]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        for x, y in zip(a, b, strict=True)
    )


def test_a_joining_replica_group_receives_each_shard_bit_exact(ranks):
    r0, r1, r2, r3 = ranks
    assert [r["start"] for r in ranks] == ["on_device", "on_device", "none", "none"]
    assert not same(r0["one"], r1["one"])  # two different shards: the check can tell
    # every local tensor of shard 0 on rank 2 and of shard 1 on rank 3, AdamW included
    assert same(r2["after1"], r0["one"]) and same(r3["after1"], r1["one"])
    assert same(r0["after1"], r0["one"]) and same(r1["after1"], r1["one"])  # kept
    steps = [t for i, t in enumerate(r0["one"]) if i % 4 == 3]
    assert steps and all(float(s) == 1.0 for s in steps)  # AdamW had stepped
    assert all(r["step1"] == (1, 1) for r in ranks)  # the joiners got step and version


def test_the_state_moves_point_to_point_and_not_through_the_disk(ranks):
    s = [r["switch1"] for r in ranks]
    # the joiners' activate ran before their shards existed: it did nothing
    assert [x["entered"] for x in s[2:]] == ["none", "none"]
    assert all(x["restore_bytes"] == 0 for x in s)
    assert all(x["state"] == "on_device" for x in s)
    for sender, receiver in ((0, 2), (1, 3)):
        assert s[receiver]["received_bytes"] == ranks[receiver]["bytes"] > 0
        assert s[sender]["sent_bytes"] == s[receiver]["received_bytes"]
        assert s[sender]["received_bytes"] == 0 and s[receiver]["sent_bytes"] == 0
        assert s[sender]["peers"] == s[receiver]["peers"] == 1
        assert s[sender]["kept_bytes"] == ranks[sender]["bytes"]  # its own, no copy sent
    assert not any(d for r in ranks for d in r["handoff_dirs"])


def test_two_replica_groups_train_in_agreement_after_an_offload_and_restore(ranks):
    r0, r1, r2, r3 = ranks
    for r in (r0, r3):
        assert r["offloaded_storage"] == 0  # every device storage freed
        # its local tensors, plus FSDP2's shard padding and the model's buffers
        assert r["offloaded_bytes"] >= r["bytes"]
        assert r["reloaded_equal"]
    assert r0["spread2"] == 0.0
    assert same(r0["two"], r2["two"]) and same(r1["two"], r3["two"])
    assert not same(r0["two"], r0["after1"])  # the step moved them


def test_a_leaving_replica_group_sends_nothing_and_the_rest_train_on(ranks):
    r0, r1, r2, r3 = ranks
    s = [r["switch2"] for r in ranks]
    # the leavers keep no copy: their shards go stale with the next step
    assert [x["entered"] for x in s] == ["on_device", "on_device", "none", "none"]
    assert [x["state"] for x in s] == ["on_device", "on_device", "none", "none"]
    assert [x["offload_bytes"] for x in s[2:]] == [0.0, 0.0]
    assert s[2]["dropped_bytes"] >= r2["bytes"] > 0 and s[3]["dropped_bytes"] >= r3["bytes"]
    assert all(x["sent_bytes"] == 0 and x["received_bytes"] == 0 for x in s)
    assert same(r0["back"], r0["two"]) and same(r1["back"], r1["two"])
    assert s[0]["kept_bytes"] == r0["bytes"]
    assert r0["step3"] == r1["step3"] == 3 and r0["adam_steps3"] == {3.0}
    assert torch.isfinite(torch.tensor(r0["loss3"]))
    assert not same(r0["three"], r0["two"])
    # the leader's weights still reach the new rollout ranks
    assert r2["weights_v"] == r3["weights_v"] == 2
    assert r2["weights_sum"] == r3["weights_sum"] == r0["weights_sum"]


def transfer_script(rank: int, out: str) -> None:
    """Rank 0 serves ranks 1 and 2 at once, in buckets smaller than a tensor and across
    dtypes; then rank 2 expects other shapes, and all three refuse at once."""
    import time

    from runtime.engines.torch.shard_handoff import HandoffError, plan_sources, transfer

    c = join(rank, 3, out, 1, timeout_s=60)
    cpu = torch.device("cpu")
    sources = plan_sources([0], [0, 1, 2], 1)
    g = torch.Generator().manual_seed(7)
    sent = [
        torch.randn(5, 3, generator=g),
        torch.randn(4, generator=g).bfloat16(),
        torch.tensor(9.0),
    ]
    tensors = sent if rank == 0 else [torch.zeros_like(t) for t in sent]
    mine = (7, 3, 2) if rank == 0 else (0, 0, 0)  # step, version, updates done
    stats, counters = transfer(tensors, sources, rank, cpu, 16, mine, group=None)
    r: dict = {"equal": all(torch.equal(a, b) for a, b in zip(tensors, sent, strict=True))}
    r.update(counters=counters, sent=stats.sent_bytes, received=stats.received_bytes)
    r["peers"] = stats.peers
    wrong = [torch.zeros(5, 4), *tensors[1:]] if rank == 2 else tensors
    start = time.monotonic()
    try:
        transfer(wrong, sources, rank, cpu, 16, (7, 3, 0), group=None)
        r["refused"] = ""
    except HandoffError as exc:
        r["refused"] = str(exc)
    r["refused_in_s"] = time.monotonic() - start
    torch.save(r, f"{out}/transfer{rank}.pt")
    c.close()


def test_one_source_serves_two_receivers_and_a_mismatch_is_refused_on_every_rank(tmp_path):
    mp.start_processes(
        transfer_script, args=(str(tmp_path),), nprocs=3, join=True, start_method="spawn"
    )
    r = [torch.load(tmp_path / f"transfer{i}.pt", weights_only=False) for i in range(3)]
    assert all(x["equal"] for x in r)
    nbytes = 15 * 4 + 4 * 2 + 4
    assert r[0]["sent"] == 2 * nbytes and r[0]["peers"] == [1, 2]
    assert r[1]["received"] == r[2]["received"] == nbytes
    assert [x["counters"] for x in r] == [(7, 3, 2)] * 3  # the receivers take the source's
    assert "ranks [2] expect another trainer state" in r[0]["refused"]
    assert "local shards differ" in r[2]["refused"]
    assert "another of its receivers" in r[1]["refused"]
    assert all(x["refused_in_s"] < 30 for x in r)  # at once, not the group's timeout


def test_a_lora_trainer_hands_off_adapters_moments_and_base_alike(model_dir, tmp_path):
    """The same switches with ``model.lora``: the joiners receive the frozen base shards
    and the adapters with their AdamW state bit-exact (no AdamW state for the base), an
    offload frees every storage and comes back equal, and the replicas train in step."""
    lora = {"rank": 4, "alpha": 8.0}
    mp.start_processes(
        handoff_script,
        args=(model_dir, str(tmp_path), lora),
        nprocs=WORLD,
        join=True,
        start_method="spawn",
    )
    r0, r1, r2, r3 = [torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(4)]
    assert same(r2["after1"], r0["one"]) and same(r3["after1"], r1["one"])
    assert all(r["step1"] == (1, 1) for r in (r0, r1, r2, r3))
    for r in (r0, r3):
        assert r["offloaded_storage"] == 0 and r["reloaded_equal"]
    assert r0["spread2"] == 0.0
    assert same(r0["two"], r2["two"]) and same(r1["two"], r3["two"])
    assert not same(r0["two"], r0["after1"])
    # only what trains travels: the 28 adapters (2 blocks x 7 layers x A, B), each with
    # exp_avg, exp_avg_sq and step; the frozen base is the model folder's on every rank
    # (spread2 == 0 above: the replicas' checksums, base included, agree)
    assert len(r0["one"]) == 28 * 4
    assert r0["switch1"]["sent_bytes"] == r2["switch1"]["received_bytes"] > 0
    assert r0["loss3"] == r0["loss3"] and r0["step3"] == 3
