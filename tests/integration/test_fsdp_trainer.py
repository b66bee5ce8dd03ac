"""The FSDP2 trainer over real gloo process groups, against one process on the whole batch.

Each case starts ``world`` processes on loopback, shards the real trainer's model over them
(``train.strategy: fsdp2``; a ``("replicate", "shard")`` mesh of replica groups of
``group`` ranks) and takes one step on a batch with replayed samples and multi-turn loss
masks; the gathered parameters must equal those of a single replicated process that
trained the whole batch in one pass (fp32).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from runtime.config.recipe import build_config
from runtime.data.micro_batches import sample_plans
from runtime.data.sample import Batch
from runtime.embedded.tiny_qwen3 import (
    build_model,
    build_moe_model,
    build_tokenizer,
    save_pretrained,
)
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.rank.collective import Collective
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.integration.test_collective import make_batch

pytestmark = pytest.mark.integration


def cfg_for(model_dir: str, world: int, group: int, **train):
    lora = train.pop("lora", {})  # model.lora, carried with the train fields
    algorithm = train.pop("algorithm", {})  # likewise
    return build_config(
        {
            "model": {"path": model_dir, "lora": lora},
            "algorithm": algorithm,
            "train": {"lr": 1e-3, "steps": 10, **train},
            "reflow": {"tau": 0.5},
            "resources": {
                "gpus_per_node": world + 1,
                "trainer_gpus_per_replica": group,
                "initial_ratio": f"1:{world}",
            },
        }
    )


def batch():
    samples = make_batch(1, n=9)
    # a multi-turn sample: environment tokens in the middle are not trained on
    s = samples[4]
    s.loss_mask = [1] * 3 + [0] * (len(s.token_ids) - 5) + [1] * 2
    s.n_valid = sum(s.loss_mask)
    return samples


def join(rank: int, world: int, out: str, group: int, timeout_s: float = 120) -> Collective:
    """This process as rank ``rank`` of a gloo group on loopback (one torch thread)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    return Collective.join(
        rank=rank,
        world_size=world,
        rendezvous=Path(out) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="gloo",
        bucket_bytes=1 << 20,
        timeout_s=timeout_s,
        trainer_group_size=group,
    )


def rank_script(rank: int, world: int, group: int, model_dir: str, out: str, train: dict):
    c = join(rank, world, out, group)
    c.regroup(0, ("trainer",) * world)
    cfg = cfg_for(model_dir, world, group, strategy="fsdp2", **dict(train))
    trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), model_dir, rank, c.mesh)
    assert trainer.sharded
    # Through the wire as rank 0 sends it: this rank's samples only, and rank 0's plan.
    whole = batch()
    t = cfg.train
    mine = sample_plans(whole, t.mini_batches, world, t.micro_batch_tokens)[rank]
    n_replay = sum(s.replay_count > 0 for s in whole)
    b = Batch(0, 0, whole, len(whole) - n_replay, n_replay)
    msg = p.decode(p.encode(wire.batch_message(b, mine)))
    assert len(msg.samples) == len(mine.batch_positions) < len(whole)
    metrics = trainer.train_part(wire.batch(msg).samples, wire.updates(msg), c.data_parallel, world)
    weights = trainer.gather_weights()
    # the last update's (clipped) gradient, still on the parameters
    grads = {
        n: p.grad.full_tensor() for n, p in trainer.model.named_parameters() if p.grad is not None
    }
    dtypes = {n: p.dtype for n, p in trainer.model.named_parameters()}
    spread = c.data_parallel.replica_spread(trainer.checksum())
    if rank == 0:
        result = {
            "metrics": metrics,
            "weights": weights,
            "grads": grads,
            "spread": spread,
            "dtypes": dtypes,
        }
        torch.save(result, f"{out}/rank0.pt")
    c.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return str(save_pretrained(build_model(seed=5), build_tokenizer(), path))


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-moe")
    return str(save_pretrained(build_moe_model(seed=5), build_tokenizer(), path))


def run(world: int, group: int, model_dir: str, out: Path, train: dict) -> dict:
    mp.start_processes(
        rank_script,
        args=(world, group, model_dir, str(out), train),
        nprocs=world,
        join=True,
        start_method="spawn",
    )
    return torch.load(out / "rank0.pt", weights_only=False)


