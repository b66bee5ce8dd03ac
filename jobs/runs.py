"""Creating run folders and finding them again by name, path or recency."""

from __future__ import annotations

import os
import time
from pathlib import Path

from jobs.errors import UserError
from runtime.config.recipe import dump_config
from runtime.config.schema import Config
from runtime.store.run_dir import RunPaths
from runtime.transport.auth import create_run_keys


def runs_dir(cfg: Config | None = None) -> Path:
    env = os.environ.get("REFLOW_RUNS_DIR")
    if env:
        return Path(env)
    return Path(cfg.logging.runs_dir) if cfg is not None else Path("runs")


def create_run(cfg: Config, name: str | None = None) -> RunPaths:
    """A fresh run folder with the resolved config and the run's CURVE keys."""
    base = runs_dir(cfg)
    base.mkdir(parents=True, exist_ok=True)
    stem = f"{name or cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    root, n = base / stem, 1
    while True:
        try:
            root.mkdir()
            break
        except FileExistsError:
            n += 1
            root = base / f"{stem}-{n}"
    paths = RunPaths(root.resolve())
    dump_config(cfg, paths.config)
    create_run_keys(paths.keys)
    paths.logs.mkdir()
    paths.checkpoints.mkdir()
    return paths


def find_run(run: str | None) -> RunPaths:
    """A run folder by path, by name under the runs dir, or the newest one."""
    if run:
        candidate = Path(run)
        for root in (candidate, runs_dir() / run):
            if (root / "config.yaml").is_file():
                return RunPaths(root.resolve())
        raise UserError(f"{run}: no such run (looked in . and {runs_dir()})")
    base = runs_dir()
    runs = [d for d in base.iterdir() if (d / "config.yaml").is_file()] if base.is_dir() else []
    if not runs:
        raise UserError(f"{base}: no runs yet (start one with `reflow launch RECIPE`)")
    return RunPaths(max(runs, key=lambda d: (d / "config.yaml").stat().st_mtime).resolve())
