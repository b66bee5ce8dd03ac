"""Run one untrusted Python program under the sandbox's limits and return what it did.

The caller (a reward, an agent's tool call, ``reflow reward code``) hands in source and
stdin; :class:`Sandbox` writes the source to a fresh read-only folder, claims a uid of its
own (when root) and a memory + pids cgroup for it (where one can be made), starts the
isolation layer inside that cgroup, feeds stdin and reads at most ``output_bytes`` back
(more kills the program: a reader that buffers everything is a memory bomb of its own),
and on the wall-clock limit kills the whole process tree. Every process still in the
run's cgroup or owned by its uid is killed afterwards and the cgroup removed, so nothing a
program forked outlives its run even where it left the process group.

What a sandbox lacks here (no uid switch when not root, no cgroup, no seccomp table for
the machine) is in :attr:`Sandbox.weakened`, each line logged once per process.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import logging
import os
import platform
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from runtime.workloads.sandbox import cgroups, seccomp
from runtime.workloads.sandbox.isolation import ISOLATION, resolve
from runtime.workloads.sandbox.limits import RunResult, SandboxLimits
from runtime.workloads.sandbox.uids import (
    DEFAULT_UID_BASE,
    LOCK_DIR,
    NodeSlots,
    UidPool,
    accounts_in,
)

log = logging.getLogger(__name__)

_logged: set[str] = set()
_logged_lock = threading.Lock()


def _warn_once(line: str) -> None:
    # Every Sandbox of a process (one per settings) would repeat the same lines.
    with _logged_lock:
        if line in _logged:
            return
        _logged.add(line)
    log.warning("%s", line)


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not the program's fault)."""