@pytest.mark.parametrize(
    ("world", "group", "train", "model"),
    [
        (3, 3, {"micro_batch_tokens": 64, "mini_batches": 2}, "model_dir"),
        (4, 2, {"micro_batch_tokens": 64}, "model_dir"),  # HSDP: 2 replica groups of 2
        # LoRA: the frozen base sharded, the adapters and their AdamW state sharded alike
        (2, 2, {"micro_batch_tokens": 64, "lora": {"rank": 4, "alpha": 8.0}}, "model_dir"),
        # a mixture of experts, its fused experts sharded (the router's loss is a
        # product of means over a micro-batch's tokens: it depends on how the batch is
        # cut, so it is checked in one process, tests/unit/test_trainer_features.py)
        (2, 2, {"micro_batch_tokens": 64}, "moe_dir"),
        # its routers frozen: no gradient, no AdamW state, in a block FSDP2 shards whole
        (2, 2, {"micro_batch_tokens": 64, "algorithm": {"freeze_router": True}}, "moe_dir"),
    ],
    # 2 ranks: the shard groups of HSDP, and the handoff's first layout
    ids=[
        "3-ranks-micro-2-updates",
        "hsdp-2x2-micro",
        "lora-2-ranks",
        "moe-2-ranks",
        "moe-frozen-router-2-ranks",
    ],
)
def test_a_sharded_step_equals_one_process_on_the_whole_batch(
    world, group, train, model, tmp_path, request
):
    model_dir = request.getfixturevalue(model)
    got = run(world, group, model_dir, tmp_path, train)
    single = TorchTrainer(
        TorchTrainerConfig.from_config(
            cfg_for(model_dir, world, group, strategy="replicate", **dict(train))
        ),
        model_dir,
    )
    assert not single.sharded
    ref = single.train_step(batch())
    expected = single.export_weights()
    assert got["weights"].keys() == expected.keys()
    # Sums in another order: equal up to float rounding, which Adam's first step
    # (~lr * sign(g)) can magnify for gradients near eps, so the bound is 2% of lr; a
    # second update, from weights that differ by that, gets 10%, and its gradient too.
    one = train.get("mini_batches", 1) == 1
    trained = {n for n, p in single.model.named_parameters() if p.grad is not None}
    assert got["grads"].keys() == trained  # LoRA: the adapters' only
    for name, param in single.model.named_parameters():
        if name not in trained:
            continue
        atol = 1e-8 if one else 1e-6
        torch.testing.assert_close(got["grads"][name], param.grad, rtol=1e-4, atol=atol)
    for k, v in expected.items():
        torch.testing.assert_close(got["weights"][k], v, rtol=0, atol=2e-5 if one else 1e-4)
    for key in ("loss", "clip_fraction", "mean_ratio", "grad_norm"):
        assert got["metrics"][key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key
    assert got["spread"] == pytest.approx(0.0, abs=1e-6)  # HSDP replicas agree


def handoff_script(rank: int, world: int, model_dir: str, out: str) -> None:
    """Epoch 0: ranks 0 and 1 train sharded (rank 2 is rollout); epoch 1: all three are
    trainers. Rank 2 receives its shards from one of the two (replica groups of one rank),
    then all three train a step."""
    from runtime.config.layout import LayoutChange
    from runtime.engines.torch.trainer_side import TorchTrainerSide
    from runtime.store.run_dir import RunPaths

    c = join(rank, world, out, 1)
    before, after = ("trainer", "trainer", "rollout"), ("trainer",) * 3
    c.regroup(0, before)
    cfg = cfg_for(model_dir, world, 1, strategy="fsdp2")
    side = TorchTrainerSide(cfg, rank, RunPaths(Path(out)), c)
    result: dict = {"built_at_start": side.trainer.model is not None}
    if rank < 2:
        side.trainer.train_step(batch(), c.data_parallel, rank, 2)
    result["weights_before"] = side.trainer.gather_weights() if rank < 2 else {}
    change = LayoutChange(1, before, after)
    c.regroup(1, after)
    side.on_layout(change)
    result["step"], result["version"] = side.trainer.step, side.trainer.version
    result["weights_after"] = side.trainer.gather_weights()
    result["opt_steps"] = sorted(
        float(s["step"]) for s in side.trainer.opt.state.values() if "step" in s
    )
    side.trainer.train_step(batch(), c.data_parallel, rank, 3)
    result["spread"] = c.data_parallel.replica_spread(side.trainer.checksum())
    result["handoff_left"] = (Path(out) / "handoff").exists()  # nothing through the disk
    result["switch"] = side.last_switch
    torch.save(result, f"{out}/rank{rank}.pt")
    c.close()


def test_a_joining_replica_receives_the_sharded_state_rank_to_rank(model_dir, tmp_path):
    mp.start_processes(
        handoff_script,
        args=(3, model_dir, str(tmp_path)),
        nprocs=3,
        join=True,
        start_method="spawn",
    )
    r = [torch.load(tmp_path / f"rank{i}.pt", weights_only=False) for i in range(3)]
    assert [x["built_at_start"] for x in r] == [True, True, False]  # no model off the trainer
    before, after = r[0]["weights_before"], r[0]["weights_after"]
    assert before.keys() == after.keys()
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert all(x["step"] == 1 for x in r)  # the joining rank got step and version too
    assert r[2]["opt_steps"] and set(r[2]["opt_steps"]) == {1.0}  # AdamW state arrived
    assert r[0]["spread"] == 0.0  # three replicas in agreement after a step
    assert not r[0]["handoff_left"]
    # rank 2 received from one of the two (the joiner's only source), which sent it all
    received = r[2]["switch"]["received_bytes"]
    assert received > 0 and r[2]["switch"]["sent_bytes"] == 0
    assert sorted(x["switch"]["sent_bytes"] for x in r[:2]) == [0, received]


def small_model_script(rank: int, world: int, out: str) -> None:
    """The 25M-parameter embedded model, sharded over 2 ranks in micro-batches, through a
    sharded checkpoint and back into a fresh trainer."""
    from runtime.embedded.warm_start import small_model_path

    c = join(rank, world, out, world, timeout_s=300)
    c.regroup(0, ("trainer",) * world)
    model = str(small_model_path())
    cfg = cfg_for(model, world, world, strategy="fsdp2", micro_batch_tokens=64)
    trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), model, rank, c.mesh)
    local = sum(p.to_local().numel() for p in trainer.model.parameters())
    metrics = trainer.train_step(batch(), c.data_parallel, rank, world)
    trained = trainer.gather_weights()
    trainer.save_state(Path(out) / "ckpt", c.mesh.group)
    fresh = TorchTrainer(TorchTrainerConfig.from_config(cfg), model, rank, c.mesh)
    fresh.load_state(Path(out) / "ckpt", c.mesh.group)
    loaded = fresh.gather_weights()
    if rank == 0:
        result = {"metrics": metrics, "local": local, "trained": trained, "loaded": loaded}
        torch.save(result, f"{out}/rank0.pt")
    c.close()


