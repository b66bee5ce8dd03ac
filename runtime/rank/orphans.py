"""What a rank starts ends when the rank does, even after ``kill -9``.

vLLM's engine core runs in a process the rank starts (multiprocessing, spawn method) and
that starts the engine's workers in turn. A rank killed with SIGKILL cannot shut its
engine down, and a local run has no Slurm cgroup to collect what is left: the engine
core, reparented to init, would hold its memory for good (found after a test that kills
a rank: the engine core and its worker, ~1.3 GB resident, still there half an hour later).

:func:`guard_process_group` makes the rank the leader of its own process group (its
engine processes inherit the group) and starts a small watcher in another session. The
watcher polls the rank once every ``POLL_S``; once the rank is gone it sends SIGTERM to
the group (vLLM's engine core stops its workers), and SIGKILL to what is left after
``GRACE_S``. Processes started in a new session (the sandbox's, the local restart
helper, which must outlive the rank) are not in the group.

Local runs only (runtime/entry.py): on Slurm the job's process tracking collects what a
rank leaves, and a rank that changed its process group could escape ``proctrack/pgid``.

A group id stays reserved while the group has members, and the watcher acts within a
poll of the rank's end, so it cannot signal a stranger's group unless that exact id is
reused within that fraction of a second, after every member has gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.5
GRACE_S = 10.0


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks, None once it is gone or a zombie (the
    pair pid + start time names one process, pid reuse included)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]


def guard_process_group() -> subprocess.Popen | None:
    """Lead a process group of our own and start its watcher; None where /proc is
    missing (not Linux): nothing is guarded there."""
    me = os.getpid()
    started = _start_time(me)
    if started is None:
        return None
    if os.getpgid(0) != me:
        os.setpgid(0, 0)
    repo = Path(__file__).resolve().parents[2]
    return subprocess.Popen(
        [sys.executable, "-m", "runtime.rank.orphans", str(me), started],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # outside the group it ends, and outlives the rank
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member we may not signal is still a member
        pass
    return True


def watch(pid: int, started: str) -> None:
    """Wait for process ``pid`` (started at ``started``) to end, then end its group."""
    while _start_time(pid) == started:
        time.sleep(POLL_S)
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:  # nothing left in the group
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(POLL_S)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2])
