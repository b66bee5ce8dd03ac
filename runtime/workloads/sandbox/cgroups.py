"""A memory + pids cgroup per sandboxed run: one limit for all of a program's processes.

RLIMIT_AS is per process, so 16 processes may hold 16 times it, and pages of a tmpfs or
of shared memory (``/dev/shm``, ``memfd_create``, SysV shm) count against no rlimit at
all: written, not mapped, they are not address space. A memory cgroup charges all of
them to the program (tmpfs and shared-memory pages go to the writer's cgroup) and its
OOM killer stops the program at the limit; a pids cgroup caps its processes and threads
whatever uid they run as. Each run gets its own cgroup, named after its uid slot (a slot
is held by one run at a time, machine-wide), joined by the launch's first process before
it execs anything, and removed after everything in it was killed.

Layouts, tried in this order:

- cgroup v2 with ``memory`` and ``pids`` in ``cgroup.controllers`` (``/sys/fs/cgroup``
  or a hybrid's ``/sys/fs/cgroup/unified``): ``reflow-sandbox/<run>`` with
  ``memory.max``, ``memory.swap.max``, ``pids.max``. Not exercised on the machines this
  was written on (their v2 hierarchy offers only ``hugetlb``).
- cgroup v1 ``memory`` and ``pids`` hierarchies: ``<ctrl>/reflow-sandbox/<run>`` with
  ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``, so swap is no way
  around it), ``pids.max``.

Without either (not root, a read-only ``/sys/fs/cgroup``) :func:`detect` says why, and
the sandbox falls back to rlimits alone, loudly.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
PARENT = "reflow-sandbox"

# The first process of a launch joins the run's cgroups, then becomes the rest of the
# command. A shell, not Popen's preexec_fn: preexec_fn may deadlock in a threaded parent
# (sandboxed runs start from several threads at once). Whether it joined is read from the
# cgroups afterwards (:meth:`RunCgroup.never_joined`), not from anything the program can
# write.
_JOIN = 'while [ "$1" != -- ]; do echo $$ >"$1" || exit 125; shift; done; shift; exec "$@"'

_names = itertools.count()


@dataclass(frozen=True)
class Layout:
    version: int  # 1 or 2
    memory: Path  # the folder the runs' memory cgroups go in (the same as pids on v2)
    pids: Path


def detect(root: Path = ROOT) -> tuple[Layout | None, str]:
    """The usable layout, or None and why not."""
    if os.geteuid() != 0:
        return None, "not root"
    reasons = []
    for v2 in (root, root / "unified"):
        controllers = _read(v2 / "cgroup.controllers").split()
        if not controllers:
            continue
        if {"memory", "pids"} <= set(controllers):
            try:
                return _setup_v2(v2), ""
            except OSError as exc:
                reasons.append(f"cgroup v2 at {v2}: {exc.strerror or exc}")
        else:
            reasons.append(f"cgroup v2 at {v2} offers only {' '.join(controllers)}")
    memory, pids = root / "memory", root / "pids"
    if (memory / "cgroup.procs").exists() and (pids / "cgroup.procs").exists():
        try:
            for ctrl in (memory, pids):
                (ctrl / PARENT).mkdir(exist_ok=True)
            return Layout(1, memory / PARENT, pids / PARENT), ""
        except OSError as exc:
            reasons.append(f"cgroup v1 at {root}: {exc.strerror or exc}")
    else:
        reasons.append(f"no cgroup v1 memory and pids hierarchies under {root}")
    return None, "; ".join(reasons)


def _setup_v2(root: Path) -> Layout:
    # Controllers reach a child only when enabled in its parent's subtree_control; the
    # parent must hold no process itself (v2's no-internal-process rule), which holds for
    # the hierarchy's root and for our own folder.
    (root / "cgroup.subtree_control").write_text("+memory +pids")
    parent = root / PARENT
    parent.mkdir(exist_ok=True)
    (parent / "cgroup.subtree_control").write_text("+memory +pids")
    return Layout(2, parent, parent)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _number(path: Path) -> int:
    text = _read(path).strip()
    return int(text) if text.isdigit() else -1  # -1: not kept here


def _counter(text: str, key: str) -> int:
    """``key N`` from a flat-keyed file (memory.oom_control, memory.events)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


