"""Checkpoint and resume with real processes (synthetic engines): kill -9 of rank 0 stops
the whole job without hung ranks, and ``reflow launch --resume`` continues from the newest
checkpoint that verifies with the same buffer contents and policy version; a corrupt one is
skipped; ``reflow stop`` checkpoints the step it stops at."""

from __future__ import annotations

import json
import os
import signal
import time

import msgpack

from runtime.data.sample import sample_digest, sample_from_state
from runtime.store import checkpoint as ck
from tests.helpers import launch_recipe_text, reflow, status_json
from tests.helpers import wait_for_status as wait_for
from tests.integration.test_spine import pid_alive

RECIPE = """
name: resume
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 256}
algorithm: {group_size: 4}
train: {steps: STEPS, batch_size: 16, lr: 0.001, sync_every: 2, checkpoint_every: EVERY,
        keep_checkpoints: 3}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 2}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: 0.004}
control: {heartbeat_interval_s: 0.25, heartbeat_timeout_s: 3}
"""

TERMINAL = ("COMPLETED", "FAILED", "STOPPED")


def checkpoint_contents(folder) -> dict:
    """Sample ids and checksums straight from a checkpoint file (not through the run)."""
    state = msgpack.unpackb((folder / ck.COORDINATOR_FILE).read_bytes(), raw=False)
    buf = state["data"]["buffer"]
    raw = [*buf["unused"], *buf["replay"], *(t for g in buf["groups"].values() for t in g)]
    return {
        "samples": {str(d["sample_id"]): sample_digest(sample_from_state(d)) for d in raw},
        "policy_version": state["policy_version"],
        "step": state["step"],
    }


def wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [x for x in pids if pid_alive(x)], "ranks left behind"


def metrics(run_dir) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_kill_rank0_then_resume_continues_from_the_last_good_checkpoint(tmp_path, runs_dir):
    # no step budget to race: the resumed run is stopped by the test
    recipe = RECIPE.replace("STEPS", "100000").replace("EVERY", "4")
    run_dir, run = launch_recipe_text(tmp_path, recipe, runs_dir)
    s = wait_for(
        run,
        lambda s: (s["checkpoint"]["last"] or {}).get("step", 0) >= 12 or s["state"] in TERMINAL,
        300,
    )
    assert s["state"] == "RUNNING", s.get("reason")
    pids = [w["pid"] for w in s["workers"]]
    os.kill(next(w["pid"] for w in s["workers"] if w["rank"] == 0), signal.SIGKILL)
    # The other ranks lose rank 0, say so and leave: no hung ranks.
    wait_gone(pids, 60)
    for rank in (1, 2, 3):
        assert "lost contact with rank 0" in (run_dir / "logs" / f"rank{rank}.log").read_text()

    kept = sorted(d.name for d in (run_dir / "checkpoints").iterdir() if d.name[0] != ".")
    assert 2 <= len(kept) <= 3
    # Damage the newest: the resumed run must say so and use the one before.
    newest, previous = run_dir / "checkpoints" / kept[-1], run_dir / "checkpoints" / kept[-2]
    f = newest / ck.COORDINATOR_FILE
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    expected = checkpoint_contents(previous)
    assert expected["samples"]

    done = reflow("launch", "--resume", run, "--local", timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"resumed from {previous.name}" in done.stdout
    resumed = json.loads((run_dir / "resumed-2.json").read_text())
    assert resumed["from"] == previous.name
    assert any(newest.name in line and "truncated" in line for line in resumed["rejected"])
    # Same buffer (ids and checksums) and policy version as saved.
    assert resumed["buffer"]["samples"] == expected["samples"]
    # one version per weight sync: every 2 steps here
    assert resumed["policy_version"] == expected["policy_version"] == expected["step"] // 2

    on = expected["step"] + 10
    s = wait_for(run, lambda s: s["step"] >= on or s["state"] in TERMINAL, 300)
    assert s["state"] == "RUNNING" and s["attempt"] == 2, s.get("reason")
    assert "STOPPED" in reflow("stop", run, check=True, timeout=120).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED" and final["attempt"] == 2, final.get("reason")
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    # The step curve continues from the checkpoint step.
    second = [m["step"] for m in metrics(run_dir) if m.get("attempt") == 2 and "step" in m]
    assert second == list(range(expected["step"] + 1, final["step"] + 1))


def test_reflow_stop_checkpoints_then_resume_goes_on(tmp_path, runs_dir):
    recipe = RECIPE.replace("STEPS", "100000").replace("EVERY", "0")
    run_dir, run = launch_recipe_text(tmp_path, recipe, runs_dir)
    s = wait_for(run, lambda s: s["step"] >= 6 or s["state"] in TERMINAL, 300)
    pids = [w["pid"] for w in s["workers"]]
    done = reflow("stop", run, timeout=120)
    assert done.returncode == 0 and "STOPPED" in done.stdout, done.stdout + done.stderr
    assert not [x for x in pids if pid_alive(x)], "reflow stop returned before the ranks left"
    summary = json.loads((run_dir / "summary.json").read_text())
    (saved,) = summary["checkpoints"]
    assert saved["ok"] and saved["step"] == summary["steps"]  # the step it stopped at
    # What the rollout ranks had generated of the requests in flight is in the checkpoint.
    kept = saved["parked_rollouts"]
    assert kept["requests"] >= 1 and kept["tokens"] >= 1, saved

    # A few steps past the saved one: on a loaded machine the stop may land after step 20.
    target = saved["step"] + 14
    target += target % 2  # a run ends at a sync point (sync_every: 2)
    done = reflow(
        "launch", "--resume", run, "--local", "--set", f"train.steps={target}", timeout=300
    )
    assert done.returncode == 0, done.stderr
    final = wait_for(run, lambda s: s["state"] in TERMINAL, 300)
    assert final["state"] == "COMPLETED" and final["step"] == target, final.get("reason")
    assert final["resumed"]["step"] == saved["step"]
    # ... and the resumed run continued them, each token under the version that generated
    # it before the stop: none was generated again. A parked straggler whose group closed
    # (reflow.max_stragglers) before it was handed out again is dropped, and counted so.
    parked = final["buffer"]["parked_rollouts"]
    dropped = parked.get("dropped_straggler_tokens", 0)
    assert (
        parked["continued_tokens"] > 0 and parked["continued_tokens"] + dropped == kept["tokens"]
    ), parked
    assert parked.get("regenerated_tokens", 0) == 0, parked
    assert json.loads((run_dir / "summary.json").read_text())["parked_rollouts"] == parked


def test_resume_refuses_with_one_line(tmp_path, runs_dir):
    from jobs.runs import create_run
    from runtime.config.recipe import build_config

    paths = create_run(build_config({"resources": {"gpus_per_node": 2}}), "empty")
    done = reflow("launch", "--resume", paths.name, "--local")
    assert done.returncode == 2 and "no usable checkpoint" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    more = ("--set", "resources.nodes=2", "--set", "resources.initial_ratio=2:2")
    done = reflow("launch", "--resume", paths.name, "--local", *more)
    assert done.returncode == 2 and "same number" in done.stderr
    done = reflow("launch", "recipes/demo.yaml", "--resume", paths.name)
    assert done.returncode == 2 and "give no RECIPE" in done.stderr
    done = reflow("launch", "--resume", "nope")
    assert done.returncode == 2 and "no such run" in done.stderr
