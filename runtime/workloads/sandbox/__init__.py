"""A sandbox for model-written programs: bubblewrap + seccomp + rlimits + a memory and pids
cgroup + an unprivileged uid (docs/sandbox.md)."""

from runtime.workloads.sandbox.configured import check_sandbox, sandbox_for
from runtime.workloads.sandbox.limits import RunResult, SandboxLimits
from runtime.workloads.sandbox.runner import Sandbox, SandboxError

__all__ = [
    "RunResult",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "check_sandbox",
    "sandbox_for",
]
