"""What tests share: the repository's paths, the real CLI in a subprocess, status polling.

Fixtures and the tier markers stay in ``conftest.py``; everything a test imports by name
lives here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# The public datasets live next to the repository, never in it.
needs_shared_data = pytest.mark.skipif(
    not SHARED_DATA.is_dir(), reason=f"{SHARED_DATA} is absent (the shared public datasets)"
)


def reflow(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (the environment, REFLOW_RUNS_DIR included, passes)."""
    done = subprocess.run(
        [sys.executable, "-m", "reflow_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"reflow {' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


def launch_recipe_text(tmp_path: Path, text: str, runs_dir: Path) -> tuple[Path, str]:
    """Write a recipe, ``reflow launch`` it locally (returns once the ranks are up); the
    run's folder and name."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    reflow("launch", str(recipe), "--local", check=True)
    run_dir = next(runs_dir.iterdir())
    return run_dir, run_dir.name


def status_json(run: str) -> dict:
    return json.loads(reflow("status", run, "--json", check=True).stdout)


def wait_for_status(run: str, predicate, timeout: float = 120) -> dict:
    """Poll ``reflow status --json`` until ``predicate`` holds (generous: VMs are slow)."""
    deadline = time.monotonic() + timeout
    while True:
        s = status_json(run)
        if predicate(s):
            return s
        assert time.monotonic() < deadline, f"timed out; last status {s}"
        time.sleep(0.25)
