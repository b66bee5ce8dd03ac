"""A rank started again joins the run's process groups, over three gloo processes.

Epoch 0: ranks 0 (leader), 1 and 2 (rollout drivers). Rank 2 dies (``os._exit``). Epoch 1:
ranks 0 and 1 regroup without it (``"gone"``). A new process then joins as rank 2, from
``dist.json`` as ``reflow rejoin`` starts it, makes no group of epoch 1 (it is ``"gone"``
there, as rank 0 welcomes it), and at epoch 2 all three regroup and the new rank 2 gets
the leader's weights with rank 1. Without gloo's lazy pair set-up
(``TORCH_GLOO_LAZY_INIT``) the new process's world-group init waits forever for ranks
that made theirs long ago (measured).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from runtime.weights import p2p
from tests.integration.test_fsdp_trainer import join

pytestmark = pytest.mark.integration

E0 = ("trainer", "rollout", "rollout")
E1 = ("trainer", "rollout", "gone")


def rank_script(rank: int, again: bool, out: str) -> None:
    c = join(rank, 3, out, 1, timeout_s=60)
    if not again:
        c.regroup(0, E0)
        if rank == 2:
            os._exit(9)
        c.regroup(1, E1)
        while not (Path(out) / "rank2.again").exists():  # the new rank 2 has joined
            time.sleep(0.05)
    else:
        c.regroup(1, E1)  # the epoch it is welcomed at: it is in none of its groups
        (Path(out) / "rank2.again").touch()
    c.regroup(2, E0)
    result: dict = {"receivers": c.sync.receivers() if rank == 0 else None}
    if rank == 0:
        p2p.send_whole(c.sync, 5, {"w": torch.arange(6.0)}, c.bucket_bytes)
    else:
        result["weights"] = p2p.receive_whole(c.sync)
    torch.save(result, f"{out}/rank{rank}{'.again' if again else ''}.pt")
    c.close()


def test_a_rank_started_again_joins_the_next_epoch_and_gets_the_weights(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    first = [spawn.Process(target=rank_script, args=(r, False, str(tmp_path))) for r in range(3)]
    for proc in first:
        proc.start()
    first[2].join(120)
    assert first[2].exitcode == 9
    again = spawn.Process(target=rank_script, args=(2, True, str(tmp_path)))
    again.start()
    for proc in (*first[:2], again):
        proc.join(120)
    codes = [first[0].exitcode, first[1].exitcode, again.exitcode]
    for proc in (*first, again):
        if proc.is_alive():
            proc.kill()
    assert codes == [0, 0, 0], codes
    leader = torch.load(tmp_path / "rank0.pt", weights_only=False)
    assert leader["receivers"] == [1, 2]
    for name in ("rank1.pt", "rank2.again.pt"):
        version, weights = torch.load(tmp_path / name, weights_only=False)["weights"]
        assert version == 5 and torch.equal(weights["w"], torch.arange(6.0))
