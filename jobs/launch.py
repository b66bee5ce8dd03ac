"""``reflow launch``/``stop``: start a run's ranks (local or Slurm) and end them.

Backends are chosen from a registry by name: ``local`` runs every rank on this machine
through submitit's LocalExecutor; ``slurm`` submits one job through submitit's
AutoExecutor. Without ``--local``, Slurm is used when a controller answers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import submitit

from jobs.control import ControlClient, ControlUnavailable
from jobs.errors import UserError
from jobs.runs import create_run
from jobs.slurm import ACTIVE_STATES, job_info, slurm_parameters
from runtime.config.recipe import dump_config
from runtime.config.schema import Config
from runtime.entry import RankMain
from runtime.store import checkpoint
from runtime.store.checkpoint import CheckpointInfo
from runtime.store.run_dir import RunPaths, read_json, write_json_atomic
from runtime.transport import protocol as p

TERMINAL = ("COMPLETED", "STOPPED", "FAILED")


@dataclass(frozen=True)
class Submitted:
    paths: RunPaths
    backend: str
    job_id: str


@contextlib.contextmanager
def _stdio_to(path: Path) -> Iterator[None]:
    """Point fds 1/2 at a file while submitit spawns its controller.

    The local controller inherits our stdout/stderr; left alone it would hold the pipe of
    whoever ran ``reflow launch`` open for the whole run.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (fd, *saved):
            os.close(f)


def _submit_local(cfg: Config, paths: RunPaths) -> str:
    executor = submitit.LocalExecutor(folder=paths.submitit)
    executor.update_parameters(
        tasks_per_node=cfg.world_size,
        nodes=1,
        timeout_min=cfg.slurm.time_min,
        signal_delay_s=60,
    )
    with _stdio_to(paths.logs / "controller.log"):
        job = executor.submit(RankMain(), str(paths.root))
    return str(job.job_id)


def _submit_slurm(cfg: Config, paths: RunPaths) -> str:
    executor = submitit.AutoExecutor(folder=paths.submitit, cluster="slurm")
    params = slurm_parameters(cfg, paths.name)
    executor.update_parameters(**{f"slurm_{k}": v for k, v in params.items()})
    job = executor.submit(RankMain(), str(paths.root))
    return str(job.job_id)


BACKENDS: dict[str, Callable[[Config, RunPaths], str]] = {
    "local": _submit_local,
    "slurm": _submit_slurm,
}


def submit(cfg: Config, backend: str, name: str | None = None) -> Submitted:
    paths = create_run(cfg, name)
    job_id = BACKENDS[backend](cfg, paths)
    write_json_atomic(
        paths.job, {"backend": backend, "job_id": job_id, "submitted_at": time.time()}
    )
    return Submitted(paths, backend, job_id)


def resume(paths: RunPaths, cfg: Config, backend: str) -> tuple[Submitted, CheckpointInfo]:
    """Start a stopped, failed or preempted run again in its own folder; rank 0 continues
    from the newest checkpoint that verifies (runtime/entry.py)."""
    if job_alive(paths):
        raise UserError(f"run {paths.name} is still running; `reflow stop {paths.name}` first")
    info, rejected = checkpoint.latest_valid(paths.checkpoints)
    if info is None:
        why = "; ".join(rejected) if rejected else "none was written"
        raise UserError(f"run {paths.name}: no usable checkpoint in {paths.checkpoints} ({why})")
    job = read_json(paths.job) if paths.job.is_file() else {}
    # The last attempt's files would answer for this one (address, state): set them aside.
    n = len(job.get("previous", [])) + 1
    for f in (paths.summary, paths.status):
        if f.is_file():
            f.rename(f.with_name(f"{f.stem}.attempt{n}{f.suffix}"))
    paths.control.unlink(missing_ok=True)
    dump_config(cfg, paths.config)
    job_id = BACKENDS[backend](cfg, paths)
    previous = [*job.get("previous", []), {k: v for k, v in job.items() if k != "previous"}]
    write_json_atomic(
        paths.job,
        {
            "backend": backend,
            "job_id": job_id,
            "submitted_at": time.time(),
            "resumed_from": info.name,
            "previous": previous,
        },
    )
    return Submitted(paths, backend, job_id), info


