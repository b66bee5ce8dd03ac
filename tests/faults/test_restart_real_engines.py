"""kill -9 of a rank of the only trainer replica on the real engines (vLLM CPU build +
torch, one gloo group for gradients and weights; two trainer ranks in one replica group,
``resources.trainer_gpus_per_replica: 2``): the leader's replica holds the run's state, so
the run cannot go on without it (another replica lost is absorbed:
tests/integration/test_real_engines.py). The step fails cleanly instead
of hanging, the run restarts from its last checkpoint, the torch trainer gets its model
and AdamW state back, the rollout engines get the checkpoint's weights before any work,
and the run trains on (no step budget to race: the test stops it four steps past the
checkpoint it resumed from)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.faults.test_resume import metrics, wait_gone
from tests.helpers import descendants, launch_demo, reached, reflow, running, status_json
from tests.helpers import wait_for_status as wait_for


# ~6 minutes of real engines started twice: make test-slow (CI's 45-minute budget); the
# restart itself is in make test with synthetic engines (tests/faults/test_restart.py)
@pytest.mark.slow
def test_a_killed_trainer_replica_restarts_real_engines_from_the_checkpoint(runs_dir):
    sets = [
        "train.steps=100000",  # never reached: the test stops the run
        "train.checkpoint_every=4",
        "control.max_restarts=1",
        "control.heartbeat_timeout_s=120",
        "control.collective_timeout_s=60",
        "resources.trainer_gpus_per_replica=2",
    ]
    run_dir, run = launch_demo("realfail", sets, runs_dir)
    s = wait_for(
        run,
        lambda s: (s["checkpoint"]["last"] or {}).get("step", 0) >= 4 or s["state"] != "RUNNING",
        600,
    )
    assert s["state"] == "RUNNING", s.get("reason")
    saved = s["checkpoint"]["last"]["step"]
    pids = [w["pid"] for w in s["workers"]]
    victim = next(w["pid"] for w in s["workers"] if w["rank"] == 1)
    engine = descendants(victim)  # its vLLM engine core and workers
    assert engine, "rank 1 runs no engine processes"
    os.kill(victim, signal.SIGKILL)
    wait_gone(pids, 240)  # the collective fails (or times out): nobody hangs
    wait_gone(engine, 60)  # and the killed rank's engine is not left behind

    wait_for(run, lambda s: s.get("attempt") == 2, 300)
    first = json.loads((run_dir / "summary.attempt1.json").read_text())
    assert first["state"] == "FAILED" and "restart 1 of 1" in first["reason"], first["reason"]
    # the survivor says what it was blocked in when the dead peer broke it (a step's
    # collectives or the weight sync), and with whom
    assert "while waiting on " in first["reason"] and "ranks [0, 1" in first["reason"], first[
        "reason"
    ]
    saved = max(c["step"] for c in first["checkpoints"] if c["ok"])
    running(wait_for(run, reached(saved + 4), 900))
    assert "STOPPED" in reflow("stop", run, check=True, timeout=300).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED", final.get("reason")
    assert final["step"] >= saved + 4 and final["resumed"]["step"] == saved

    second = [m for m in metrics(run_dir) if m.get("attempt") == 2]
    assert [m["step"] for m in second] == list(range(saved + 1, final["step"] + 1))
    # The restored trainer and the rollout engines hold the same policy: behaviour
    # log-probs from vLLM match the trainer's (a stale engine would be far off).
    assert all(0.8 < m["mean_ratio"] < 1.25 for m in second)
    assert all(m["trainer_replicas"] == 2 and m["replica_spread"] == 0.0 for m in second)
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    assert "trainer state restored" in (run_dir / "logs" / "rank1.log").read_text()
