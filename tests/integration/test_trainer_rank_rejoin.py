"""A lost trainer rank started again takes its trainer state back, over three gloo processes
(FSDP2, replica groups of one rank).

Epoch 0: ranks 0 and 1 train, rank 2 is a rollout rank (no model). Epoch 1: rank 2 joins
the trainer (a rebalance) and receives its shards from rank 0; step 1 trains over three.
Rank 2 then dies (``os._exit``, as kill -9 leaves it); ranks 0 and 1 regroup without it
(epoch 2) and train step 2 over two. A new process joins as rank 2 from ``dist.json``, as
``reflow rejoin`` starts it: it makes no group of epoch 2 (``"gone"`` there, as rank 0
welcomes it) and holds no model. At epoch 3 the three regroup: the two that stayed keep
their shards, the new rank 2 receives its shards and AdamW state from rank 0 again, with
the step and version, and step 3 trains over three in agreement (replica spread 0).

Rank 0's world-group pair with rank 2 was connected to the dead process at epoch 1, so the
state must move over the epoch's own trainer group: over the world group the second
transfer goes to a peer that is no more.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from runtime.config.layout import LayoutChange
from tests.helpers import join_all, save_tiny_model
from tests.integration.test_fsdp_trainer import cfg_for, join
from tests.integration.test_lost_trainer_replica import message

pytestmark = pytest.mark.integration

WORLD = 3
TWO = ("trainer", "trainer", "rollout")
ALL = ("trainer",) * WORLD
WITHOUT_2 = ("trainer", "trainer", "gone")


def trainer_side(rank: int, model_dir: str, out: str, c):
    from runtime.engines.torch.trainer_side import TorchTrainerSide
    from runtime.store.run_dir import RunPaths

    cfg = cfg_for(model_dir, WORLD, 1, strategy="fsdp2")
    side = TorchTrainerSide(cfg, rank, RunPaths(Path(out)), c)
    sent: list = []
    side.attach(lambda m: sent.append(m) or True, rank)
    side.activate()
    return cfg, side, sent


def rank_script(rank: int, again: bool, model_dir: str, out: str) -> None:
    c = join(rank, WORLD, out, 1, timeout_s=60)
    r: dict = {}
    if not again:
        c.regroup(0, TWO)
        cfg, side, sent = trainer_side(rank, model_dir, out, c)
        c.regroup(1, ALL)
        side.on_layout(LayoutChange(1, TWO, ALL))  # rank 2 joins: from rank 0
        r["joined"] = dict(side.last_switch)
        side.on_message(message(cfg, 0, rank, WORLD))
        torch.distributed.barrier(group=c.mesh.group)  # all three are past step 1
        if rank == 2:
            os._exit(9)
        c.regroup(2, WITHOUT_2)
        side.on_layout(LayoutChange(2, ALL, WITHOUT_2))
        side.on_message(message(cfg, 1, rank, 2))
        r["step2"] = side.trainer.step
        while not (Path(out) / "rank2.again").exists():  # the new rank 2 is up
            time.sleep(0.05)
    else:
        c.regroup(2, WITHOUT_2)  # the epoch it is welcomed at: it is in none of its groups
        cfg, side, sent = trainer_side(rank, model_dir, out, c)
        r["before"] = (side.offload_state, side.trainer.step, side.trainer.version)
        (Path(out) / "rank2.again").touch()
    c.regroup(3, ALL)
    side.on_layout(LayoutChange(3, WITHOUT_2, ALL))
    r["switch"] = dict(side.last_switch)
    r["taken"] = (side.trainer.step, side.trainer.version)
    side.on_message(message(cfg, 2, rank, WORLD))
    r["step3"] = (side.trainer.step, side.last_batch_id)
    r["reports"] = [(m.step, m.batch_id, m.metrics) for m in sent if type(m).__name__ == "StepDone"]
    torch.save(r, f"{out}/rank{rank}{'.again' if again else ''}.pt")
    c.close()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    model_dir = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    out = tmp_path_factory.mktemp("ranks")
    spawn = multiprocessing.get_context("spawn")
    first = [
        spawn.Process(target=rank_script, args=(r, False, model_dir, str(out))) for r in range(3)
    ]
    for proc in first:
        proc.start()
    first[2].join(300)
    again = spawn.Process(target=rank_script, args=(2, True, model_dir, str(out)))
    again.start()
    codes = join_all([*first, again], 300)
    assert codes == [0, 0, 9, 0], codes
    names = ("rank0.pt", "rank1.pt", "rank2.again.pt")
    return [torch.load(out / name, weights_only=True) for name in names]  # plain values


def test_the_new_rank_receives_its_shards_step_and_version_from_a_rank_that_stayed(ranks):
    leader, other, new = ranks
    assert leader["joined"]["sent_bytes"] > 0  # the first rank 2 got its state from rank 0
    assert new["before"] == ("none", 0, 0)  # no model, no step: it holds nothing yet
    assert new["switch"]["received_bytes"] > 0 and new["switch"]["peers"] == 1.0
    sent = leader["switch"]["sent_bytes"] + other["switch"]["sent_bytes"]
    assert sent == new["switch"]["received_bytes"]
    assert leader["switch"]["sent_bytes"] > 0  # again from rank 0: the same pair of ranks
    for r in (leader, other):
        assert r["switch"]["received_bytes"] == 0 and r["switch"]["kept_bytes"] > 0
    assert leader["step2"] == other["step2"] == 2
    assert new["taken"] == leader["taken"] == other["taken"]
    assert new["taken"][0] == 2


def test_the_three_train_the_next_step_in_agreement(ranks):
    leader, other, new = ranks
    for r in ranks:
        assert r["step3"] == (3, 2)
    assert [(s, b) for s, b, _ in leader["reports"]] == [(1, 0), (2, 1), (3, 2)]
    assert other["reports"] == new["reports"] == []
    last = leader["reports"][-1][2]
    assert last["trainer_replicas"] == 3 and last["replica_spread"] == 0.0
