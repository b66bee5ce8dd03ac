"""A sandbox for model-written programs: bubblewrap + rlimits + an unprivileged uid."""

from runtime.sandbox.limits import RunResult, SandboxLimits
from runtime.sandbox.runner import Sandbox, SandboxError

# Workloads that run model-written code.
NEEDS_SANDBOX = {"code_agent", "tool_reasoning"}


def check_sandbox(cfg) -> None:
    """Set up (not run) the sandbox a launch will need, so a missing bwrap or interpreter is
    one line at ``reflow launch``, not a rank failing later. Raises SandboxError."""
    if cfg.workload.kind not in NEEDS_SANDBOX:
        return
    from runtime.rewards.code import sandbox_for

    try:
        sandbox_for(cfg)
    except ValueError as exc:  # sandbox.isolation asks for what is not installed
        raise SandboxError(str(exc)) from None


__all__ = ["RunResult", "Sandbox", "SandboxError", "SandboxLimits", "check_sandbox"]
