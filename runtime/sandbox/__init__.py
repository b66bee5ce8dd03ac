"""A sandbox for model-written programs: bubblewrap + rlimits + an unprivileged uid."""

from runtime.sandbox.limits import RunResult, SandboxLimits
from runtime.sandbox.runner import Sandbox, SandboxError

__all__ = ["RunResult", "Sandbox", "SandboxError", "SandboxLimits"]