class RunCgroup:
    """The cgroup(s) of one run: created with its limits, joined by the launch, then
    emptied and removed by :meth:`close`."""

    def __init__(self, layout: Layout, name: str, memory_bytes: int, max_pids: int) -> None:
        self.layout = layout
        dirs = [layout.memory / name]
        if layout.pids != layout.memory:
            dirs.append(layout.pids / name)
        self.dirs = dirs
        for d in dirs:
            if d.exists():  # left by a worker that died mid-run: its slot is ours now
                _empty(d)
                _rmdir(d)
            d.mkdir(exist_ok=True)  # exists still only if a removal failed: reuse it
        try:
            mem = dirs[0]
            if layout.version == 2:
                (mem / "memory.max").write_text(str(memory_bytes))
                if (mem / "memory.swap.max").exists():
                    (mem / "memory.swap.max").write_text("0")
                (mem / "pids.max").write_text(str(max_pids))
            else:
                (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
                # memsw >= limit is required; equal means no swap beyond the limit.
                if (mem / "memory.memsw.limit_in_bytes").exists():
                    (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                (dirs[1] / "pids.max").write_text(str(max_pids))
        except OSError:
            self.close()
            raise
        self._oom_before = self._oom_counter()  # nonzero only in a reused folder

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` started from inside the cgroup (its first process joins, then execs)."""
        procs = [str(d / "cgroup.procs") for d in self.dirs]
        return ["/bin/sh", "-c", _JOIN, "sh", *procs, "--", *argv]

    def never_joined(self) -> bool:
        """True when the launch never entered one of the cgroups (then it did not run the
        program either): a peak of 0 processes or bytes. False where no peak is kept."""
        peaks = [self.peak_bytes()] if self.layout.version == 1 else []
        peaks += [_number(d / "pids.peak") for d in self.dirs if (d / "pids.peak").exists()]
        if self.layout.version == 2 and (self.dirs[0] / "memory.peak").exists():
            peaks.append(self.peak_bytes())
        return 0 in peaks

    def oom_kills(self) -> int:
        """Processes of the run the kernel killed at the memory limit."""
        return self._oom_counter() - self._oom_before

    def _oom_counter(self) -> int:
        mem = self.dirs[0]
        if self.layout.version == 2:
            return _counter(_read(mem / "memory.events"), "oom_kill")
        return _counter(_read(mem / "memory.oom_control"), "oom_kill")

    def peak_bytes(self) -> int:
        mem = self.dirs[0]
        return _number(
            mem / ("memory.peak" if self.layout.version == 2 else "memory.max_usage_in_bytes")
        )

    def close(self) -> None:
        """Kill every process left in the run's cgroup(s), then remove them."""
        for d in self.dirs:
            _empty(d)
        for d in self.dirs:
            _rmdir(d)


def run_name(uid: int | None) -> str:
    # A uid slot is one run's at a time, machine-wide; without one, this process's own.
    return f"uid-{uid}" if uid is not None else f"pid-{os.getpid()}-{next(_names)}"


def _pids(d: Path) -> list[int]:
    return [int(p) for p in _read(d / "cgroup.procs").split() if p.isdigit()]


def _empty(d: Path) -> None:
    if (d / "cgroup.kill").exists():  # v2, Linux 5.14+: one write kills them all
        with contextlib.suppress(OSError):
            (d / "cgroup.kill").write_text("1")
    # A forking program may add processes while they are killed; the pids limit bounds
    # how many, so a few rounds empty it.
    for _ in range(500):
        pids = _pids(d)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.002)


def _rmdir(d: Path) -> None:
    # rmdir fails with EBUSY while a killed process is still exiting.
    for _ in range(500):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.002)
    # Not the program's fault, and the slot's next run removes it (see RunCgroup).
    log.warning("sandbox: cgroup %s still busy after its processes were killed", d)
