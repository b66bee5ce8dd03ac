"""The one entry point every rank runs (submitit calls :func:`rank_main`).

Rank 0 also hosts the coordinator (a thread) before becoming a hybrid worker like the
others. The function returns normally for COMPLETED/STOPPED and raises for FAILED, so the
process exit code is the run's outcome.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config.layout import is_rollout_driver
from runtime.config.recipe import load_recipe
from runtime.config.schema import Config, needs_collective
from runtime.control.coordinator import Coordinator
from runtime.engines.registry import build_eval_prompts, build_prompts, build_sides, vocab_size
from runtime.rank.auto_restart import restart_job, restarts_so_far
from runtime.rank.orphans import guard_process_group
from runtime.rank.worker import HybridWorker, WorkerError, node_name
from runtime.store import checkpoint
from runtime.store.run_dir import RunPaths, keep_temp_files_in, write_json_atomic
from runtime.transport.auth import CLIENT, SERVER, load_keypair

if TYPE_CHECKING:
    import subprocess

    from runtime.rank.collective import Collective

log = logging.getLogger("reflow")


# set on a rank that runs in a Slurm step submitit did not start (`reflow rejoin`, jobs/rejoin.py)
SLURM_STEP_ENV = "REFLOW_SLURM_STEP"


class RunFailed(RuntimeError):
    """The run ended FAILED; raising it makes the rank's exit code say so."""


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    node: str


def rank_info() -> RankInfo:
    """Rank and world from submitit's job environment (local or Slurm), else REFLOW_* vars."""
    if "REFLOW_RANK" in os.environ:
        return RankInfo(
            int(os.environ["REFLOW_RANK"]), int(os.environ["REFLOW_WORLD_SIZE"]), node_name()
        )
    import submitit

    env = submitit.JobEnvironment()
    return RankInfo(env.global_rank, env.num_tasks, node_name())


def guards_its_processes(env: dict[str, str] | os._Environ) -> bool:
    """A local rank leaves no engine processes behind when killed (runtime/rank/orphans.py).
    On Slurm (submitit's task, or a step `reflow rejoin` started) the job's process
    tracking does that, and a new process group could hide a rank from it (proctrack/pgid)."""
    return env.get("SUBMITIT_EXECUTOR") != "slurm" and env.get(SLURM_STEP_ENV) != "1"


def attempt_id(env: dict[str, str] | os._Environ) -> str:
    """This start of the job, the same on every rank: the job id (a resumed run is a new
    job), and Slurm's restart count (a requeued job keeps its id)."""
    job = env.get("REFLOW_ATTEMPT")
    if job is None:
        try:
            import submitit

            job = str(submitit.JobEnvironment().job_id)
        except RuntimeError:  # not under submitit
            job = env.get("SLURM_JOB_ID", "")
    return f"{job}.{env.get('SLURM_RESTART_COUNT', '0')}"


def control_endpoint(env: dict[str, str] | os._Environ) -> tuple[str, str]:
    """Where rank 0 listens and the address it publishes.

    Local runs stay on loopback. Under Slurm the other ranks are on other nodes: listen on
    every interface and publish this node's name (CURVE keeps the control server closed to
    outsiders; the torch.distributed store is not authenticated and listens on one address
    only: runtime/rank/collective.py).
    REFLOW_BIND_HOST / REFLOW_ADVERTISE_HOST override both.
    """
    on_slurm = "SLURM_JOB_ID" in env and env.get("SUBMITIT_EXECUTOR") != "local"
    bind = env.get("REFLOW_BIND_HOST") or ("0.0.0.0" if on_slurm else "127.0.0.1")
    default_advertise = socket.gethostname() if bind == "0.0.0.0" else bind
    return bind, env.get("REFLOW_ADVERTISE_HOST") or default_advertise


def _setup_logging(paths: RunPaths, rank: int, level: str) -> None:
    paths.logs.mkdir(exist_ok=True)
    handler = logging.FileHandler(paths.rank_log(rank))
    handler.setFormatter(
        logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler, logging.StreamHandler(sys.stderr)]
    root.setLevel(level)