class Sandbox:
    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        python: str = "/usr/bin/python3",
        uid_base: int = DEFAULT_UID_BASE,
        uid_slots: int = 64,
        running: int | None = None,
        wait_s: float = 120.0,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.isolation = resolve(isolation)
        self.python = python
        self._build = ISOLATION[self.isolation]
        if self.isolation == "bwrap" and not python.startswith("/usr/"):
            # Only /usr is mounted inside; an interpreter elsewhere would not exist there.
            raise SandboxError(f"sandbox.python: {python!r} must be under /usr with bwrap")
        if not os.access(python, os.X_OK):
            raise SandboxError(f"sandbox.python: {python!r} is not an executable file")
        self.uids = UidPool(uid_base, uid_slots) if os.geteuid() == 0 else None
        # Programs running at once on the node, every rank's together: a wall-clock limit
        # is only fair to a program that gets a core (256 gradings on 2 cores failed 52 of
        # 512 HumanEval references on their 6 s limit).
        self.running = NodeSlots(
            "run", 0, running or os.cpu_count() or 1, _lock_dir(), "sandbox.running"
        )
        self.wait_s = wait_s  # for uids and run slots; then the caller gets a TimeoutError
        self._admitted = False
        if self.uids is not None:
            taken = accounts_in(uid_base, uid_slots)
            if taken:
                raise SandboxError(
                    f"sandbox.uid_base: the pool's uids {uid_base}-{uid_base + uid_slots - 1} "
                    f"include accounts ({', '.join(taken[:3])}); move the pool past them"
                )
        self.cgroups, no_cgroup = cgroups.detect()
        self.seccomp = (
            seccomp.build_filter() if self.isolation == "bwrap" and seccomp.supported() else None
        )
        _become_subreaper()
        self.weakened = self._weakened(no_cgroup)
        for line in self.weakened:
            _warn_once(line)

    def _weakened(self, no_cgroup: str) -> list[str]:
        """One line per layer this sandbox lacks, saying what is left."""
        lines = []
        if self.uids is None:
            uid = os.geteuid()
            left = (
                "bwrap still hides the network, host processes and every file but /usr, "
                "under seccomp and per-process rlimits"
                if self.isolation == "bwrap"
                else "with rlimits only they read and write whatever this uid can"
            )
            lines.append(
                f"SANDBOX WEAKENED: not root (uid {uid}), so no uid switch: sandboxed "
                f"programs run as uid {uid}, with no process limit and no memory cgroup; "
                f"{left} (docs/sandbox.md)"
            )
        elif self.cgroups is None:
            lines.append(
                f"SANDBOX WEAKENED: no memory+pids cgroup ({no_cgroup}): memory is limited "
                "per process only (RLIMIT_AS), not for a program's processes and its tmpfs "
                "or shared memory together (docs/sandbox.md)"
            )
        if self.isolation == "bwrap" and self.seccomp is None:
            lines.append(
                f"SANDBOX WEAKENED: no seccomp table for {platform.machine()}: io_uring, "
                "bpf, ptrace, keyctl and the like stay reachable (docs/sandbox.md)"
            )
        return lines

    def _scratch_root(self) -> str | None:
        """Where a run's code and work folders go. With a uid switch the program's uid
        must reach them, but a rank's ``TMPDIR`` lies in its run folder, which is private
        (0700, like the folder above it often is): take the first temp folder whose every
        ancestor other users may pass through. ``None``: the usual temp folder."""
        if self.uids is None:
            return None
        for candidate in (tempfile.gettempdir(), "/tmp", "/var/tmp"):
            if _reachable_by_others(Path(candidate)):
                return candidate
        raise SandboxError(
            "no temp folder another uid can reach for the sandbox (TMPDIR, /tmp, /var/tmp)"
        )

    def run_python(
        self, source: str, stdin: str = "", limits: SandboxLimits | None = None
    ) -> RunResult:
        limits = limits or self.limits
        with self.launched(source, limits) as run:
            deadline = run.start + limits.wall_s
            data = stdin.encode("utf-8", "surrogatepass")
            out, err, why = _pump(run.proc, data, deadline, limits.output_bytes)
            if why is None:
                try:
                    run.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    why = "timeout"
            return run.result(out, err, why)

    @contextlib.contextmanager
    def admitted(self, count: int) -> Iterator[Sandbox]:
        """This sandbox with ``count`` of the node's run slots held (all or none, waiting up
        to ``wait_s``) for the programs a grading runs at once: what it launches inside
        claims none of its own, and its clocks start once it holds them. A grading's
        program and tests take one slot: they run in turn, each waiting on the other."""
        if self._admitted:
            yield self
            return
        with self.running.claim(min(count, self.running.slots), self.wait_s):
            inside = copy.copy(self)
            inside._admitted = True
            yield inside

    @contextlib.contextmanager
    def reserve(self, count: int) -> Iterator[list[int]]:
        """Uids for ``count`` processes that must run at once (a grading's program and
        tests), claimed together: hand the list to each :meth:`launched`, which takes one.
        An empty list without a uid switch."""
        if self.uids is None:
            yield []
            return
        with self.uids.claim(count, self.wait_s) as uids:
            yield list(uids)

    @contextlib.contextmanager
    def launched(
        self, source: str, limits: SandboxLimits, reserved: list[int] | None = None
    ) -> Iterator[Launched]:
        """``source`` started as ``/code/main.py`` under every layer of the sandbox, its
        stdin, stdout and stderr pipes open; on leaving, its process group, its uid's
        processes and its cgroup are killed and its folders removed. Its uid is the next
        of ``reserved`` (from :meth:`reserve`), else one claimed for it alone; it runs in a
        run slot of its own unless the sandbox was :meth:`admitted`."""
        scratch = self._scratch_root()
        with contextlib.ExitStack() as stack:
            if not self._admitted:  # before the uid: every caller claims in this order
                stack.enter_context(self.running.claim(1, self.wait_s))
            code_dir = Path(tempfile.mkdtemp(prefix="reflow-sbx-", dir=scratch))
            stack.callback(shutil.rmtree, code_dir, ignore_errors=True)
            work_dir = Path(tempfile.mkdtemp(prefix="reflow-sbx-work-", dir=scratch))
            stack.callback(shutil.rmtree, work_dir, ignore_errors=True)
            code_dir.chmod(0o755)
            # A lone surrogate in a model's text is written as is (then Python refuses
            # the file, the program's error) rather than raising here.
            (code_dir / "main.py").write_bytes(source.encode("utf-8", "surrogatepass"))
            (code_dir / "main.py").chmod(0o644)
            uid = None
            if self.uids is not None:
                if reserved:
                    uid = reserved.pop()
                else:
                    (uid,) = stack.enter_context(self.uids.claim(1, self.wait_s))
                os.chown(work_dir, uid, uid)
                work_dir.chmod(0o700)
                stack.callback(_kill_uid, uid)
            cg = None
            if self.cgroups is not None:
                try:
                    cg = cgroups.RunCgroup(
                        self.cgroups,
                        cgroups.run_name(uid),
                        limits.group_memory_bytes,
                        limits.max_processes,
                    )
                except OSError as exc:
                    raise SandboxError(f"sandbox: cannot set up the run's cgroup: {exc}") from exc
                stack.callback(cg.close)
            proc, start = self._start(code_dir, work_dir, limits, uid, cg)
            stack.callback(_kill_group, proc)
            yield Launched(proc, start, cg)

    def _start(
        self,
        code_dir: Path,
        work_dir: Path,
        limits: SandboxLimits,
        uid: int | None,
        cg: cgroups.RunCgroup | None,
    ) -> tuple[subprocess.Popen, float]:
        argv = [self.python, "-s", str(code_dir / "main.py")]
        fds: list[int] = []  # passed to the launch, closed here once it started
        try:
            extra: dict[str, int] = {}
            if self.seccomp is not None:  # bwrap only: it loads the filter before the exec
                extra["seccomp_fd"] = _pipe_with(self.seccomp)
                fds.append(extra["seccomp_fd"])
            launch = self._build(argv, str(code_dir), str(work_dir), limits, uid, **extra)
            launch_argv = cg.wrap(launch.argv) if cg is not None else launch.argv
            start = time.monotonic()
            try:
                proc = subprocess.Popen(
                    launch_argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=launch.env,
                    cwd=launch.cwd,
                    start_new_session=True,  # one process group to kill
                    close_fds=True,
                    pass_fds=fds,
                )
            except OSError as exc:
                raise SandboxError(f"sandbox: cannot start {launch_argv[0]!r}: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
        return proc, start


class Launched:
    """A sandboxed process under way (:meth:`Sandbox.launched`)."""

    def __init__(self, proc: subprocess.Popen, start: float, cg: cgroups.RunCgroup | None) -> None:
        self.proc, self.start, self.cg = proc, start, cg

    def result(self, out: bytes, err: bytes, why: str | None) -> RunResult:
        """How the run ended, once its output is read: its process group is killed first
        (a run is over once its caller has what it wanted)."""
        _kill_group(self.proc)
        if self.cg is not None and self.cg.never_joined():
            raise SandboxError(f"sandbox: the launch could not join its cgroup: {_text(err)}")
        code = self.proc.returncode
        wall = time.monotonic() - self.start
        status = why or _status(code)
        # A process the OOM killer took may show as any status (SIGKILL, a parent's
        # error, a parent still waiting at the timeout): the limit is the cause.
        if self.cg is not None and status != "output_limit" and self.cg.oom_kills():
            status = "memory_limit"
        return RunResult(status, code, _text(out), _text(err), wall)


def _pipe_with(data: bytes) -> int:
    """A pipe's read end holding ``data`` (bwrap reads its seccomp program from an fd)."""
    r, w = os.pipe()
    try:
        os.write(w, data)  # far below a pipe's 64 KiB: never blocks
    finally:
        os.close(w)
    return r


def _pump(
    proc: subprocess.Popen, data: bytes, deadline: float, cap: int
) -> tuple[bytes, bytes, str | None]:
    """Feed stdin, collect stdout/stderr until EOF; stop at the deadline or the cap."""
    assert proc.stdin and proc.stdout and proc.stderr
    sel = selectors.DefaultSelector()
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    for stream in bufs:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    offset = 0
    if data:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    why = None
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                why = "timeout"
                break
            for key, _ in sel.select(timeout=min(left, 0.5)):
                stream = key.fileobj
                if stream is proc.stdin:
                    try:
                        offset += os.write(proc.stdin.fileno(), data[offset : offset + 65536])
                    except BlockingIOError:
                        continue
                    except BrokenPipeError:  # the program stopped reading: fine
                        offset = len(data)
                    if offset >= len(data):
                        sel.unregister(proc.stdin)
                        proc.stdin.close()
                    continue
                chunk = os.read(stream.fileno(), 65536)  # type: ignore[union-attr]
                if not chunk:
                    sel.unregister(stream)
                    continue
                bufs[stream] += chunk  # type: ignore[index]
                if len(bufs[proc.stdout]) + len(bufs[proc.stderr]) > cap:
                    why = "output_limit"
                    break
            if why:
                break
    finally:
        sel.close()
        if not proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
    return bytes(bufs[proc.stdout])[:cap], bytes(bufs[proc.stderr])[:cap], why


def _status(code: int | None) -> str:
    if code == 0:
        return "ok"
    if code is None:
        return "timeout"
    # A signal shows as -N from a direct child, as 128+N through bwrap.
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig == signal.SIGXCPU:
        return "cpu_limit"
    if sig == signal.SIGXFSZ:
        return "file_limit"
    if code < 0 or sig in (signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM):
        return "signal"
    return "error"


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait
        log.error("sandbox: process %d survived SIGKILL", proc.pid)


def _reachable_by_others(folder: Path) -> bool:
    """Writable by us, and every folder down to it searchable by any uid."""
    if not (folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)):
        return False
    real = folder.resolve()
    return all(os.stat(part).st_mode & 0o001 for part in (real, *real.parents))


