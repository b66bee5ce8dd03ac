"""The isolation layers, by ``sandbox.isolation`` name: how to wrap a command.

- ``bwrap``: bubblewrap with every namespace unshared (no network, own pid space, own
  hostname), only ``/usr`` visible (read-only), a private size-limited tmpfs as the
  working directory and as ``/tmp``, a read-only ``/dev`` (its device nodes still work)
  whose ``/dev/shm`` is a size-limited tmpfs too (bwrap's own ``--dev`` tmpfs has no size
  limit, and tmpfs pages count against no rlimit), the program's folder read-only, an
  empty environment, no further user namespaces (``--disable-userns``) and the seccomp
  filter of :mod:`runtime.workloads.sandbox.seccomp`. It is started as an unprivileged uid: started
  by root, bwrap would still be root outside its user namespace (root-only files
  readable, RLIMIT_NPROC ignored; ../shared/notes/sandbox.md).
- ``rlimits``: no namespaces, only the rlimits and the uid (and, as root, no network via
  ``unshare --net``); the program sees the host file system as that uid does. A fallback
  where bwrap is missing, announced loudly.

rlimits are set by ``prlimit`` (util-linux) just before the layer starts, after the uid
change, so the program cannot raise them (a hard limit only goes down without privilege).
Both layers run inside the run's memory + pids cgroup where there is one (the runner puts
the launch's first process there, :mod:`runtime.workloads.sandbox.cgroups`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from runtime.workloads.sandbox.limits import SandboxLimits

log = logging.getLogger(__name__)

WORKDIR = "/sandbox"
CODEDIR = "/code"
_MB = 1 << 20


def privilege_drop(uid: int | None) -> list[str]:
    """Become ``uid`` (no supplementary groups) before anything else runs; None = stay."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]


def rlimit_prefix(limits: SandboxLimits, *, set_nproc: bool) -> list[str]:
    args = [
        "prlimit",
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",  # SIGXCPU first, SIGKILL a second later
        f"--as={limits.memory_mb * _MB}",
        f"--fsize={limits.file_size_mb * _MB}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]
    if set_nproc:  # only with a uid of its own: the limit counts all of a uid's processes
        args.append(f"--nproc={limits.max_processes}")
    return [*args, "--"]


def sandbox_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
    }


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: str | None


def bwrap_command(
    argv: list[str],
    code_dir: str,
    work_dir: str,
    limits: SandboxLimits,
    uid: int | None,
    seccomp_fd: int | None = None,
) -> Launch:
    scratch = str(limits.scratch_mb * _MB)
    cmd = [
        *privilege_drop(uid),
        *rlimit_prefix(limits, set_nproc=uid is not None),
        "bwrap",
        "--unshare-all",
        # --unshare-all only tries a user namespace; --disable-userns needs one for sure.
        "--unshare-user",
        "--disable-userns",  # no nested user namespace: no capabilities to mount with
        "--as-pid-1",  # the program is pid 1: no bwrap reaper left behind as a zombie
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/lib", "/lib",
        "--symlink", "usr/lib64", "/lib64",
        "--symlink", "usr/bin", "/bin",
        "--proc", "/proc",
        "--dev", "/dev",
        # Over --dev's own /dev/shm, then /dev itself read-only (its mounts stay writable).
        "--size", scratch, "--tmpfs", "/dev/shm",
        "--remount-ro", "/dev",
        "--size", scratch, "--tmpfs", WORKDIR,
        "--size", scratch, "--tmpfs", "/tmp",
        "--ro-bind", code_dir, CODEDIR,
        "--chdir", WORKDIR,
    ]  # fmt: skip
    if seccomp_fd is not None:  # bwrap reads the filter from it and closes it
        cmd += ["--seccomp", str(seccomp_fd)]
    for key, value in sandbox_env(WORKDIR).items():
        cmd += ["--setenv", key, value]
    # Inside, the program's folder is at CODEDIR.
    inner = [a.replace(code_dir, CODEDIR) for a in argv]
    return Launch([*cmd, *inner], {}, None)


def rlimits_command(
    argv: list[str],
    code_dir: str,
    work_dir: str,
    limits: SandboxLimits,
    uid: int | None,
) -> Launch:
    # No seccomp here: nothing in this chain loads a filter (the runner builds one for
    # bwrap only). As root the network namespace comes first (unshare needs the
    # privilege), then the uid drop, then the limits.
    no_net = ["unshare", "--net", "--"] if os.geteuid() == 0 and shutil.which("unshare") else []
    cmd = [*no_net, *privilege_drop(uid), *rlimit_prefix(limits, set_nproc=uid is not None)]
    return Launch([*cmd, *argv], sandbox_env(work_dir), work_dir)


ISOLATION: dict[str, Callable[..., Launch]] = {"bwrap": bwrap_command, "rlimits": rlimits_command}


def resolve(name: str) -> str:
    """``auto`` -> bwrap when installed, else rlimits with a warning."""
    if name == "auto":
        if shutil.which("bwrap"):
            return "bwrap"
        log.warning(
            "SANDBOX WEAKENED: bubblewrap (bwrap) is not installed; model-written programs "
            "run with rlimits and an unprivileged uid only, and can read the host's "
            "world-readable files. Install the Debian package 'bubblewrap'."
        )
        return "rlimits"
    if name not in ISOLATION:
        raise ValueError(f"sandbox.isolation: {name!r} is not one of auto, {', '.join(ISOLATION)}")
    if name == "bwrap" and not shutil.which("bwrap"):
        raise ValueError("sandbox.isolation: bwrap is not installed (Debian package bubblewrap)")
    return name
