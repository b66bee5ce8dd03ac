"""The spine end to end: real `reflow` CLI processes, 4 local ranks, ZeroMQ, role switches."""

import json
import os
import pickle
import re
import signal
import time
from pathlib import Path

import pytest

from runtime.transport.protocol import SWITCH_PHASES
from tests.helpers import REPO, reflow, status_json
from tests.helpers import wait_for_status as wait_for

RECIPE = """
name: spine
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: placeholder, trainer: placeholder}
control: {heartbeat_interval_s: 0.5, heartbeat_timeout_s: 10}
train: {steps: 1000000}
"""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # reparented zombies count as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_launch_rebalance_stop(tmp_path, runs_dir):
    recipe = tmp_path / "spine.yaml"
    recipe.write_text(RECIPE)
    done = reflow("launch", str(recipe), "--local", check=True)
    assert "4 ranks up, state RUNNING" in done.stdout
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name

    s = status_json(run)
    assert s["state"] == "RUNNING" and s["run"] == run
    assert [w["rank"] for w in s["workers"]] == [0, 1, 2, 3]
    assert [w["role"] for w in s["workers"]] == ["trainer", "trainer", "rollout", "rollout"]
    assert s["layout"]["rollout_gpus"] == 2 and s["layout"]["trainer_gpus"] == 2
    pids = [w["pid"] for w in s["workers"]]
    controller = json.loads((run_dir / "job.json").read_text())["job_id"]
    assert all(pid_alive(pid) for pid in pids)
    assert all(w["heartbeat_age_s"] < 10 for w in s["workers"])

    done = reflow("rebalance", "--ratio", "3:1", run, check=True)
    assert "accepted" in done.stdout
    s = wait_for(
        run,
        lambda s: (
            [w["role"] for w in s["workers"]] == ["trainer", "rollout", "rollout", "rollout"]
            and not s["layout"]["switching"]
        ),
    )
    assert s["layout"]["rollout_gpus"] == 3 and s["layout"]["epoch"] == 1

    done = reflow("rebalance", "--ratio", "1:3", run, check=True)
    s = wait_for(
        run,
        lambda s: (
            [w["role"] for w in s["workers"]] == ["trainer", "trainer", "trainer", "rollout"]
            and not s["layout"]["switching"]
        ),
    )
    assert s["layout"] == {
        "rollout_gpus": 1,
        "trainer_gpus": 3,
        "epoch": 2,
        "pending": None,
        "switching": False,
    }
    assert [x["ratio"] for x in s["switches"]] == ["3:1", "1:3"]
    # every rank timed the parts of its switch; the record keeps the slowest of each
    assert all(set(x["phases_max_s"]) == set(SWITCH_PHASES) for x in s["switches"])

    bad = reflow("rebalance", "--ratio", "4:0", run)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        "reflow: rebalance 4:0: 4:0 leaves fewer than one trainer replica (1 ranks)"
    )

    human = reflow("status", run, check=True)
    assert "RUNNING" in human.stdout and "rollout" in human.stdout

    done = reflow("stop", run, check=True)
    assert f"run {run}: STOPPED reflow stop" in done.stdout
    deadline = time.monotonic() + 30
    while any(pid_alive(x) for x in [*pids, int(controller)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(x) for x in [*pids, int(controller)]), "orphan processes left"
    # Every rank's submitit result says it returned normally (process exit code 0).
    results = sorted((run_dir / "submitit").glob("*_result.pkl"))
    assert len(results) == 4
    for r in results:
        outcome, value = pickle.loads(r.read_bytes())
        assert outcome == "success", value
    final = status_json(run)
    assert final["state"] == "STOPPED" and final["stale"] is True
    assert all(w["state"] == "exited" for w in final["workers"])
    logs = reflow("logs", run, "--rank", "1", check=True).stdout
    assert "epoch 1: trainer -> rollout" in logs and "epoch 2: rollout -> trainer" in logs
    assert oct((run_dir / "keys" / "client.secret").stat().st_mode & 0o777) == "0o600"


def test_dry_run_of_the_cluster_recipe_needs_no_slurm(runs_dir):
    done = reflow("launch", "recipes/apps_coding.yaml", "--nodes", "8", "--dry-run")
    # the plan, then the launch's refusal: the recipe's data is a cluster path, absent here
    assert done.returncode == 2 and "/data/apps/train.jsonl" in done.stderr
    lines = done.stdout.splitlines()
    assert "8 node(s) x 8 ranks = 64 ranks, 48 rollout (groups of 1) : 16 trainer" in done.stdout
    node_rows = [ln for ln in lines if ln.strip()[:1].isdigit() and ":" in ln]
    assert len(node_rows) == 8
    assert "0:t0" in node_rows[0] and "63:r47" in node_rows[7]
    assert "nodes = 8" in done.stdout and "ntasks_per_node = 8" in done.stdout
    assert not runs_dir.exists(), "a dry run must start nothing"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["launch", "nope.yaml"], "reflow: nope.yaml: no such recipe file"),
        (
            ["launch", "recipes/demo.yaml", "--set", "reflow.sigma=7", "--dry-run"],
            "reflow: recipes/demo.yaml (--set reflow.sigma=7): reflow.sigma: 7.0 is out of range "
            "(allowed: 0 <= sigma < 1)",
        ),
        (["status", "no-such-run"], "reflow: no-such-run: no such run"),
        # numbers: ASCII digits in range (click's INT took these, or overflowed later)
        (
            ["launch", "recipes/demo.yaml", "--nodes", "\uff18", "--dry-run"],
            "reflow: Invalid value for '--nodes': '\uff18' is not a whole number from 1 to "
            "100000 in ASCII digits",
        ),
        (
            ["simulate", "recipes/demo.yaml", "--gpus", "1" * 23],
            "reflow: Invalid value for '--gpus': '11111111111111111111111'",
        ),
        (
            ["plan", "recipes/demo.yaml", "--gpu-memory-gib", "nan"],
            "reflow: Invalid value for '--gpu-memory-gib': 'nan' is not a number",
        ),
        (["rejoin", "x"], "reflow: rejoin: give --rank K"),
    ],
)
def test_user_errors_are_one_line_with_exit_2(runs_dir, args, message):
    done = reflow(*args)
    assert done.returncode == 2
    assert done.stderr.strip().startswith(message)
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_a_recipe_that_does_not_load_is_refused_before_slurm_is_asked(tmp_path, monkeypatch):
    # sinfo can take its whole 10 s timeout (a client with no controller): a typo in the
    # recipe's name must not cost that. Before, launch asked Slurm first.
    asked, tools = tmp_path / "asked", tmp_path / "bin"
    tools.mkdir()
    for tool in ("sinfo", "sbatch"):
        (tools / tool).write_text(f"#!/bin/sh\necho {tool} >> {asked}\nexit 1\n")
        (tools / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tools}:{os.environ['PATH']}")
    done = reflow("launch", "nope.yaml")
    assert done.returncode == 2 and "no such recipe file" in done.stderr
    assert not asked.exists()
    # a recipe that loads does ask, and with no controller answering the run would be local
    done = reflow("launch", str(REPO / "recipes" / "demo.yaml"), "--dry-run")
    assert done.returncode == 0 and "backend local" in done.stdout, done.stderr
    assert asked.read_text().split() == ["sinfo"]