def cpu_threads_bind(rank: int, rollout_group_size: int, cores: list[int]) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``rank`` on CPU: one core per rank, round robin.

    A tensor-parallel engine (``rollout_gpus_per_replica > 1``) runs one worker process per
    shard and wants one core list per worker, ``|``-separated; its driver (the first rank
    of the group) gives them the cores of its group's ranks, whose member sides run no
    engine (runtime/rank/tp_member.py). The CPU build cannot bind two workers itself when
    the machine has a single NUMA node ("Not enough allowed NUMA nodes")."""
    if not cores:
        raise ValueError("this process may run on no CPU core (sched_getaffinity is empty)")
    if not is_rollout_driver(rank, rollout_group_size):
        return str(cores[rank % len(cores)])  # builds no engine; its trainer side may
    return "|".join(str(cores[(rank + i) % len(cores)]) for i in range(rollout_group_size))


# the watcher of this rank's process group, kept referenced (runtime/rank/orphans.py)
_GUARD: list[subprocess.Popen | None] = []


def rank_main(run_root: str) -> str:
    paths = RunPaths(Path(run_root))
    info = rank_info()
    cfg: Config = load_recipe(paths.config)
    _setup_logging(paths, info.rank, cfg.logging.level)
    log.info("rank %d/%d on %s pid %d", info.rank, info.world_size, info.node, os.getpid())
    # before any engine starts: its temporary files and IPC sockets stay in the run folder
    sockets = keep_temp_files_in(paths, info.rank)
    if sockets.is_absolute() and not sockets.is_relative_to(paths.root):
        atexit.register(shutil.rmtree, sockets, True)  # the fallback: gone with the rank
    if guards_its_processes(os.environ):
        _GUARD.append(guard_process_group())
    # Models are local folders (a cluster's shared FS, or the embedded one): never let a
    # typo in model.path turn into a hub download attempt.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if cfg.resources.device != "cuda":
        # Several engines share few cores: pin each rank's vLLM threads to its own core and
        # keep torch to the recipe's thread count, or they all slow to a crawl.
        os.environ.setdefault(
            "VLLM_CPU_OMP_THREADS_BIND",
            cpu_threads_bind(
                info.rank, cfg.resources.rollout_gpus_per_replica, sorted(os.sched_getaffinity(0))
            ),
        )
        os.environ.setdefault("OMP_NUM_THREADS", str(cfg.resources.torch_threads))
    if info.world_size != cfg.world_size:
        raise RunFailed(f"allocation has {info.world_size} ranks, the recipe {cfg.world_size}")
    bind, advertise = control_endpoint(os.environ)
    attempt = attempt_id(os.environ)
    server = None
    if info.rank == 0:
        from runtime.rank.control_server import ControlServer

        # An earlier attempt's rendezvous must not be read by this one's ranks (they read
        # it only after rank 0 has welcomed them, so removing it now is enough).
        (paths.root / "dist.json").unlink(missing_ok=True)
        try:
            coordinator = Coordinator(
                cfg,
                run=paths.name,
                prompts=build_prompts(cfg),
                save_checkpoint=checkpoint.coordinator_writer(
                    paths.checkpoints, cfg.train.keep_checkpoints
                ),
                vocab_size=vocab_size(cfg),
                eval_prompts=build_eval_prompts(cfg),
            )
            resume = _resume(coordinator, paths)
        except Exception as exc:
            # Tell the other ranks (they wait for control.json) and `reflow status`.
            reason = f"rank 0 could not start: {type(exc).__name__}: {exc}"
            log.error("%s", reason)
            write_json_atomic(paths.control, {"failed": reason, "attempt": attempt})
            write_json_atomic(
                paths.status,
                {
                    "run": paths.name,
                    "state": "FAILED",
                    "reason": reason,
                    "workers": [],
                    "layout": {},
                },
            )
            raise RunFailed(reason) from None
        server = ControlServer(
            coordinator,
            paths,
            load_keypair(paths.keys, SERVER),
            load_keypair(paths.keys, CLIENT).public,
            bind_host=bind,
            advertise_host=advertise,
            publish={"attempt": attempt, "resume": resume},
        )
        server.start()
    worker = HybridWorker(
        rank=info.rank,
        world_size=info.world_size,
        paths=paths,
        cfg=cfg,
        make_sides=lambda collective: build_sides(cfg, info.rank, paths, collective),
        make_collective=lambda: join_collective(cfg, info, paths, bind, advertise),
        node=info.node,
        on_stop_signal=server.request_stop if server is not None else None,
        attempt=attempt,
    )
    worker.install_signal_handlers()
    failure: str | None = None
    try:
        reason = worker.run()
    except WorkerError as exc:
        log.error("%s", exc)
        if server is None:
            raise RunFailed(str(exc)) from None
        server.fail(str(exc))  # rank 0's own side failed (e.g. a collective with a dead rank)
        reason = failure = str(exc)
    if server is not None:
        if not server.join(cfg.control.stop_grace_s + 5):
            log.warning(
                "rank 0's control thread did not end within %.0f s (control.stop_grace_s + 5);"
                " leaving without it",
                cfg.control.stop_grace_s + 5,
            )
        state, why = server.coordinator.state, server.coordinator.reason
        log.info("run ended %s: %s", state, why)
        if state == "FAILED":
            note = _maybe_restart(server.coordinator, cfg, paths)
            if note:
                server.amend_reason(note)
            raise RunFailed(why + note)
        if failure is not None:
            raise RunFailed(failure)
        if worker.preempted and state == "STOPPED":
            _requeue(worker.preempt_handler)
    return reason


def _maybe_restart(coordinator: Coordinator, cfg: Config, paths: RunPaths) -> str:
    """A run that failed mid-training starts again from its last checkpoint, up to
    ``control.max_restarts`` times; the text is added to the failure reason."""
    if not coordinator.life.failed_while_training or cfg.control.max_restarts == 0:
        return ""
    done = restarts_so_far(paths, os.environ)
    if done >= cfg.control.max_restarts:
        return f" (no restart: {done} of {cfg.control.max_restarts} used)"
    info, _ = checkpoint.latest_valid(paths.checkpoints)
    if info is None:
        return " (no restart: no checkpoint yet)"
    try:
        how = restart_job(paths, os.environ)
    except Exception as exc:  # say why and fail as before
        log.exception("restart failed")
        return f" (restart failed: {type(exc).__name__}: {exc})"
    note = f"; restart {done + 1} of {cfg.control.max_restarts} from {info.name}: {how}"
    log.warning("run failed: %s%s", coordinator.reason, note)
    return note


class RankMain:
    """What submitit runs on every task. ``checkpoint`` is submitit's hook, called on rank 0
    when Slurm warns of preemption or the time limit (USR2): the run has saved its
    checkpoint by then, so the requeued job is the same call, and rank 0 resumes from the
    newest checkpoint in the run folder."""

    def __call__(self, run_root: str) -> str:
        return rank_main(run_root)

    def checkpoint(self, run_root: str):
        import submitit

        return submitit.helpers.DelayedSubmission(self, run_root)


def _requeue(handler: object) -> None:
    """After a preempted run stopped with its checkpoint: submitit's USR2 handler calls
    :meth:`RankMain.checkpoint` and requeues the job (``scontrol requeue``), then exits."""
    if os.environ.get("SUBMITIT_EXECUTOR") != "slurm" or not callable(handler):
        log.info("preempted outside Slurm: stopped with a checkpoint, not requeued")
        return
    log.info("preempted: requeueing the job through submitit")
    handler(signal.SIGUSR2, None)


def _resume(coordinator: Coordinator, paths: RunPaths) -> str | None:
    """Continue from the newest checkpoint that verifies (a resumed or requeued run);
    corrupt or partial ones are skipped with a line in the log. None: a fresh start."""
    info, rejected = checkpoint.latest_valid(paths.checkpoints)
    for line in rejected:
        log.warning("checkpoint rejected: %s", line)
    if info is None:
        return None
    coordinator.load_state_dict(checkpoint.read_coordinator_state(info), source=info.name)
    assert coordinator.life.resumed is not None
    write_json_atomic(
        paths.root / f"resumed-{coordinator.life.attempt}.json",
        {**coordinator.life.resumed, "rejected": rejected},
    )
    log.info(
        "resuming from %s: step %d, policy v%d, %d samples in the buffer%s",
        info.name,
        info.step,
        info.policy_version,
        len(coordinator.life.resumed["buffer"]["samples"]),
        f" ({len(rejected)} newer checkpoint(s) rejected)" if rejected else "",
    )
    return info.name


def torch_endpoint(environ: Mapping[str, str], advertise: str) -> tuple[str, int] | None:
    """The process group's address from submitit's TorchDistributedEnvironment on Slurm:
    the job's first node (rank 0's) and a port from the job id (``MASTER_PORT`` overrides).

    None for a local run without ``MASTER_PORT``, and outside submitit: rank 0 then binds a
    free port and publishes it in dist.json, which every rank on this host reads. A port
    derived from the job id lies in 20000-60000, across Linux's ephemeral range, so on a busy
    host it can be some other socket's already (a resumed run failed to start on one: CI)."""
    import submitit

    on_slurm = environ.get("SUBMITIT_EXECUTOR") == "slurm"
    if not on_slurm and "MASTER_PORT" not in environ:
        return None
    try:
        env = submitit.helpers.TorchDistributedEnvironment()
    except RuntimeError:
        return None
    return (env.master_addr if on_slurm else advertise), env.master_port


def join_collective(
    cfg: Config, info: RankInfo, paths: RunPaths, bind: str, advertise: str
) -> Collective | None:
    """The run's torch.distributed group, for engines that broadcast weights and state."""
    if not needs_collective(cfg):
        return None
    from runtime.rank.collective import Collective  # imports torch: only ranks that need it

    if bind == "127.0.0.1":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # a local run stays on loopback
    return Collective.join(
        rank=info.rank,
        world_size=info.world_size,
        rendezvous=paths.root / "dist.json",
        endpoint=torch_endpoint(os.environ, advertise),
        bind_host=bind,
        advertise_host=advertise,
        # On GPU nodes CUDA tensors go over NCCL and CPU ones (headers) over gloo.
        backend="cpu:gloo,cuda:nccl" if cfg.resources.device == "cuda" else "gloo",
        bucket_bytes=int(cfg.engine.weight_bucket_mb * 2**20),
        timeout_s=cfg.control.collective_timeout_s,
        trainer_group_size=cfg.resources.trainer_gpus_per_replica,
        rollout_group_size=cfg.resources.rollout_gpus_per_replica,
        peer_timeout_s=cfg.control.peer_wait_s,
    )
