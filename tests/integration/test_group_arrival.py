"""A layout epoch's group waits for a member that comes late, over two gloo processes.

Rank 1 comes to the group twice torch's own wait after rank 0 (as a survivor of a lost
rank, still held by the aborted step's collective, can): with ``arrival`` the two make the
group and reduce over it. A member that never comes is named, after ``arrival``.
"""

from __future__ import annotations

import multiprocessing
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from runtime.rank.groups import CollectiveError, epoch_group
from tests.helpers import join_all
from tests.integration.test_fsdp_trainer import join

pytestmark = pytest.mark.integration

TORCH_WAIT = timedelta(seconds=3)  # the group's own timeout (rendezvous and collectives)


def rank_script(rank: int, out: str) -> None:
    join(rank, 2, out, 1, timeout_s=60)
    if rank == 1:
        time.sleep(2 * TORCH_WAIT.total_seconds())
    group = epoch_group([0, 1], "late", TORCH_WAIT, arrival=timedelta(seconds=60))
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x, group=group)
    result: dict = {"sum": x.tolist()}
    if rank == 0:  # rank 1 never makes this one
        start = time.monotonic()
        try:
            epoch_group([0, 1], "missing", TORCH_WAIT, arrival=timedelta(seconds=1))
        except CollectiveError as exc:
            result["refused"] = (str(exc), time.monotonic() - start)
    torch.save(result, f"{out}/rank{rank}.pt")


def test_a_late_member_is_waited_for_and_a_missing_one_named(tmp_path):
    spawn = multiprocessing.get_context("spawn")
    procs = [spawn.Process(target=rank_script, args=(r, str(tmp_path))) for r in range(2)]
    for proc in procs:
        proc.start()
    assert join_all(procs, 180) == [0, 0]
    leader, other = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert leader["sum"] == other["sum"] == [3.0] * 4
    why, waited = leader["refused"]
    assert why == (
        "group missing: rank(s) [1] did not come within 1 s (lost, or still in a collective)"
    )
    assert waited < 30  # refused after its arrival wait, not torch's or the store's
    assert "refused" not in other
