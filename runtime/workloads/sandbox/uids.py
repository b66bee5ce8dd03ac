"""Unprivileged uids for sandboxed programs, one per concurrent run.

RLIMIT_NPROC counts the processes of a uid, machine-wide. If every sandbox ran as the
same uid, a fork bomb in one would make ``fork`` fail in all the others (a correct
program scored wrong), so each run claims its own uid from a pool. Claims are ``flock``s
on files in a root-only folder, so they hold across threads and processes (several
workers on one node) and vanish when a process dies.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_DIR = Path(os.environ.get("REFLOW_SANDBOX_LOCKS", "/run/reflow-sandbox"))


class UidPool:
    def __init__(self, base: int, slots: int, lock_dir: Path = LOCK_DIR) -> None:
        self.base, self.slots, self.lock_dir = base, slots, lock_dir
        self._turn = itertools.count()

    @contextmanager
    def claim(self, timeout_s: float = 60.0) -> Iterator[int]:
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        # Rotate through the pool (and spread processes over it): a uid just released may
        # still have processes being torn down.
        start = (os.getpid() + next(self._turn)) % self.slots
        while True:
            for i in range(self.slots):
                slot = (start + i) % self.slots
                fd = os.open(self.lock_dir / f"uid-{self.base + slot}", os.O_CREAT | os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                try:
                    yield self.base + slot
                finally:
                    os.close(fd)  # releases the lock
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"sandbox: all {self.slots} uids busy for {timeout_s:.0f} s")
            time.sleep(0.01)
