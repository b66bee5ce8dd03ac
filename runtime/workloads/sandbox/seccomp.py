"""The seccomp filter of sandboxed programs: a classic-BPF program bwrap loads (``--seccomp
FD``) just before it execs the program, after its own namespace set-up.

It denies, with EPERM, the system calls a test program never needs and that are the usual
way from an unprivileged process into the kernel's attack surface or out of its
namespaces: io_uring, userfaultfd, the key rings, bpf, perf events, ptrace and its
relatives, every mount call, new namespaces (``unshare``, ``setns``, ``clone`` with a
``CLONE_NEW*`` flag), modules, kexec, swap and reboot. ``clone3`` answers ENOSYS instead:
its flags sit in a struct a filter cannot read, and glibc falls back to ``clone`` (threads,
``fork``, ``posix_spawn``) on ENOSYS, whose flags the filter does check. Everything else is
allowed: the list is of what to refuse, so ordinary Python keeps working.

The program is written here by hand, not compiled with libseccomp: no Python binding is
installed on these machines, and the filter is short enough to read. Only the host's own
ABI passes; a call through another one (i386 ``int 0x80`` on x86_64, arm32 compat on
aarch64) kills the process, and on x86_64 the x32 ABI (numbers with bit 30 set) is denied
as a whole, since its numbers would otherwise slip past the list.
"""

from __future__ import annotations

import errno
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LO = 0, 4, 16  # args[0]'s low word (little endian)

# Classic BPF opcodes (linux/bpf_common.h).
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K, _JGE_K, _JSET_K = 0x15, 0x35, 0x45  # BPF_JMP | BPF_{JEQ,JGE,JSET} | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_X32_SYSCALL_BIT = 0x40000000

# Every CLONE_NEW* flag clone(2) takes (CLONE_NEWTIME is only for clone3/unshare).
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = (
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
)
CLONE_NEW_MASK = (
    CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET
)

# Denied with EPERM. Numbers per ABI (asm/unistd_64.h; the generic table for aarch64),
# checked against libseccomp's tables in tests/unit/test_sandbox_seccomp.py.
DENIED = (
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "userfaultfd",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "pidfd_getfd",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "reboot",
    "open_by_handle_at",
    "name_to_handle_at",
    "acct",
    "quotactl",
    "quotactl_fd",
    "fanotify_init",
    "syslog",
)

# name -> (x86_64, aarch64)
SYSCALLS: dict[str, tuple[int, int]] = {
    "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219),
    "add_key": (248, 217),
    "request_key": (249, 218),
    "bpf": (321, 280),
    "perf_event_open": (298, 241),
    "ptrace": (101, 117),
    "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271),
    "process_madvise": (440, 440),
    "pidfd_getfd": (438, 438),
    "kcmp": (312, 272),
    "mount": (165, 40),
    "umount2": (166, 39),
    "pivot_root": (155, 41),
    "chroot": (161, 51),
    "open_tree": (428, 428),
    "move_mount": (429, 429),
    "fsopen": (430, 430),
    "fsconfig": (431, 431),
    "fsmount": (432, 432),
    "fspick": (433, 433),
    "mount_setattr": (442, 442),
    "unshare": (272, 97),
    "setns": (308, 268),
    "kexec_load": (246, 104),
    "kexec_file_load": (320, 294),
    "init_module": (175, 105),
    "finit_module": (313, 273),
    "delete_module": (176, 106),
    "swapon": (167, 224),
    "swapoff": (168, 225),
    "reboot": (169, 142),
    "open_by_handle_at": (304, 265),
    "name_to_handle_at": (303, 264),
    "acct": (163, 89),
    "quotactl": (179, 60),
    "quotactl_fd": (443, 443),
    "fanotify_init": (300, 262),
    "syslog": (103, 116),
    "clone": (56, 220),
    "clone3": (435, 435),
}

# platform.machine() -> (AUDIT_ARCH_*, column in SYSCALLS)
ARCHES: dict[str, tuple[int, int]] = {
    "x86_64": (0xC000003E, 0),
    "aarch64": (0xC00000B7, 1),
    "arm64": (0xC00000B7, 1),
}


def supported(machine: str | None = None) -> bool:
    return (machine or platform.machine()) in ARCHES


def syscall_number(name: str, machine: str | None = None) -> int:
    _, column = ARCHES[machine or platform.machine()]
    return SYSCALLS[name][column]


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)  # struct sock_filter, native byte order


def build_filter(machine: str | None = None) -> bytes:
    """The filter for ``machine`` (default: this one) as bwrap's ``--seccomp`` reads it: an
    array of ``struct sock_filter``. ValueError for an ABI without a table here."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ValueError(f"sandbox: no seccomp table for {machine!r}")
    audit_arch, column = ARCHES[machine]
    denied = [SYSCALLS[name][column] for name in DENIED]
    clone, clone3 = SYSCALLS["clone"][column], SYSCALLS["clone3"][column]

    # Layout (jumps are relative and forward only, so the shared returns come last):
    #   ld arch; jeq host ? +1 : kill; ret kill
    #   ld nr; [x32 -> eperm]; jeq clone -> check_clone; jeq clone3 -> enosys;
    #   jeq denied_i -> eperm ...; ret allow
    #   check_clone: ld args[0]; jset CLONE_NEW* -> eperm; ret allow
    #   eperm: ret ERRNO(EPERM); enosys: ret ERRNO(ENOSYS)
    body: list[tuple[int, object, object, int]] = []  # (code, jt label, jf label, k)
    body.append((_LD_W_ABS, 0, 0, _OFF_ARCH))
    body.append((_JEQ_K, 1, 0, audit_arch))
    body.append((_RET_K, 0, 0, _RET_KILL_PROCESS))
    body.append((_LD_W_ABS, 0, 0, _OFF_NR))
    if machine == "x86_64":
        body.append((_JGE_K, "eperm", 0, _X32_SYSCALL_BIT))
    body.append((_JEQ_K, "check_clone", 0, clone))
    body.append((_JEQ_K, "enosys", 0, clone3))
    body.extend((_JEQ_K, "eperm", 0, nr) for nr in denied)
    body.append((_RET_K, 0, 0, _RET_ALLOW))
    labels = {"check_clone": len(body)}
    body.append((_LD_W_ABS, 0, 0, _OFF_ARG0_LO))
    body.append((_JSET_K, "eperm", 0, CLONE_NEW_MASK))
    body.append((_RET_K, 0, 0, _RET_ALLOW))
    labels["eperm"] = len(body)
    body.append((_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    labels["enosys"] = len(body)
    body.append((_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS))

    def offset(here: int, target: object) -> int:
        if isinstance(target, int):
            return target
        jump = labels[str(target)] - here - 1
        if not 0 <= jump <= 255:  # pragma: no cover - the list would have to triple
            raise ValueError("sandbox: seccomp jump out of range")
        return jump

    return b"".join(
        _insn(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(body)
    )