def job_alive(paths: RunPaths) -> bool | None:
    """Whether the run's processes/job still exist (None when unknown)."""
    try:
        job = read_json(paths.job)
    except (OSError, ValueError):
        return None
    if job["backend"] == "slurm":
        info = job_info(str(job["job_id"]))
        return None if info is None else info["state"] in ACTIVE_STATES
    if job["backend"] == "local":
        try:
            os.kill(int(job["job_id"]), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        # A finished controller that nobody reaped yet is a zombie: not alive.
        try:
            stat = Path(f"/proc/{job['job_id']}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return True
    return None


def read_status(paths: RunPaths, timeout_s: float = 3.0) -> dict:
    """Live status from the coordinator, else its last snapshot marked ``stale``."""
    try:
        status = ControlClient(paths, timeout_s).status()
        status["stale"] = False
    except ControlUnavailable:
        try:
            status = read_json(paths.status)
        except (OSError, ValueError):
            status = {"run": paths.name, "state": "STARTING", "workers": [], "layout": {}}
        status["stale"] = True
        if status.get("state") not in TERMINAL and job_alive(paths) is False:
            status["state"] = "FAILED"
            status["reason"] = "the run's processes are gone (see reflow logs)"
    with contextlib.suppress(OSError, ValueError, KeyError):
        job = read_json(paths.job)
        if job["backend"] == "slurm":
            # Slurm's view next to the coordinator's: queue state, nodes, time used/limit.
            status["slurm"] = job_info(str(job["job_id"])) or {
                "job_id": str(job["job_id"]),
                "state": "UNKNOWN",
            }
    return status


def wait_until(
    paths: RunPaths,
    done: Callable[[dict], bool],
    timeout_s: float,
    on_status: Callable[[dict], None] | None = None,
    poll_s: float = 0.5,
) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        status = read_status(paths)
        if on_status is not None:
            on_status(status)
        if done(status) or status.get("state") in TERMINAL:
            return status
        if time.monotonic() > deadline:
            raise UserError(
                f"run {paths.name}: still {status.get('state')} after {timeout_s:.0f} s "
                f"(see reflow logs {paths.name})"
            )
        time.sleep(poll_s)


def stop(paths: RunPaths, grace_s: float = 60.0, poll_s: float = 0.5) -> dict:
    """Ask the coordinator to stop; return once the run has ended and its job has left
    (so that ``reflow launch --resume`` can follow at once); if either takes longer than
    ``grace_s``, end the job."""
    deadline = time.monotonic() + grace_s
    try:
        reply = ControlClient(paths).command(p.StopRequest(reason="reflow stop"))
        if not reply.ok:
            raise UserError(reply.text)
    except ControlUnavailable:
        pass  # already gone, or rank 0 unreachable: the fallback below ends the job
    try:
        final = wait_until(paths, lambda s: False, max(deadline - time.monotonic(), 0.0))
    except UserError:
        _kill_job(paths)
        return read_status(paths)
    # The status says STOPPED before the ranks and the controller have exited.
    while job_alive(paths) and time.monotonic() < deadline:
        time.sleep(poll_s)
    if job_alive(paths):
        _kill_job(paths)
    return final


def _kill_job(paths: RunPaths) -> None:
    job = read_json(paths.job)
    if job["backend"] == "local":
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(job["job_id"]), signal.SIGTERM)  # the controller forwards it
    elif job["backend"] == "slurm":
        import subprocess

        try:
            subprocess.run(["scancel", str(job["job_id"])], check=False, timeout=30)
        except subprocess.TimeoutExpired:
            raise UserError(f"scancel {job['job_id']} did not answer within 30 s") from None
