"""Slurm allocations rendered by submitit (never hand-written sbatch)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from runtime.config.schema import Config


def slurm_available() -> bool:
    """True when a Slurm controller answers on this machine."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return False
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def slurm_parameters(cfg: Config, job_name: str) -> dict[str, Any]:
    """The recipe's allocation in submitit's SlurmExecutor vocabulary."""
    s, res = cfg.slurm, cfg.resources
    params: dict[str, Any] = {
        "job_name": job_name,
        "nodes": res.nodes,
        "ntasks_per_node": res.gpus_per_node,
        "cpus_per_task": s.cpus_per_task,
        "time": s.time_min,
        "signal_delay_s": 120,
    }
    if res.device != "cpu":
        params["gpus_per_node"] = res.gpus_per_node
    optional = {
        "partition": s.partition,
        "account": s.account,
        "qos": s.qos,
        "constraint": s.constraint,
        "mem": f"{s.mem_gb}GB" if s.mem_gb else None,
        "exclusive": True if s.exclusive else None,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    if s.additional:
        params["additional_parameters"] = dict(s.additional)
    return params


def render_sbatch(cfg: Config, job_name: str, folder: Path, python: str) -> str:
    """The sbatch script submitit would submit for this recipe."""
    from submitit.slurm import slurm as _slurm

    command = f"{python} -u -m submitit.core._submit {folder}"
    return _slurm._make_sbatch_string(
        command=command, folder=str(folder), **slurm_parameters(cfg, job_name)
    )


ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED")


def _rows(cmd: list[str]) -> list[list[str]]:
    """A Slurm command's ``|``-separated output rows; none when it cannot be asked."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip().split("|") for line in done.stdout.splitlines()]


def job_info(job_id: str) -> dict[str, str] | None:
    """Slurm's view of a job: state, node list, elapsed time and limit (squeue, which keeps
    finished jobs for MinJobAge; then sacct). None when Slurm does not know the job."""
    for row in _rows(["squeue", "-h", "--states=all", "-j", job_id, "-o", "%i|%T|%N|%M|%l"]):
        if len(row) == 5 and row[0] == job_id:
            state, nodes, elapsed, limit = row[1:]
            return {
                "job_id": job_id,
                "state": state,
                "nodes": nodes,
                "elapsed": elapsed,
                "time_limit": limit,
            }
    sacct = ["sacct", "-n", "-X", "--parsable2", "-o", "JobID,State,NodeList", "-j", job_id]
    for row in _rows(sacct):
        if len(row) >= 3 and row[0] == job_id:
            return {
                "job_id": job_id,
                "state": row[1].split()[0],
                "nodes": row[2],
                "elapsed": "",
                "time_limit": "",
            }
    return None
