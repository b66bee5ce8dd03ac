"""``reflow stop`` returns once the run's job has left, so ``reflow launch --resume`` can
follow it at once (the resume refuses while the job is alive); a job that outlives the
grace is ended."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from jobs import launch
from runtime.store.run_dir import RunPaths


def stopped_run(tmp_path, controller: subprocess.Popen) -> RunPaths:
    """A run whose status already says STOPPED (rank 0 gone: no control.json) while its
    local controller process is still exiting."""
    paths = RunPaths(tmp_path / "run-1")
    paths.root.mkdir()
    paths.status.write_text(json.dumps({"run": paths.name, "state": "STOPPED", "workers": []}))
    paths.job.write_text(json.dumps({"backend": "local", "job_id": str(controller.pid)}))
    return paths


def controller(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_stop_returns_when_the_job_has_left(tmp_path):
    proc = controller(1.5)
    paths = stopped_run(tmp_path, proc)
    assert launch.job_alive(paths)
    final = launch.stop(paths, grace_s=60)
    assert final["state"] == "STOPPED"
    assert not launch.job_alive(paths)  # a resume now is not refused as "still running"
    assert proc.wait(timeout=5) == 0  # it left by itself


def test_a_job_that_outlives_the_grace_is_ended(tmp_path):
    proc = controller(120)
    paths = stopped_run(tmp_path, proc)
    started = time.monotonic()
    launch.stop(paths, grace_s=1.0)
    assert proc.wait(timeout=10) != 0  # SIGTERM
    assert time.monotonic() - started < 60