def _become_subreaper() -> None:
    """Orphans of sandboxed runs (bwrap's inner process when the outer one is killed)
    become our children instead of PID 1's: in a container PID 1 may never reap them, and
    each zombie would count against its uid's process limit forever."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


_PR_SET_CHILD_SUBREAPER = 36


def _processes_of(uid: int) -> list[tuple[int, str, int]]:
    """(pid, state, ppid) of every process whose real uid is ``uid``."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as fh:
                fields = dict(
                    line.split(b":", 1) for line in fh.read().splitlines() if b":" in line
                )
            if int(fields[b"Uid"].split()[0]) != uid:
                continue
            out.append(
                (int(entry.name), fields[b"State"].split()[0].decode(), int(fields[b"PPid"]))
            )
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return out


def _lock_dir() -> Path:
    """Where the node's slot locks live: root's folder, shared by every rank; another
    user's own (a non-root worker shares its slots with its own processes only)."""
    if os.geteuid() == 0 or "REFLOW_SANDBOX_LOCKS" in os.environ:
        return LOCK_DIR
    return Path(tempfile.gettempdir()) / f"reflow-sandbox-{os.geteuid()}"


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of the run's own uid, and reap the ones that became ours."""
    me = os.getpid()
    for _ in range(50):
        procs = _processes_of(uid)
        for pid, state, ppid in procs:
            if state != "Z":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            elif ppid == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        if not procs or all(state == "Z" and ppid != me for _, state, ppid in procs):
            return
        time.sleep(0.01)
    log.warning("sandbox: processes of uid %d still alive after SIGKILL", uid)
