"""A sandboxed process spoken to in lines (the code grader's program and tests, each in a
sandbox of its own, with the grader relaying calls between them).

A :class:`Session` wraps one :class:`~runtime.workloads.sandbox.runner.Launched` process:
:meth:`Session.send` writes a line to its stdin, :meth:`Session.recv` waits for the next
line of its stdout that starts with a given mark, draining stderr meanwhile so that the
process never blocks on a full pipe. Every wait has the run's deadline; what the process
prints beyond ``output_bytes`` in all stops it (``output_limit``), as in a one-shot run."""

from __future__ import annotations

import contextlib
import os
import selectors
import time
from collections.abc import Iterator

from runtime.workloads.sandbox.limits import RunResult, SandboxLimits
from runtime.workloads.sandbox.runner import Launched, Sandbox

_LINE_BYTES = 64 << 20  # a protocol line longer than this is refused as output_limit


class Session:
    def __init__(self, run: Launched, deadline: float, cap: int) -> None:
        self.run, self.deadline, self.cap = run, deadline, cap
        proc = run.proc
        assert proc.stdin and proc.stdout and proc.stderr
        self._in, self._out, self._err = proc.stdin, proc.stdout, proc.stderr
        for stream in (self._in, self._out, self._err):
            os.set_blocking(stream.fileno(), False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._out, selectors.EVENT_READ)
        self._sel.register(self._err, selectors.EVENT_READ)
        self._pending = bytearray()  # stdout not yet split into lines
        self._lines: list[bytes] = []
        self.stdout = bytearray()  # every stdout line that was not a protocol line
        self.stderr = bytearray()
        self.why: str | None = None  # timeout, output_limit: why the session stopped
        self._eof = False

    def send(self, line: bytes) -> bool:
        """Write ``line`` (a newline is added); False when the process stopped reading
        (it ended, or its stdin filled until the deadline)."""
        data = memoryview(line + b"\n")
        while data:
            if time.monotonic() >= self.deadline:
                self.why = self.why or "timeout"
                return False
            try:
                data = data[os.write(self._in.fileno(), data) :]
            except BlockingIOError:
                self._wait_io(writing=True)
            except (BrokenPipeError, OSError):
                return False
        return True

    def recv(self, mark: bytes) -> bytes | None:
        """The next stdout line starting with ``mark``, without it; None when the process
        ended, the deadline passed or its output went over the cap first."""
        while True:
            while self._lines:
                line = self._lines.pop(0)
                if line.startswith(mark):
                    return line[len(mark) :]
                self._keep(self.stdout, line + b"\n")
            if self._eof or self.why:
                return None
            if time.monotonic() >= self.deadline:
                self.why = "timeout"
                return None
            self._wait_io(writing=False)

    def _wait_io(self, writing: bool) -> None:
        if writing:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.register(self._in, selectors.EVENT_WRITE)
        try:
            left = max(0.0, min(self.deadline - time.monotonic(), 0.5))
            for key, _ in self._sel.select(timeout=left):
                if key.fileobj is self._in:
                    continue
                self._read(key.fileobj)  # type: ignore[arg-type]
        finally:
            if writing:
                with contextlib.suppress(KeyError, ValueError):
                    self._sel.unregister(self._in)

    def _read(self, stream: object) -> None:
        try:
            chunk = os.read(stream.fileno(), 65536)  # type: ignore[attr-defined]
        except BlockingIOError:
            return
        if not chunk:
            self._sel.unregister(stream)
            if stream is self._out:
                self._eof = True
                if self._pending:
                    self._lines.append(bytes(self._pending))
                    self._pending.clear()
            return
        if stream is self._err:
            self._keep(self.stderr, chunk)
            return
        if b"\n" not in chunk:  # split only what came now: a long line costs linear time
            self._pending += chunk
        else:
            first, *lines, rest = chunk.split(b"\n")
            self._lines.append(bytes(self._pending) + first)
            self._lines += lines
            self._pending[:] = rest
        if len(self._pending) > _LINE_BYTES:
            self.why = "output_limit"

    def _keep(self, buf: bytearray, data: bytes) -> None:
        buf += data
        if len(self.stdout) + len(self.stderr) > self.cap:
            self.why = "output_limit"

    def finish(self, grace_s: float = 0.0) -> RunResult:
        """Close stdin, give the process ``grace_s`` to end by itself (reading what it
        still prints), then stop it: how the run ended."""
        with contextlib.suppress(OSError):
            self._in.close()
        end = min(self.deadline, time.monotonic() + grace_s)
        while not self._eof and not self.why and time.monotonic() < end:
            self._wait_io(writing=False)
        with contextlib.suppress(Exception):
            self.run.proc.wait(timeout=max(0.0, end - time.monotonic()))
        self._sel.close()
        cap = self.cap
        return self.run.result(bytes(self.stdout)[:cap], bytes(self.stderr)[:cap], self.why)


@contextlib.contextmanager
def session(
    sandbox: Sandbox, source: str, limits: SandboxLimits, reserved: list[int] | None = None
) -> Iterator[Session]:
    """``source`` started in ``sandbox`` as a :class:`Session`, stopped and cleaned up on
    leaving; its uid from ``reserved`` when given (:meth:`Sandbox.reserve`)."""
    with sandbox.launched(source, limits, reserved) as run:
        yield Session(run, run.start + limits.wall_s, limits.output_bytes)
