"""Unprivileged uids for sandboxed programs, one per concurrent process.

RLIMIT_NPROC counts the processes of a uid, machine-wide. If every sandbox ran as the
same uid, a fork bomb in one would make ``fork`` fail in all the others (a correct
program scored wrong), so each run claims its own uid from a pool. Claims are ``flock``s
on files in a root-only folder, so they hold across threads and processes (several
workers on one node) and vanish when a process dies.

A grading that needs two processes at once (the program's and the tests') claims both in
one go, all or none: claiming them one after the other let 32 gradings on a pool of 64
each hold one uid and wait for a second until the claim timed out.

The default range starts at 0x78000000 (2,013,265,920): inside what systemd's uid table
leaves unused (1,879,048,192-2,147,352,575, below its foreign range), above SSSD's default
id-mapping range (to 2,000,200,000) and far above subordinate-uid ranges, so a pool of
thousands meets no account; :func:`accounts_in` names any it would.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import pwd
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

LOCK_DIR = Path(os.environ.get("REFLOW_SANDBOX_LOCKS", "/run/reflow-sandbox"))
DEFAULT_UID_BASE = 0x78000000


class UidPool:
    def __init__(self, base: int, slots: int, lock_dir: Path = LOCK_DIR) -> None:
        self.base, self.slots, self.lock_dir = base, slots, lock_dir
        self._turn = itertools.count()
        self.waits = 0  # claims of this process that found too few uids free at first
        self._waits_lock = threading.Lock()

    @contextmanager
    def claim(self, count: int = 1, timeout_s: float = 60.0) -> Iterator[tuple[int, ...]]:
        """``count`` uids of the pool, all held until the block ends; waits up to
        ``timeout_s`` for that many to be free at once, never holding some while waiting
        for the rest."""
        if not 1 <= count <= self.slots:
            raise ValueError(f"sandbox: {count} uids asked of a pool of {self.slots}")
        self.lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        waited = False
        while True:
            with ExitStack() as held:
                uids = self._try_claim(count, held)
                if uids is not None:
                    yield uids
                    return
            # fewer than ``count`` free: the ones taken went back with the ExitStack
            if waited is False:
                waited = True
                with self._waits_lock:
                    self.waits += 1
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"sandbox: {count} of {self.slots} uids not free at once for "
                    f"{timeout_s:.0f} s (sandbox.uid_slots)"
                )
            time.sleep(0.01)

    def _try_claim(self, count: int, held: ExitStack) -> tuple[int, ...] | None:
        # Rotate through the pool (and spread processes over it): a uid just released may
        # still have processes being torn down.
        start = (os.getpid() + next(self._turn) * count) % self.slots
        got: list[int] = []
        for i in range(self.slots):
            slot = (start + i) % self.slots
            fd = os.open(self.lock_dir / f"uid-{self.base + slot}", os.O_CREAT | os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.callback(os.close, fd)  # closing releases the lock
            got.append(self.base + slot)
            if len(got) == count:
                return tuple(got)
        return None


def accounts_in(base: int, slots: int) -> list[str]:
    """The user database's accounts whose uid lies in ``[base, base + slots)``, as
    ``name (uid)``: the pool's runs would share (and kill) those users' processes. Only
    what the database enumerates: a directory service that does not enumerate is not
    asked uid by uid (thousands of lookups)."""
    end = base + slots
    return [f"{u.pw_name} ({u.pw_uid})" for u in pwd.getpwall() if base <= u.pw_uid < end]
