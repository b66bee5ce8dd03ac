"""Fixtures and tier markers. Tests are marked by folder: tests/unit -> unit,
tests/integration and tests/faults -> integration, tests/slurm -> slurm, tests/gpu -> gpu.
Helpers that tests import by name live in :mod:`tests.helpers`."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
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
def runs_dir(tmp_path, monkeypatch) -> Iterator[Path]:
    """The runs folder of one test; at its end, any rank of a run in it still alive is
    killed. A test that fails before it stops its run (an eval test's run has no step
    budget) would leave the ranks and their engines running into the next tests, which
    then fail for want of CPU: seen on this 2-core VM when a suite was cut short."""
    d = tmp_path / "runs"
    monkeypatch.setenv("REFLOW_RUNS_DIR", str(d))
    yield d
    kill_leftover_ranks(d)


def kill_leftover_ranks(runs: Path) -> list[int]:
    """SIGKILL every process whose command line names a folder under ``runs`` (a local
    run's submitit launcher and ranks do; each rank's orphan guard then ends its engine
    processes). The pids killed."""
    marker = str(runs) + os.sep
    killed = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone, or not ours to read
        if marker in cmdline:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
                killed.append(int(proc.name))
            except OSError:  # it exited between reading its cmdline and the kill
                pass
    return killed
