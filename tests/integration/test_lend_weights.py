"""What a lent trainer rank's engine loads (runtime/engines/torch/published.py): the
published version, also between sync points, where the trainer's weights run ahead of it.

Two ranks shard the real trainer's model (FSDP2 over gloo on loopback), ``sync_every`` 2:
after step 1 the version is still 0 and a lend must give the weights of step 0, after
step 2 those of step 2 (version 1), after step 3 those of step 2 again. One process
without a process group (the replicated trainer) checks the same.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from runtime.data.micro_batches import sample_plans
from runtime.data.sample import Batch
from runtime.engines.torch.trainer_side import TorchTrainerSide
from runtime.store.run_dir import RunPaths
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.integration.test_fsdp_trainer import batch, cfg_for, join
from tests.integration.test_fsdp_trainer import model_dir as model_dir  # the fixture

pytestmark = pytest.mark.integration


def lend_script(rank: int, world: int, model_dir: str, out: str) -> None:
    c = join(rank, world, out, world) if world > 1 else None
    if c is not None:
        c.regroup(0, ("trainer",) * world)
    strategy = "fsdp2" if world > 1 else "replicate"
    cfg = cfg_for(model_dir, max(world, 1), max(world, 1), strategy=strategy, sync_every=2)
    cfg.scheduler.lend_trainer = True
    side = TorchTrainerSide(cfg, rank, RunPaths(Path(out)), c)
    sent: list[p.Message] = []
    side.attach(sent.append, rank)
    whole = batch()
    t = cfg.train
    plans = sample_plans(whole, t.mini_batches, world, t.micro_batch_tokens)
    result: dict = {"lent": [], "current": []}
    result["lent"].append(side.lend_weights())
    for step in range(3):
        b = Batch(step, 0, whole, len(whole), 0)
        side.train_batch(p.decode(p.encode(wire.batch_message(b, plans[rank]))))
        result["current"].append(side.engine_weights())
        result["lent"].append(side.lend_weights())
    result["steps"] = [m.step for m in sent if isinstance(m, p.StepDone)]
    if rank == 0:
        torch.save(result, f"{out}/rank0.pt")
    if c is not None:
        c.close()


@pytest.mark.parametrize("world", [1, 2], ids=["one-process", "fsdp2-2-ranks"])
def test_a_lend_loads_the_published_version_between_sync_points(model_dir, tmp_path, world):
    if world == 1:
        lend_script(0, 1, model_dir, str(tmp_path))
    else:
        mp.start_processes(
            lend_script,
            args=(world, model_dir, str(tmp_path)),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
    r = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert r["steps"] == [1, 2, 3]
    lent, current = r["lent"], r["current"]
    start = lent[0]
    assert [v for v, _ in lent] == [0, 0, 1, 1] and [v for v, _ in current] == [0, 1, 1]

    def same(a: dict, b: dict) -> bool:
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # step 1 trained, the version not published: a lend loads step 0's weights
    assert not same(current[0][1], start[1]) and same(lent[1][1], start[1])
    # step 2 published version 1: the trainer's own weights
    assert same(lent[2][1], current[1][1])
    # step 3 ran ahead again: the copy kept at step 2's publish
    assert not same(current[2][1], current[1][1]) and same(lent[3][1], current[1][1])
