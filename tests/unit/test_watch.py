"""`reflow launch --wait` / `reflow status --watch` end: at the run's end, or, when rank 0
does not answer and Slurm cannot be asked either, after a bound with the reason."""

from __future__ import annotations

import pytest

from jobs import launch as launching
from jobs.errors import UserError
from reflow_cli import main
from runtime.store.run_dir import RunPaths

pytestmark = pytest.mark.unit


def test_a_run_nobody_can_answer_for_is_not_watched_forever(tmp_path, monkeypatch):
    stale = {"run": "r", "state": "RUNNING", "workers": [], "layout": {}, "stale": True}
    stale["slurm"] = {"job_id": "7", "state": "UNKNOWN"}  # squeue and sacct did not answer
    monkeypatch.setattr(launching, "read_status", lambda paths: dict(stale))
    with pytest.raises(UserError, match=r"rank 0 has not answered for 0.2 s and Slurm cannot"):
        main._watch(RunPaths(tmp_path / "r"), unanswered_s=0.2, poll_s=0.02)


def test_a_silent_rank0_whose_job_is_known_alive_is_watched_to_the_end(tmp_path, monkeypatch):
    states = iter(["RUNNING"] * 20 + ["COMPLETED"])

    def status(paths):
        slurm = {"job_id": "7", "state": "PENDING"}  # queued: Slurm answers, rank 0 not up
        return {
            "run": "r",
            "state": next(states),
            "workers": [],
            "layout": {},
            "stale": True,
            "slurm": slurm,
        }

    monkeypatch.setattr(launching, "read_status", status)
    done = main._watch(RunPaths(tmp_path / "r"), unanswered_s=0.05, poll_s=0.01)
    assert done["state"] == "COMPLETED"


def test_a_rank0_that_could_not_start_is_read_off_its_status_not_a_key_error(tmp_path):
    # rank 0 writes why it could not start where its address would be (runtime/entry.py):
    # `reflow launch --wait` and `reflow status` failed on it ("internal error: KeyError")
    from runtime.store.run_dir import write_json_atomic

    paths = RunPaths(tmp_path / "r")
    paths.root.mkdir()
    why = "rank 0 could not start: PluginError: 'x' is not one of random"
    write_json_atomic(paths.control, {"failed": why, "attempt": "1"})
    write_json_atomic(paths.status, {"run": "r", "state": "FAILED", "reason": why})
    status = launching.read_status(paths)
    assert status["state"] == "FAILED" and status["reason"] == why and status["stale"]