@pytest.mark.slow  # a minute or more of 25M-parameter steps: `make test-slow`
def test_the_mid_size_model_shards_micro_batches_and_checkpoints(tmp_path):
    from runtime.embedded.tiny_qwen3 import SMALL

    mp.start_processes(
        small_model_script, args=(2, str(tmp_path)), nprocs=2, join=True, start_method="spawn"
    )
    r = torch.load(tmp_path / "rank0.pt", weights_only=False)
    total = sum(v.numel() for v in r["trained"].values())
    assert total > 20e6 and SMALL["layers"] == 8
    assert r["local"] <= total / 2 + 1  # each rank holds half the parameters
    assert r["metrics"]["micro_steps"] > 1 and torch.isfinite(torch.tensor(r["metrics"]["loss"]))
    for k, v in r["trained"].items():
        assert torch.equal(v, r["loaded"][k]), k


def test_a_sharded_lora_step_keeps_a_bf16_base_and_float32_adapters(model_dir, tmp_path):
    """bfloat16 compute: the frozen base is stored in bfloat16 and the adapters in float32,
    in FSDP2 groups of their own (one group cannot hold two dtypes); the step runs and
    moves the adapters only."""
    train = {"param_dtype": "bfloat16", "lora": {"rank": 4, "alpha": 8.0}}
    got = run(2, 2, model_dir, tmp_path, train)
    adapters = {n for n in got["dtypes"] if ".lora_" in n}
    assert adapters and all(got["dtypes"][n] == torch.float32 for n in adapters)
    assert all(d == torch.bfloat16 for n, d in got["dtypes"].items() if n not in adapters)
    assert got["grads"].keys() == adapters
    assert all(torch.isfinite(g).all() for g in got["grads"].values())
    assert any(g.abs().sum() > 0 for g in got["grads"].values())
