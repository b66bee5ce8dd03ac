"""``reflow rejoin RUN --rank K``: start a lost rank of a running run again.

The new process is rank ``K`` of the same run (``python -m jobs.rejoin RUN_DIR K``, its
output in ``logs/rank<K>.rejoin.log``): it registers with rank 0, which welcomes it as
``"gone"`` in the current layout epoch, starts its engines, joins the torch.distributed world
again from ``dist.json``, and takes its role back at a later epoch: a rollout rank at the
next, with the current weights; a trainer rank once every rank of its replica group is back,
between two steps, with the trainer state of the replicas that stayed
(runtime/control/registration.py, runtime/engines/torch/shard_handoff.py).

Where it runs: a local run's rank is a detached process on this machine; a Slurm run's is a
new job step on the run's own allocation, on the node the lost rank ran on
(:func:`srun_command`: ``--overlap``, since the run's first step holds every CPU, memory and
GPU of the allocation). Its ``srun`` client runs here, detached, and ends with the step,
which ends with the rank or with the job. The step does not need it: with the client killed
(-9) a step ran on to its end (Slurm 22.05, measured), only the output the client carried
into ``logs/rank<K>.rejoin.log`` stopped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from jobs.errors import UserError
from jobs.launch import read_status
from runtime.config.recipe import load_recipe
from runtime.config.schema import Config
from runtime.entry import SLURM_STEP_ENV
from runtime.store.run_dir import RunPaths, read_json

# Variables of the Slurm job, step or MPI launch the command may have been typed in (an
# salloc shell, a batch script): srun would take them as options of the new step, and a
# local rank would take itself for a Slurm task (its GPU from SLURM_LOCALID, its attempt
# from SLURM_JOB_ID); nor is it a submitit task (it reads dist.json and control.json).
# SLURM_CONF says where the controller is, and stays.
INHERITED_LAUNCHER_PREFIXES = (
    "SLURM_",
    "SBATCH_",
    "SALLOC_",
    "SRUN_",
    "PMI_",
    "PMIX_",
    "SUBMITIT_",
)
KEPT_LAUNCHER_VARS = frozenset({"SLURM_CONF"})

# How long the CLI watches the new process (or its srun client) before it says "started":
# srun refused a bad job id or node in 12-30 ms here. A rank that fails later (it takes
# longer to import torch) says why in its log, and rank 0 never takes it back.
STARTUP_CHECK_S = 3.0


def rank_env(cfg: Config, rank: int, attempt: str) -> dict[str, str]:
    """The variables that make a process rank ``rank`` of the attempt ``attempt``
    (``JOB.RESTARTS``, the control file's: the rank must match it) outside submitit."""
    job, _, restarts = attempt.rpartition(".")
    return {
        "REFLOW_RANK": str(rank),
        "REFLOW_WORLD_SIZE": str(cfg.world_size),
        "REFLOW_ATTEMPT": job,
        "SLURM_RESTART_COUNT": restarts or "0",
    }


def process_env(
    base: Mapping[str, str], cfg: Config, rank: int, attempt: str, *, slurm_step: bool
) -> dict[str, str]:
    """The environment of the new rank (or of the srun client that starts it): ``base``
    without what an enclosing launcher set, and the rank's variables (:func:`rank_env`).
    A Slurm step's rank also gets ``LOCAL_RANK``, its place on its node (ranks fill nodes
    in order), since a one-task step's ``SLURM_LOCALID`` is 0; a local rank chooses its GPU
    as its first start did, from its rank."""
    env = {
        k: v
        for k, v in base.items()
        if k in KEPT_LAUNCHER_VARS or not k.startswith(INHERITED_LAUNCHER_PREFIXES)
    }
    env.update(rank_env(cfg, rank, attempt))
    if slurm_step:
        env["LOCAL_RANK"] = str(rank % cfg.resources.gpus_per_node)
        env[SLURM_STEP_ENV] = "1"
    return env


def srun_command(cfg: Config, job_id: str, node: str, argv: list[str]) -> list[str]:
    """One task of ``argv`` as a new step of job ``job_id`` on ``node``, sharing the run's
    resources (``--overlap``), with this process's environment (``--export ALL``)."""
    srun = shutil.which("srun")
    if srun is None:
        raise UserError(
            f"job {job_id} is a Slurm job: `reflow rejoin` starts its rank with srun, which "
            "is not on this machine's PATH (type it where sbatch and srun are)"
        )
    cmd = [
        srun,
        "--jobid",
        job_id,
        "--overlap",
        "--nodes",
        "1",
        "--ntasks",
        "1",
        "--nodelist",
        node,
        "--cpus-per-task",
        str(cfg.slurm.cpus_per_task),
        "--export",
        "ALL",
        "--job-name",
        "reflow-rejoin",
    ]
    if cfg.resources.device != "cpu":
        cmd += ["--gpus-per-node", str(cfg.resources.gpus_per_node)]
    return [*cmd, *argv]


def _lost_rank_node(status: dict, rank: int, run: str) -> str:
    """The node the lost rank ran on (its worker row stays in status, ``dead``)."""
    for w in status.get("workers", []):
        if w["rank"] == rank and w.get("node"):
            return str(w["node"])
    raise UserError(f"rank {rank} of run {run}: status names no node it ran on")


def start(paths: RunPaths, rank: int) -> str:
    """Start rank ``rank`` of the run at ``paths`` again; returns where (a pid, or the
    Slurm step's node). Refused (one line) unless the run is running and the rank is among
    its lost ones."""
    cfg = load_recipe(paths.config)
    if not 0 < rank < cfg.world_size:
        raise UserError(f"--rank {rank}: the run's ranks other than 0 are 1..{cfg.world_size - 1}")
    status = read_status(paths)
    if status.get("state") != "RUNNING":
        raise UserError(f"run {paths.name} is {status.get('state', 'not running')}")
    lost = {x["rank"] for x in status.get("lost_ranks", [])}
    alive = {w["rank"] for w in status.get("workers", []) if w["state"] not in ("dead", "exited")}
    if rank not in lost or rank in alive:
        raise UserError(f"rank {rank} of run {paths.name} is not a lost rank")
    attempt = str(read_json(paths.control).get("attempt", ""))
    repo = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "-u", "-m", "jobs.rejoin", str(paths.root), str(rank)]
    job = read_json(paths.job)
    step = None  # (job id, node) of the Slurm step it runs as
    if job.get("backend") == "slurm":
        step = (str(job["job_id"]), _lost_rank_node(status, rank, paths.name))
        argv = srun_command(cfg, *step, argv)
    env = process_env(os.environ, cfg, rank, attempt, slurm_step=step is not None)
    env["PYTHONPATH"] = str(repo)
    log = paths.logs / f"rank{rank}.rejoin.log"
    proc = start_detached(argv, env, repo, log, STARTUP_CHECK_S)
    if step is None:
        return f"pid {proc.pid}"
    return f"a step of slurm job {step[0]} on {step[1]}, srun pid {proc.pid}"


def start_detached(
    argv: list[str], env: dict[str, str], cwd: Path, log: Path, check_s: float
) -> subprocess.Popen:
    """Start ``argv`` in a session of its own (not the CLI's: it lives as long as the run),
    its output appended to ``log``; a process that ends within ``check_s`` is a one-line
    error quoting the last line it wrote."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=cwd,
            env=env,
        )
    try:
        code = proc.wait(timeout=check_s)
    except subprocess.TimeoutExpired:
        return proc
    lines = log.read_text(errors="replace").strip().splitlines()
    said = lines[-1].strip() if lines else "nothing"
    raise UserError(f"{Path(argv[0]).name} exited at once (exit {code}): {said} (see {log})")


def main(run_dir: str) -> int:
    from runtime.entry import RunFailed, rank_main

    try:
        rank_main(run_dir)
    except RunFailed as exc:
        print(f"rejoin: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
