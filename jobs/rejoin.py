"""``reflow rejoin RUN --rank K``: start a lost rank of a running local run again.

The new process is rank ``K`` of the same run (``python -m jobs.rejoin RUN_DIR K``, detached,
its output in ``logs/rank<K>.rejoin.log``): it registers with rank 0, which welcomes it as
``"gone"`` in the current layout epoch, starts its engines, joins the torch.distributed world
again from ``dist.json``, and takes its role back at a later epoch: a rollout rank at the
next, with the current weights; a trainer rank once every rank of its replica group is back,
between two steps, with the trainer state of the replicas that stayed
(runtime/control/registration.py, runtime/engines/torch/shard_handoff.py). On Slurm a step
relaunched on the allocation with the same environment does the same; that is not tested
here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jobs.errors import UserError
from jobs.launch import read_status
from runtime.config.recipe import load_recipe
from runtime.store.run_dir import RunPaths, read_json


def start(paths: RunPaths, rank: int) -> int:
    """Start rank ``rank`` of the run at ``paths`` again; returns the new process's pid.
    Refused (one line) unless the run is running and the rank is among its lost ones."""
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
    job, _, restarts = attempt.rpartition(".")
    env = {
        **os.environ,
        "REFLOW_RANK": str(rank),
        "REFLOW_WORLD_SIZE": str(cfg.world_size),
        "REFLOW_ATTEMPT": job,  # the control file's attempt, which the rank must match
        "SLURM_RESTART_COUNT": restarts or "0",
    }
    env.pop("SUBMITIT_EXECUTOR", None)
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(repo)
    with (paths.logs / f"rank{rank}.rejoin.log").open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobs.rejoin", str(paths.root), str(rank)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not the CLI's: it lives as long as the run
            cwd=repo,
            env=env,
        )
    return proc.pid


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
