"""The single-host Slurm the `slurm` tests run on (`make slurm-up`: virtual nodes n1, n2).

:func:`require_cluster` at a test module's top skips it with a reason when no controller
answers; CI sets REFLOW_REQUIRE_SLURM=1, which turns that into a failure.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jobs.slurm import ACTIVE_STATES

# a 2-node x 2-task run of synthetic engines (2:2), long enough to be stopped
RECIPE = """
name: onslurm
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 64}
algorithm: {group_size: 4}
train: {steps: 100000, batch_size: 16, lr: 0.001}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 1}
resources: {nodes: 1, gpus_per_node: 2, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic}
control: {heartbeat_interval_s: 0.5, heartbeat_timeout_s: 30}
slurm: {cpus_per_task: 1, time_min: 15}
"""


def _cluster() -> str | None:
    """Why no cluster is usable, or None when one answers with idle nodes."""
    if shutil.which("sinfo") is None:
        return "no Slurm client installed (run `make slurm-up`)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 10 s"
    nodes = [line.split() for line in out.stdout.splitlines() if line.strip()]
    if out.returncode != 0 or len(nodes) < 2:
        return f"no Slurm with 2 nodes answers (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return None


def require_cluster() -> None:
    why = _cluster()
    if why is None:
        return
    if os.environ.get("REFLOW_REQUIRE_SLURM") == "1":
        pytest.fail(f"REFLOW_REQUIRE_SLURM=1 but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def squeue_state(job_id: str) -> str:
    out = subprocess.run(
        ["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return out.stdout.strip()


def wait_job_ended(job_id: str, timeout_s: float = 60) -> None:
    """Until Slurm holds the job in no active state (any end will do: a job one of whose
    tasks was killed ends FAILED, whatever the run's state)."""
    deadline = time.monotonic() + timeout_s
    while squeue_state(job_id) in ACTIVE_STATES:
        assert time.monotonic() < deadline, squeue_state(job_id)
        time.sleep(1)


def slurm_diagnosis(job_id: str, run_dir: Path, lines: int = 15) -> str:
    """What a failed Slurm test prints besides the run's status: Slurm's record of the job,
    the daemons' log lines that name it, and the tail of each submitit log (CI keeps no
    files, so a failure there is read from this text alone)."""
    parts = []
    job = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True)
    parts.append(f"scontrol show job {job_id}:\n{job.stdout or job.stderr}")
    logs = Path(os.environ.get("REFLOW_SLURM_BASE", "/tmp/reflow-slurm")) / "log"
    for log in sorted(logs.glob("*.log")):
        named = [x for x in log.read_text(errors="replace").splitlines() if job_id in x]
        parts.append(f"{log.name} (lines naming {job_id}):\n" + "\n".join(named[-lines:]))
    for out in sorted((run_dir / "submitit").glob("*.out")) + sorted(
        (run_dir / "submitit").glob("*.err")
    ):
        tail = out.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"{out.name} (last {lines} lines):\n" + "\n".join(tail))
    return "\n\n".join(parts)