def test_sigterm_on_any_rank_stops_the_whole_run(tmp_path, runs_dir):
    recipe = tmp_path / "spine.yaml"
    recipe.write_text(RECIPE)
    reflow("launch", str(recipe), "--local", "--name", "sig", check=True)
    run_dir = next(runs_dir.iterdir())
    s = status_json(run_dir.name)
    pids = [w["pid"] for w in s["workers"]]
    os.kill(pids[2], signal.SIGTERM)
    final = wait_for(run_dir.name, lambda s: s["state"] in ("STOPPED", "FAILED"))
    assert final["state"] == "STOPPED" and final["reason"] == "rank 2 got SIGTERM"
    deadline = time.monotonic() + 30
    while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(x) for x in pids)


def test_a_rank_whose_engine_cannot_start_fails_the_run_with_its_reason(tmp_path, runs_dir):
    recipe = tmp_path / "bad_engine.yaml"
    missing = tmp_path / "no-model"
    recipe.write_text(
        RECIPE.replace("trainer: placeholder", "trainer: torch") + f"model: {{path: {missing}}}\n"
    )
    done = reflow("launch", str(recipe), "--local")
    assert done.returncode == 2
    # Every rank holds both sides, so whichever rank fails first names the reason.
    assert re.search(r"failed to start: rank \d( left)?: OSError: .*no-model", done.stderr), (
        done.stderr
    )


def test_launch_checks_the_dataset_file_before_starting_anything(tmp_path, runs_dir):
    data = tmp_path / "gsm.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n{"question": "2+2?"}\n')
    recipe = tmp_path / "math.yaml"
    recipe.write_text(
        RECIPE
        + f"data: {{train: {data}, fields: {{prompt: question}}}}\n"
        + "workload: {kind: math}\n"
    )
    done = reflow("launch", str(recipe), "--local")
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"reflow: {data}: record 1 has no field 'answer'; it has: question"
    ), done.stderr
    assert not runs_dir.exists()
