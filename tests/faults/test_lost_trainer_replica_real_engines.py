"""kill -9 of one of two trainer replicas with real engines (vLLM CPU build + the torch
trainer, process groups over gloo), the demo on 2:2: the leader's next step meets the dead
rank in its gradient all-reduce and is aborted, rank 0 declares the rank lost by its
silence, the live ranks regroup without it, and the batch, split over the leader alone,
is trained again. The run reaches its last step with one trainer replica, nothing lost or
duplicated, the lost rank in status. Before this, the run failed (rank 0 did not absorb a
lost trainer rank) and, with ``control.max_restarts``, restarted every engine from its
checkpoint."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.helpers import REPO, reflow
from tests.helpers import wait_for_status as wait_for
from tests.integration.test_spine import pid_alive


def test_a_killed_trainer_replica_is_absorbed_and_the_run_goes_on_with_one(runs_dir):
    steps = 16
    args = ["launch", str(REPO / "recipes" / "demo.yaml"), "--local", "--name", "losttrainer"]
    for s in (f"train.steps={steps}", "control.heartbeat_timeout_s=20"):
        args += ["--set", s]
    reflow(*args, check=True, timeout=900)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name
    s = wait_for(run, lambda s: s["step"] >= 3 or s["state"] != "RUNNING", 600)
    assert s["state"] == "RUNNING", s.get("reason")
    pids = {w["rank"]: w["pid"] for w in s["workers"]}
    os.kill(pids[1], signal.SIGKILL)
    s = wait_for(run, lambda s: len(s["lost_ranks"]) == 1 or s["state"] != "RUNNING", 300)
    assert s["state"] == "RUNNING", s.get("reason")
    final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 900)
    assert final["state"] == "COMPLETED", final.get("reason")

    (lost,) = final["lost_ranks"]
    assert lost["rank"] == 1 and lost["role"] == "trainer", lost
    assert "sent no heartbeat" in lost["reason"], lost
    assert {w["rank"]: w["state"] for w in final["workers"]}[1] == "dead"
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, steps + 1))  # no step lost or doubled
    after = [x for x in lines if x["step"] > lost["at_step"] + 1]
    assert after and all(x["trainer_replicas"] == 1 for x in after)
    assert lines[0]["trainer_replicas"] == 2
    # the engines and the trainer hold one policy after the loss as before
    assert all(0.8 < x["mean_ratio"] < 1.25 for x in after)
    (regroup,) = [x for x in final["switches"] if x["source"] == "lost_rank"]
    assert regroup["duration_s"] is not None
    log0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "aborted" in log0  # the leader's step met the dead rank (not a clean gap)
    deadline = time.monotonic() + 60  # and no rank is left behind
    while any(pid_alive(x) for x in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(pid_alive(x) for x in pids.values())
