"""Slurm allocations rendered by submitit (never hand-written sbatch)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from runtime.config import Config


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
