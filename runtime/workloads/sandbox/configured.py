"""The sandbox a run's settings describe: one per process and settings
(:func:`sandbox_for`), and the check ``reflow launch`` makes before it starts anything
(:func:`check_sandbox`)."""

from __future__ import annotations

from typing import Any

from runtime.config.workload_kinds import KINDS
from runtime.workloads.sandbox.limits import SandboxLimits
from runtime.workloads.sandbox.runner import Sandbox, SandboxError

# Workloads that run model-written code.
NEEDS_SANDBOX = frozenset(name for name, k in KINDS.items() if k.needs_sandbox)

_DEFAULT: dict[tuple, Sandbox] = {}


def sandbox_for(cfg: Any | None = None) -> Sandbox:
    """One Sandbox per process and settings: a Config, its ``sandbox`` section, or None for
    the defaults."""
    s = getattr(cfg, "sandbox", cfg)
    key = () if s is None else tuple(sorted(vars(s).items()))
    if key not in _DEFAULT:
        if s is None:
            _DEFAULT[key] = Sandbox()
        else:
            limits = SandboxLimits(
                wall_s=s.test_timeout_s,
                cpu_s=max(1, int(s.test_timeout_s)),
                memory_mb=s.memory_mb,
                max_processes=s.max_processes,
                file_size_mb=s.file_size_mb,
                scratch_mb=s.scratch_mb,
                output_bytes=s.output_kb * 1024,
            )
            _DEFAULT[key] = Sandbox(
                limits,
                isolation=s.isolation,
                python=s.python,
                uid_base=s.uid_base,
                uid_slots=s.uid_slots or 64,  # a section never derived: a bare default
                running=s.running,
            )
    return _DEFAULT[key]


def check_sandbox(cfg) -> list[str]:
    """Set up (not run) the sandbox a launch will need, so a missing bwrap or interpreter is
    one line at ``reflow launch``, not a rank failing later. Raises SandboxError.

    Returns the layers this machine cannot give it, one line each (e.g. no uid switch when
    the worker is not root). Each is also logged as a warning once per process, which is
    how ``reflow launch`` prints it: a bare line on stderr before the run starts (the CLI
    configures no logging, so Python's last-resort handler writes it)."""
    if cfg.workload.kind not in NEEDS_SANDBOX:
        return []
    try:
        return list(sandbox_for(cfg).weakened)
    except ValueError as exc:  # sandbox.isolation asks for what is not installed
        raise SandboxError(str(exc)) from None
