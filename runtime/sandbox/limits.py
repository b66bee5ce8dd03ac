"""What one sandboxed program may use, and what became of it."""

from __future__ import annotations

from dataclasses import dataclass

# How a run ended. ``ok`` and ``error`` are the program's own doing; the others are
# limits the sandbox enforced.
STATUSES = ("ok", "error", "timeout", "output_limit", "cpu_limit", "file_limit", "signal")


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 6.0  # wall clock; then the whole process tree is killed
    cpu_s: int = 6  # RLIMIT_CPU per process (SIGXCPU)
    memory_mb: int = 1024  # RLIMIT_AS per process (MemoryError)
    max_processes: int = 16  # RLIMIT_NPROC of the sandbox's own uid
    file_size_mb: int = 16  # RLIMIT_FSIZE (EFBIG)
    scratch_mb: int = 64  # size of the private writable tmpfs (bwrap)
    open_files: int = 256  # RLIMIT_NOFILE
    output_bytes: int = 1 << 20  # stdout + stderr kept; more is killed as output_limit

    def with_wall(self, wall_s: float) -> SandboxLimits:
        from dataclasses import replace

        return replace(self, wall_s=wall_s, cpu_s=max(1, min(self.cpu_s, int(wall_s) + 1)))


@dataclass(frozen=True)
class RunResult:
    status: str  # one of STATUSES
    exit_code: int | None
    stdout: str
    stderr: str
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """One line for feedback and error fields."""
        if self.status == "error":
            last = self.stderr.strip().splitlines()[-1:] or [f"exit code {self.exit_code}"]
            return last[0][:300]
        return self.status
