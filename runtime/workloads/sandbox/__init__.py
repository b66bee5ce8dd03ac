"""A sandbox for model-written programs: bubblewrap + seccomp + rlimits + a memory and pids
cgroup + an unprivileged uid (docs/sandbox.md)."""

from runtime.workloads.sandbox.limits import RunResult, SandboxLimits
from runtime.workloads.sandbox.runner import Sandbox, SandboxError

# Workloads that run model-written code.
NEEDS_SANDBOX = {"code_agent", "tool_reasoning"}


def check_sandbox(cfg) -> list[str]:
    """Set up (not run) the sandbox a launch will need, so a missing bwrap or interpreter is
    one line at ``reflow launch``, not a rank failing later. Raises SandboxError.

    Returns the layers this machine cannot give it, one line each (e.g. no uid switch when
    the worker is not root). Each is also logged as a warning once per process, which is
    how ``reflow launch`` prints it: a bare line on stderr before the run starts (the CLI
    configures no logging, so Python's last-resort handler writes it)."""
    if cfg.workload.kind not in NEEDS_SANDBOX:
        return []
    from runtime.workloads.rewards.code import sandbox_for

    try:
        return list(sandbox_for(cfg).weakened)
    except ValueError as exc:  # sandbox.isolation asks for what is not installed
        raise SandboxError(str(exc)) from None


__all__ = ["RunResult", "Sandbox", "SandboxError", "SandboxLimits", "check_sandbox"]
