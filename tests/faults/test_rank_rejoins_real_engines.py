"""A killed rollout rank started again rejoins, with real engines (vLLM CPU build + the torch
trainer, process groups over gloo), the demo on 2:2: kill -9 of rank 3, declared lost, the
run goes on on rank 2; ``reflow rejoin --rank 3`` starts it again; it registers "gone" in
the current epoch, starts its engine, joins the torch.distributed world again, takes its
role back at the next epoch with the current weights, and generates again (its samples
pass rank 0's version checks). Before this, a lost rank that registered again was refused
("it cannot rejoin this run")."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, descendants, reflow
from tests.helpers import wait_for_status as wait_for
from tests.integration.test_spine import pid_alive


def lower_priority(pid: int) -> None:
    """Nice 10 for every thread of ``pid`` and of its child processes (nice is per thread)."""
    for p in (pid, *descendants(pid)):
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):  # the thread ended meanwhile
                os.setpriority(os.PRIO_PROCESS, int(task.name), 10)


# ~10 minutes: a rank started again on 2 busy cores takes minutes to import torch and vLLM
# and start its engine; make test-slow. The process-group part is in make test
# (tests/integration/test_rank_rejoin_collective.py), rank 0's in tests/unit.
@pytest.mark.slow
def test_a_killed_rollout_rank_started_again_rejoins_and_generates(runs_dir):
    args = ["launch", str(REPO / "recipes" / "demo.yaml"), "--local", "--name", "rejoin"]
    for s in (
        "train.steps=4000",  # ended by a stop once the rejoined rank has delivered
        "control.heartbeat_timeout_s=20",
        "control.peer_timeout_s=5",
        "control.collective_timeout_s=60",
    ):
        args += ["--set", s]
    reflow(*args, check=True, timeout=900)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name
    pids: dict[int, int] = {}
    try:
        s = wait_for(run, lambda s: s["step"] >= 2 or s["state"] != "RUNNING", 600)
        assert s["state"] == "RUNNING", s.get("reason")
        pids = {w["rank"]: w["pid"] for w in s["workers"]}
        refused = reflow("rejoin", run, "--rank", "3", timeout=60)
        assert refused.returncode != 0 and "not a lost rank" in refused.stderr + refused.stdout
        os.kill(pids[3], signal.SIGKILL)
        s = wait_for(run, lambda s: len(s["lost_ranks"]) == 1 or s["state"] != "RUNNING", 300)
        assert s["state"] == "RUNNING", s.get("reason")
        # on 2 cores the others' engine threads starve a new process (about 2% CPU for
        # minutes, seen): they step aside while it imports and starts its engine
        for pid in (x for r, x in pids.items() if r != 3):
            lower_priority(pid)
        started = reflow("rejoin", run, "--rank", "3", check=True, timeout=60)
        assert "rank 3 started again" in started.stdout
        s = wait_for(run, lambda s: s["rejoined_ranks"] or s["state"] != "RUNNING", 600)
        assert s["state"] == "RUNNING", s.get("reason")
        before = s["buffer"]["delivered_by_rank"].get("3", 0)
        s = wait_for(
            run,
            lambda s: (
                s["buffer"]["delivered_by_rank"].get("3", 0) >= before + 8
                or s["state"] != "RUNNING"
            ),
            600,
        )
        assert s["state"] == "RUNNING", s.get("reason")
        pids[3] = next(w["pid"] for w in s["workers"] if w["rank"] == 3)
        reflow("stop", run, check=True, timeout=300)
        final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 300)
    finally:
        for pid in pids.values():
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert final["state"] == "STOPPED", final.get("reason")
    (back,) = final["rejoined_ranks"]
    assert back["rank"] == 3 and back["pid"] == pids[3]
    assert [x["rank"] for x in final["lost_ranks"]] == [3]
    workers = {w["rank"]: w for w in final["workers"]}
    assert workers[3]["role"] == "rollout"
    assert workers[3]["layout_epoch"] == final["layout"]["epoch"]
    regroups = [x["source"] for x in final["switches"]]
    assert regroups.count("lost_rank") == 1 and regroups.count("rank_rejoined") == 1
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    # the rejoined engine generates with the current policy, as the others do
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    after = [x for x in lines if x["step"] > back["at_step"] + 1]
    assert after and all(0.8 < x["mean_ratio"] < 1.25 for x in after)
    assert "rank 3 registered as rollout" in (run_dir / "logs" / "rank3.log").read_text()
    deadline = time.monotonic() + 60  # and no rank is left behind, the new one included
    while any(pid_alive(x) for x in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(pid_alive(x) for x in pids.values())
