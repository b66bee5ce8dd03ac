"""Processes a rank starts (vLLM's engine core and its workers are such processes) end when
the rank is killed with SIGKILL: runtime/rank/orphans.py, with real processes and signals."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.integration

PARENT = """
import multiprocessing, os, sys, time
from runtime.rank.orphans import guard_process_group

def grandchild():
    time.sleep(600)

def child():
    g = multiprocessing.get_context("fork").Process(target=grandchild)
    g.start()
    print(os.getpid(), g.pid, flush=True)
    time.sleep(600)

if __name__ == "__main__":
    if sys.argv[1] == "guarded":
        guard_process_group()
    # spawn, as vLLM starts its engine core here
    p = multiprocessing.get_context("spawn").Process(target=child)
    p.start()
    time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen, int, int]:
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    child, grandchild = map(int, proc.stdout.readline().split())
    return proc, child, grandchild


def wait_dead(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if alive(p)]


def test_children_of_a_killed_process_end_with_it(tmp_path):
    proc, child, grandchild = start(tmp_path, "guarded")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        # the watcher sees the parent gone within a poll and ends its process group
        assert wait_dead([child, grandchild], 30) == []
    finally:
        for pid in (child, grandchild):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_without_the_guard_they_are_left_behind(tmp_path):
    proc, child, grandchild = start(tmp_path, "plain")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(3)
        assert alive(child) and alive(grandchild)  # what the guard is for
    finally:
        for pid in (child, grandchild):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
