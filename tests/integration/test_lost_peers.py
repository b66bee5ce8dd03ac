"""Process groups per layout epoch from the live ranks only, and a weight sync that survives
a receiver that dies or hangs, over a real gloo group of 4 processes on loopback.

Epoch 1: rank 0 leads, ranks 1-3 receive. Rank 3 dies (``kill``) or stops (``hang``,
SIGSTOP) before the sync: the leader drops it (at once, or after ``peer_timeout_s``), and
ranks 1 and 2 still get every bucket. Epoch 2 lists rank 3 as ``gone``: the three live
ranks regroup without it (no collective waits for it) and sync again; epoch 3 regroups the
same three ranks once more (a group of the same ranks under a new epoch's name) and syncs.
"""

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from runtime.rank.collective import Collective
from runtime.weights import p2p

pytestmark = pytest.mark.integration

EPOCHS = {
    1: ("trainer", "rollout", "rollout", "rollout"),
    2: ("trainer", "rollout", "rollout", "gone"),
    3: ("trainer", "rollout", "rollout", "gone"),
}
SHAPES = [(1024, 1024), (512, 1024), (1024,)]  # 6 MB of float32: several 1 MB buckets


def weights(version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(version)
    return {f"w{i}": torch.randn(*s, generator=g) for i, s in enumerate(SHAPES)}


def rank_script(rank: int, out: str, fault: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    c = Collective.join(
        rank=rank,
        world_size=4,
        rendezvous=Path(out) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="gloo",
        bucket_bytes=1 << 20,
        timeout_s=60,
        peer_timeout_s=3,
    )
    result: dict = {"received": {}, "lost": {}, "took": {}}
    for epoch, roles in EPOCHS.items():
        if roles[rank] == "gone":
            break
        c.regroup(epoch, roles)
        if rank == 3:  # the faulty receiver, after its groups are made
            if fault == "kill":
                os._exit(0)
            os.kill(os.getpid(), signal.SIGSTOP)  # hung: the test kills it at the end
        start = time.monotonic()
        if rank == 0:
            p2p.send_whole(c.sync, epoch, weights(epoch), c.bucket_bytes)
            result["lost"][epoch] = c.sync.take_lost_peers()
        else:
            version, got = p2p.receive_whole(c.sync)
            result["received"][epoch] = version == epoch and all(
                torch.equal(got[k], v) for k, v in weights(epoch).items()
            )
        result["took"][epoch] = time.monotonic() - start
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(result))
    c.close()


@pytest.mark.parametrize("fault", ["kill", "hang"])
def test_a_weight_sync_completes_for_the_others_and_the_live_ranks_regroup(tmp_path, fault):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_script, args=(r, str(tmp_path), fault)) for r in range(4)]
    for proc in procs:
        proc.start()
    try:
        for proc in procs[:3]:
            proc.join(180)
            assert proc.exitcode == 0, f"a live rank did not finish: {proc.exitcode}"
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(3)]
    for r in (1, 2):  # every sync reached both live receivers, whole
        assert results[r]["received"] == {"1": True, "2": True, "3": True}
    lost = results[0]["lost"]
    assert list(lost["1"]) == ["3"] and lost["2"] == {} and lost["3"] == {}
    if fault == "hang":  # dropped after the per-receiver timeout, not the group's 60 s
        assert "3" in lost["1"] and 2.5 < results[0]["took"]["1"] < 30
