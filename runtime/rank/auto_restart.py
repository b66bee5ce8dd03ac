"""Automatic restart of a run from its last checkpoint (``control.max_restarts``).

Rank 0 decides when its run FAILED mid-training (a rank lost or failing): on Slurm the job
is requeued in place (``scontrol requeue``; the same allocation request, a new attempt);
locally a detached ``python -m jobs.restart`` waits for this job's processes to end and
submits the run again. Either way rank 0 of the next attempt resumes from the newest
checkpoint that verifies (runtime/entry.py).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from runtime.store.run_dir import RunPaths

log = logging.getLogger(__name__)


def restarts_so_far(paths: RunPaths, env: Mapping[str, str]) -> int:
    """Slurm counts its requeues; a local run's job.json lists its earlier jobs."""
    if env.get("SUBMITIT_EXECUTOR") == "slurm":
        return int(env.get("SLURM_RESTART_COUNT") or 0)
    try:
        return len(json.loads(paths.job.read_text()).get("previous", []))
    except (OSError, ValueError):
        return 0


def restart_job(paths: RunPaths, env: Mapping[str, str]) -> str:
    """Start the next attempt; returns how, for the log and the run's reason."""
    if env.get("SUBMITIT_EXECUTOR") == "slurm":
        job = env["SLURM_JOB_ID"]
        subprocess.run(["scontrol", "requeue", job], check=True, timeout=60)
        return f"Slurm job {job} requeued"
    repo = Path(__file__).resolve().parents[2]
    with (paths.logs / "restart.log").open("ab") as out:  # the child keeps its own copy
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.restart", str(paths.root)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # outlives this job's processes
            cwd=repo,
            env={**os.environ, "PYTHONPATH": str(repo)},
        )
    return f"local restart process {proc.pid} (logs/restart.log)"
