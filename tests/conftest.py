"""Shared fixtures. Tests are marked by folder: tests/unit -> unit, tests/integration ->
integration (plus their own slurm/gpu marks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts[0] in ("unit", "integration"):
            item.add_marker(getattr(pytest.mark, parts[0]))


@pytest.fixture
def runs_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "runs"
    monkeypatch.setenv("REFLOW_RUNS_DIR", str(d))
    return d


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
