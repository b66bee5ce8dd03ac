"""Fixtures and tier markers. Tests are marked by folder: tests/unit -> unit,
tests/integration and tests/faults -> integration, tests/slurm -> slurm, tests/gpu -> gpu.
Helpers that tests import by name live in :mod:`tests.helpers`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REPO


def pytest_collection_modifyitems(config, items):
    for item in items:
        parts = Path(str(item.fspath)).relative_to(REPO / "tests").parts
        if parts[0] in ("unit", "integration", "slurm", "gpu"):
            item.add_marker(getattr(pytest.mark, parts[0]))
        elif parts[0] == "faults":  # fault injection: real processes and sockets
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def runs_dir(tmp_path, monkeypatch) -> Path:
    d = tmp_path / "runs"
    monkeypatch.setenv("REFLOW_RUNS_DIR", str(d))
    return d
