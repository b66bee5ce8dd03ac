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
import stat
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

LOCK_DIR = Path(os.environ.get("REFLOW_SANDBOX_LOCKS", "/run/reflow-sandbox"))
DEFAULT_UID_BASE = 0x78000000


class NodeSlots:
    """``slots`` numbered places that every process of a node shares: ``flock``s on the
    files ``<kind>-<number>`` in ``lock_dir``, numbered from ``first``. ``setting`` names the
    recipe field that sizes them (for the error when none frees up in time)."""

    def __init__(self, kind: str, first: int, slots: int, lock_dir: Path, setting: str) -> None:
        self.kind, self.first, self.slots = kind, first, slots
        self.lock_dir, self.setting = lock_dir, setting
        self._turn = itertools.count()
        self._folder_checked = False
        self.waits = 0  # claims of this process that found too few free at first
        self._waits_lock = threading.Lock()
        # The threads of this process that wait, first come first served: only the first
        # polls the locks, the others sleep (256 threads polling every 10 ms took the CPU
        # the programs needed, and the luckiest kept winning).
        self._queue: deque[threading.Event] = deque()
        self._queue_lock = threading.Lock()

    @contextmanager
    def claim(self, count: int = 1, timeout_s: float = 60.0) -> Iterator[tuple[int, ...]]:
        """``count`` slots, all held until the block ends; waits up to ``timeout_s`` for
        that many to be free at once, never holding some while waiting for the rest."""
        if not 1 <= count <= self.slots:
            raise ValueError(f"sandbox: {count} {self.kind} slots asked of {self.slots}")
        if not self._folder_checked:
            own_lock_folder(self.lock_dir)
            self._folder_checked = True
        deadline = time.monotonic() + timeout_s
        with ExitStack() as held:
            with self._queue_lock:
                others_wait = bool(self._queue)
            got = None if others_wait else self._try_claim(count, held)
            if got is None:
                held.close()  # fewer than ``count`` free: the ones taken go back
                with self._waits_lock:
                    self.waits += 1
                got = self._wait_for(count, held, deadline, timeout_s)
            yield got

    def _wait_for(
        self, count: int, held: ExitStack, deadline: float, timeout_s: float
    ) -> tuple[int, ...]:
        turn = threading.Event()
        with self._queue_lock:
            self._queue.append(turn)
            if self._queue[0] is turn:
                turn.set()
        try:
            if not turn.wait(max(0.0, deadline - time.monotonic())):
                raise self._timed_out(count, timeout_s)
            pause = 0.002
            while True:
                got = self._try_claim(count, held)
                if got is not None:
                    return got
                held.close()
                if time.monotonic() > deadline:
                    raise self._timed_out(count, timeout_s)
                time.sleep(pause)
                pause = min(0.02, pause * 1.5)
        finally:
            with self._queue_lock:
                first = self._queue[0] is turn
                self._queue.remove(turn)
                if first and self._queue:
                    self._queue[0].set()  # the next one's turn

    def _timed_out(self, count: int, timeout_s: float) -> TimeoutError:
        return TimeoutError(
            f"sandbox: {count} of {self.slots} {self.kind} slots not free at once for "
            f"{timeout_s:.0f} s ({self.setting})"
        )

    def _try_claim(self, count: int, held: ExitStack) -> tuple[int, ...] | None:
        # Rotate through the slots (and spread processes over them): a uid just released
        # may still have processes being torn down.
        start = (os.getpid() + next(self._turn) * count) % self.slots
        got: list[int] = []
        for i in range(self.slots):
            number = self.first + (start + i) % self.slots
            fd = os.open(self.lock_dir / f"{self.kind}-{number}", os.O_CREAT | os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.callback(os.close, fd)  # closing releases the lock
            got.append(number)
            if len(got) == count:
                return tuple(got)
        return None


def own_lock_folder(path: Path) -> None:
    """Make ``path`` this user's own folder, or refuse one that is not: a folder another
    user made (a non-root worker's lives in the shared temp folder, its name known) could
    be filled with held locks, so that no grading ever gets a slot."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(
            f"sandbox: lock folder {path} is not this user's own (owner uid {st.st_uid}, "
            f"mode {stat.S_IMODE(st.st_mode):o}): remove it, or set REFLOW_SANDBOX_LOCKS"
        )


class UidPool(NodeSlots):
    """The node's uids for sandboxed processes: ``slots`` of them from ``base``."""

    def __init__(self, base: int, slots: int, lock_dir: Path = LOCK_DIR) -> None:
        super().__init__("uid", base, slots, lock_dir, "sandbox.uid_slots")


def accounts_in(base: int, slots: int) -> list[str]:
    """The user database's accounts whose uid lies in ``[base, base + slots)``, as
    ``name (uid)``: the pool's runs would share (and kill) those users' processes. Only
    what the database enumerates: a directory service that does not enumerate is not
    asked uid by uid (thousands of lookups)."""
    end = base + slots
    return [f"{u.pw_name} ({u.pw_uid})" for u in pwd.getpwall() if base <= u.pw_uid < end]
