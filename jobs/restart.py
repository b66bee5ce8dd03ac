"""``python -m jobs.restart RUN_DIR``: submit a failed local run again once its job is gone.

Spawned (detached) by rank 0 of a run that failed mid-training with restarts left
(runtime/rank/auto_restart.py). It waits for the old job's processes to end, then does what
``reflow launch --resume`` does.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from jobs.errors import UserError
from jobs.launch import job_alive, resume
from runtime.config.recipe import load_recipe
from runtime.store.run_dir import RunPaths


def main(run_dir: str, wait_s: float = 600.0) -> int:
    paths = RunPaths(Path(run_dir))
    cfg = load_recipe(paths.config)
    deadline = time.monotonic() + wait_s
    while job_alive(paths):
        if time.monotonic() > deadline:
            print(f"restart: the old job of {paths.name} is still alive after {wait_s:.0f} s")
            return 1
        time.sleep(0.5)
    try:
        sub, info = resume(paths, cfg, "local")
    except UserError as exc:
        print(f"restart: {exc}")
        return 1
    print(f"restart: {paths.name} resumed from {info.name} as local job {sub.job_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
