"""kill -9 of a trainer rank (real processes, synthetic engines): the run fails cleanly
(the rank is declared dead, every other rank leaves), restarts by itself from its last
checkpoint (``control.max_restarts``) and trains on; the step curve goes on from the
checkpoint's step and the sample ledger shows nothing lost or duplicated.

The run has no step budget to race: once the second attempt has trained ten steps past
its checkpoint, the test stops it."""

from __future__ import annotations

import json
import os
import signal

from tests.faults.test_resume import metrics, wait_gone
from tests.helpers import launch_recipe_text, reached, reflow, running, status_json
from tests.helpers import wait_for_status as wait_for

RECIPE = """
name: restart
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 256}
algorithm: {group_size: 4}
train: {steps: 100000, batch_size: 16, lr: 0.001, sync_every: 2, checkpoint_every: 4}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 2}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: 0.004}
control: {heartbeat_interval_s: 0.25, heartbeat_timeout_s: 3, max_restarts: 1}
"""


def test_a_killed_trainer_rank_restarts_the_run_from_its_checkpoint(tmp_path, runs_dir):
    run_dir, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)
    s = wait_for(
        run,
        lambda s: (s["checkpoint"]["last"] or {}).get("step", 0) >= 8 or s["state"] != "RUNNING",
        300,
    )
    assert s["state"] == "RUNNING", s.get("reason")
    pids = [w["pid"] for w in s["workers"]]
    os.kill(next(w["pid"] for w in s["workers"] if w["rank"] == 1), signal.SIGKILL)
    wait_gone(pids, 60)  # the whole first attempt ends: no hung ranks
    wait_for(run, lambda s: s.get("attempt") == 2, 300)
    first = json.loads((run_dir / "summary.attempt1.json").read_text())
    assert first["state"] == "FAILED" and "rank 1 (trainer" in first["reason"]
    assert "restart 1 of 1 from step-" in first["reason"]
    saved = first["checkpoints"][-1]["step"]

    running(wait_for(run, reached(saved + 10), 300))
    assert "STOPPED" in reflow("stop", run, check=True, timeout=120).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED", final.get("reason")
    assert final["step"] >= saved + 10 and final["resumed"]["step"] == saved
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    second = [m["step"] for m in metrics(run_dir) if m.get("attempt") == 2]
    assert second == list(range(saved + 1, final["step"] + 1))
    job = json.loads((run_dir / "job.json").read_text())
    assert len(job["previous"]) == 1 and job["resumed_from"] == f"step-{saved:08d}"
    assert "resumed from" in (run_dir / "logs" / "restart.log").read_text()
