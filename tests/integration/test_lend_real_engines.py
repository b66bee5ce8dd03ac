"""Lends on real engines: vLLM (CPU build) rollout + the torch trainer, 4 local ranks, 1
rollout and 3 trainer ranks (three data-parallel replicas of one rank), process groups
over gloo (runtime/control/lends.py, runtime/rank/worker.py ``lend_switch``).

The recipe is the demo's, set so that the trainer waits for fresh samples (the idle cause
a lend answers): one rollout rank for three trainer ranks, capped at 12 requests at once,
no replay, a batch of 96, and responses sampled hotter. The gate's first cost estimate is
small (0.02 s) so that it lends at the waits a CPU run has (a second). Without the cap the
rollout rank kept pace with the trainer: the first wait was predicted at 0.3 s against a
threshold of 0.2 s, and one CI run (2026-12-07) completed without a lend.
``sync_every`` 2: every other lend falls between sync points, where the trainer's weights
run ahead of the published version and the lent engines load the copy kept at the
publish (runtime/engines/torch/published.py).

1. The trainer lends its three ranks: each lent rank's engine loads the policy in place
   and generates (samples rank 0 takes, or what it hands over at the reclaim, which
   another rank continues).
2. Rank 2 is killed (-9) in its first lend: rank 0 declares it lost by its silence, the
   reclaim leaves it out (the other lent ranks hand over what they were generating), the
   live ranks regroup without it once the groups are back, and the run completes its
   steps with two trainer replicas, nothing lost or doubled.

The kill comes at the first lend, not after a few: the gate learns each lend's cost from
the run, and one slow lend on a loaded machine (7.5 s once, against 0.1-0.3 s) ends the
lending of a run whose waits last about a second.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from pathlib import Path

from tests.helpers import launch_demo, running, status_json
from tests.helpers import wait_for_status as wait_for

STEPS = 40
SETTINGS = (
    f"train.steps={STEPS}",
    "train.batch_size=96",
    "train.sync_every=2",
    "resources.initial_ratio=1:3",
    "reflow.sigma=0",
    "reflow.delta=4",
    "reflow.sampler=random",
    "algorithm.temperature=1.2",
    "scheduler.auto_rebalance=false",
    "scheduler.lend_trainer=true",
    "scheduler.lend_estimate_s=0.02",
    "scheduler.max_concurrency=12",
    "scheduler.lend_margin=1",
    "control.heartbeat_timeout_s=20",  # how long the killed rank goes unnoticed
)
LENT = re.compile(r"epoch (\d+): trainer -> rollout")
BACK = re.compile(r"epoch (\d+): rollout -> trainer")


def lent_epoch(log: Path) -> int | None:
    """The epoch of the lend rank ``log``'s rank is in now, if it is lent."""
    text = log.read_text() if log.exists() else ""
    out = [int(m.group(1)) for m in LENT.finditer(text)]
    back = [int(m.group(1)) for m in BACK.finditer(text)]
    if out and (not back or out[-1] > back[-1]):
        return out[-1]
    return None


def test_a_waiting_trainer_lends_its_ranks_and_survives_losing_one_while_lent(runs_dir):
    run_dir, run = launch_demo("lend", SETTINGS, runs_dir)

    s = running(wait_for(run, lambda s: s["state"] != "RUNNING" or len(s["workers"]) == 4, 600))
    pid = {w["rank"]: w["pid"] for w in s["workers"]}[2]
    # rank 2's first lend: killed once its engine generates (read off its log; a lend
    # lasts a second or more, the log is polled every 20 ms)
    log = run_dir / "logs" / "rank2.log"
    deadline = time.monotonic() + 600
    while lent_epoch(log) is None:
        assert time.monotonic() < deadline, "no lend of rank 2 within 600 s"
        # (the status rank 0 writes, read directly: `reflow status` costs a CLI start,
        # seconds on a loaded machine, in which a lend comes and goes)
        with contextlib.suppress(OSError, ValueError):
            status = json.loads((run_dir / "status.json").read_text())
            # (what the gate saw, for a run that never lent: its lends and the trainer's
            # idle causes)
            seen = (status.get("lends"), status.get("idle", {}).get("trainer_idle_by_cause"))
            assert status["state"] == "RUNNING", f"{status['state']} before a lend: {seen}"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    final = wait_for(run, lambda s: s["state"] != "RUNNING", 600)
    assert final["state"] == "COMPLETED", final.get("reason")

    assert lent_epoch(log) is not None  # its log ends inside a lend: it died lent
    (lost,) = final["lost_ranks"]
    assert lost["rank"] == 2 and "sent no heartbeat" in lost["reason"], lost
    lends = final["lends"]
    assert lends["lends"] >= 1 and lends["lent_now"] == 0
    # (status keeps the last switches) each lend reclaimed; the reclaim after the loss,
    # then the regroup without rank 2 (no lend after a loss)
    sources = [x["source"] for x in final["switches"]]
    assert sources[-2:] == ["reclaim", "lost_rank"], sources
    lent = sources[sources.index("lend") : -1]
    assert lent == ["lend", "reclaim"] * (len(lent) // 2), sources
    # the reclaim that waited for the loss taught the gate nothing
    assert lends["reclaim_s"] < 5, lends
    assert all(x["duration_s"] is not None for x in final["switches"])

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, STEPS + 1))  # none lost or doubled
    assert lines[-1]["trainer_replicas"] == 2
    # the importance ratio stays near 1: the lent engines generated with the policy
    # whose version their samples carry, also between sync points
    assert all(0.8 < x["mean_ratio"] < 1.25 for x in lines)
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0, ledger
    # the lent ranks generated: samples rank 0 took, or tokens they handed over at the
    # reclaim that another rank continued (a lend may last a fraction of a second)
    by_rank, parked = final["buffer"]["delivered_by_rank"], final["buffer"]["parked_rollouts"]
    delivered = sum(by_rank.get(str(r), 0) for r in (0, 1, 2))
    assert delivered > 0 or parked["continued_tokens"] > 0, (by_rank, parked)
    # a lent rank loaded the policy in place, and handed its work over at the reclaim
    rank1 = (run_dir / "logs" / "rank1.log").read_text()
    assert re.search(r"trainer -> rollout .*weight_load", rank1)
    assert "leaving the rollout pool: handed over" in rank1
    assert status_json(run)["state"] == "COMPLETED"
