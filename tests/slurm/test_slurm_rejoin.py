"""A lost rank of a Slurm run started again as a step on the run's own allocation.

2 nodes x 2 tasks, 2:2: trainer ranks 0, 1 on n1, rollout ranks 2, 3 on n2. Rollout rank 3
is killed (-9) and declared lost, the run goes on; ``reflow rejoin --rank 3`` starts it
again with ``srun --jobid J --overlap`` on n2, where it ran: a new step of the job, not a
new job, nor a process on the machine the command was typed on (what it did before this).
The new rank 3 registers and generates again; stopping the run ends its step too, and the
step's ``srun`` client.

- synthetic engines (make test): the step, its node, its rank's environment;
- the demo's real engines (make test-slow, 6 to 10 min here): the rank also joins the
  torch.distributed world from ``dist.json`` (the store rank 0 opened at the address
  submitit gave the job), takes its role back at the next epoch with the current weights
  (process groups over gloo) and generates with them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import REPO, lower_priority, reflow
from tests.helpers import wait_for_status as wait_for
from tests.slurm.cluster import RECIPE, require_cluster, wait_job_ended

require_cluster()


def steps(job_id: str) -> list[list[str]]:
    """The job's steps now: id, name, nodes."""
    out = subprocess.run(
        ["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j|%N"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def kill_and_start_again(
    run_dir: Path, taken_back: Callable[[dict], bool], starved: bool
) -> tuple[dict, dict[int, int]]:
    """Kill rollout rank 3 on n2, start it again with ``reflow rejoin``, wait until it is
    back (``taken_back``) and has delivered 8 more samples; the status then, and the first
    pids. ``starved``: the others step aside while the new rank starts its engines."""
    run = run_dir.name
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    s = wait_for(
        run, lambda s: s.get("step", 0) >= 2 or s["state"] not in ("STARTING", "RUNNING"), 600
    )
    assert s["state"] == "RUNNING", s.get("reason")
    assert {w["rank"]: w["node"] for w in s["workers"]} == {0: "n1", 1: "n1", 2: "n2", 3: "n2"}
    pids = {w["rank"]: w["pid"] for w in s["workers"]}
    os.kill(pids[3], signal.SIGKILL)
    s = wait_for(run, lambda s: len(s["lost_ranks"]) == 1 or s["state"] != "RUNNING", 300)
    assert s["state"] == "RUNNING", s.get("reason")
    if starved:  # see tests/faults/test_rank_rejoins_real_engines.py
        for pid in (x for r, x in pids.items() if r != 3):
            lower_priority(pid)

    started = reflow("rejoin", run, "--rank", "3", check=True, timeout=60)
    assert f"a step of slurm job {job_id} on n2" in " ".join(started.stdout.split())
    s = wait_for(run, lambda s: taken_back(s) or s["state"] != "RUNNING", 900)
    assert s["state"] == "RUNNING", s.get("reason")
    before = s["buffer"]["delivered_by_rank"].get("3", 0)
    s = wait_for(
        run,
        lambda s: (
            s["buffer"]["delivered_by_rank"].get("3", 0) >= before + 8 or s["state"] != "RUNNING"
        ),
        600,
    )
    assert s["state"] == "RUNNING", s.get("reason")
    back = next(w for w in s["workers"] if w["rank"] == 3)
    assert back["node"] == "n2" and back["pid"] != pids[3] and back["role"] == "rollout"
    # one step of the job beside submitit's: the rank's, on its node
    assert [x[1:] for x in steps(job_id) if x[1] == "reflow-rejoin"] == [["reflow-rejoin", "n2"]]
    assert "rank 3/4 on n2" in (run_dir / "logs" / "rank3.rejoin.log").read_text()
    return s, pids


def stop_and_check_nothing_left(run_dir: Path) -> dict:
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    reflow("stop", run_dir.name, check=True, timeout=300)
    final = wait_for(run_dir.name, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 300)
    assert final["state"] == "STOPPED", final.get("reason")
    wait_job_ended(job_id)
    # no rank outlives the job: not the rejoined one, nor the srun client that started it
    left = subprocess.run(["pgrep", "-af", str(run_dir)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    return final


def test_a_lost_rank_comes_back_as_a_step_on_the_allocation(tmp_path, runs_dir):
    recipe = tmp_path / "back.yaml"
    recipe.write_text(RECIPE)
    args = ["launch", str(recipe), "--nodes", "2"]
    for x in ("engine.synthetic_token_s=0.004", "control.heartbeat_timeout_s=10"):
        args += ["--set", x]
    reflow(*args, check=True, timeout=120)
    run_dir = next(runs_dir.iterdir())
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    try:
        # without process groups a lost rank that registers again is back at once
        s, _ = kill_and_start_again(
            run_dir,
            lambda s: any(w["rank"] == 3 for w in s["workers"] if w["state"] != "dead"),
            False,
        )
        assert [x["rank"] for x in s["lost_ranks"]] == [3]
        stop_and_check_nothing_left(run_dir)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)


@pytest.mark.slow
def test_a_lost_rank_with_real_engines_rejoins_from_a_step(runs_dir):
    args = ["launch", str(REPO / "recipes" / "demo.yaml"), "--nodes", "2", "--name", "back"]
    for s in (
        "resources.gpus_per_node=2",
        "resources.initial_ratio=2:2",
        "slurm.cpus_per_task=1",
        "train.steps=4000",  # ended by a stop once the rejoined rank has delivered
        "control.heartbeat_timeout_s=20",
        "control.peer_timeout_s=5",
        "control.collective_timeout_s=60",
    ):
        args += ["--set", s]
    reflow(*args, check=True, timeout=120)
    run_dir = next(runs_dir.iterdir())
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    try:
        s, _ = kill_and_start_again(run_dir, lambda s: bool(s["rejoined_ranks"]), True)
        at = s["rejoined_ranks"][0]["at_step"]  # a few steps trained on its samples too
        s = wait_for(run_dir.name, lambda s: s["step"] >= at + 4 or s["state"] != "RUNNING", 600)
        assert s["state"] == "RUNNING", s.get("reason")
        final = stop_and_check_nothing_left(run_dir)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    (back,) = final["rejoined_ranks"]
    assert back["rank"] == 3
    assert [x["source"] for x in final["switches"]].count("rank_rejoined") == 1
    # the engines generate with the current policy, the rejoined one included
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    after = [x for x in lines if x["step"] > back["at_step"] + 1]
    assert after and all(0.8 < x["mean_ratio"] < 1.25 for x in after)
