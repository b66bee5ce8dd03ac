"""What one sandboxed program may use, and what became of it."""

from __future__ import annotations

from dataclasses import dataclass

# How a run ended. ``ok`` and ``error`` are the program's own doing; the others are
# limits the sandbox enforced.
STATUSES = (
    "ok",
    "error",
    "timeout",
    "output_limit",
    "cpu_limit",
    "file_limit",
    "memory_limit",  # the memory cgroup's OOM killer stopped one of its processes
    "signal",
)

_MB = 1 << 20
# Beyond the program's own pages: page tables, socket and pipe buffers, bwrap's own
# process (about 2 MB), all charged to the same cgroup.
_KERNEL_HEADROOM_MB = 64
TMPFS_MOUNTS = 3  # /sandbox, /tmp and /dev/shm, each scratch_mb (bwrap)


@dataclass(frozen=True)
class SandboxLimits:
    wall_s: float = 6.0  # wall clock; then the whole process tree is killed
    cpu_s: int = 6  # RLIMIT_CPU per process (SIGXCPU)
    memory_mb: int = 1024  # RLIMIT_AS per process (MemoryError)
    max_processes: int = 16  # RLIMIT_NPROC of the sandbox's own uid; pids.max of its cgroup
    file_size_mb: int = 16  # RLIMIT_FSIZE (EFBIG)
    scratch_mb: int = 64  # size of each private writable tmpfs (bwrap: /sandbox, /tmp, /dev/shm)
    open_files: int = 256  # RLIMIT_NOFILE
    output_bytes: int = 1 << 20  # stdout + stderr kept; more is killed as output_limit

    @property
    def group_memory_bytes(self) -> int:
        """The memory cgroup's limit: all the program's processes and the pages of its
        tmpfs mounts together. One process using its whole address space while its tmpfs
        mounts are full still fits, so no single-process program loses anything to it;
        what it stops is many processes (or unmapped shared memory) adding up."""
        return (self.memory_mb + TMPFS_MOUNTS * self.scratch_mb + _KERNEL_HEADROOM_MB) * _MB

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
        """One line for feedback and error fields: for an error, the last line of stderr
        that is not part of a traceback's frames (an exception's line, or what the
        program wrote), else the exit code. Several processes of one program (forks)
        write their tracebacks into one stderr, and a program killed mid-write leaves its
        last traceback cut after a frame: its last line is then a frame's source line
        (seen with a fork bomb under load), which is no description."""
        if self.status == "error":
            for line in reversed(self.stderr.rstrip().splitlines()):
                if line.strip() and not line[:1].isspace() and line != _TRACEBACK_HEAD:
                    return line[:300]
            return f"exit code {self.exit_code}"
        return self.status


_TRACEBACK_HEAD = "Traceback (most recent call last):"
