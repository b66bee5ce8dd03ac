"""The sandbox's seccomp filter, run through a classic-BPF interpreter: what each system
call gets, per ABI; and its syscall numbers against libseccomp's tables where installed."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import struct

import pytest

from runtime.workloads.sandbox import seccomp

ALLOW, KILL = 0x7FFF0000, 0x80000000
EPERM, ENOSYS = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS


def run_filter(prog: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate the filter on one seccomp_data (only the instructions it uses)."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, *(list(args) + [0] * (6 - len(args))))
    insns = [struct.unpack_from("=HBBI", prog, i) for i in range(0, len(prog), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:
            return k
        else:  # pragma: no cover - an opcode the filter should not contain
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_each_denied_call_gets_eperm_and_the_rest_pass(machine):
    prog = seccomp.build_filter(machine)
    arch = seccomp.ARCHES[machine][0]
    for name in seccomp.DENIED:
        assert run_filter(prog, seccomp.syscall_number(name, machine), arch) == EPERM, name
    ordinary = {"x86_64": (0, 1, 2, 9, 39, 57, 59, 231), "aarch64": (63, 64, 56, 222, 172, 221)}
    for nr in ordinary[machine]:  # read, write, open(at), mmap, getpid, fork/execve, exit
        assert run_filter(prog, nr, arch) == ALLOW, nr


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_clone_is_checked_for_new_namespaces_and_clone3_falls_back(machine):
    prog = seccomp.build_filter(machine)
    arch = seccomp.ARCHES[machine][0]
    clone = seccomp.syscall_number("clone", machine)
    thread = 0x3D0F00  # what glibc's pthread_create passes
    assert run_filter(prog, clone, arch, (thread,)) == ALLOW
    assert run_filter(prog, clone, arch, (0x01200011,)) == ALLOW  # fork: SIGCHLD | SETTID
    for flag in (seccomp.CLONE_NEWUSER, seccomp.CLONE_NEWNS, seccomp.CLONE_NEWNET):
        assert run_filter(prog, clone, arch, (flag | 17,)) == EPERM
    assert run_filter(prog, seccomp.syscall_number("clone3", machine), arch) == ENOSYS


def test_other_abis_are_killed_and_x32_is_denied():
    prog = seccomp.build_filter("x86_64")
    i386, x86_64 = 0x40000003, seccomp.ARCHES["x86_64"][0]
    assert run_filter(prog, 20, i386) == KILL  # getpid through int 0x80
    assert run_filter(prog, 0x40000000 | 39, x86_64) == EPERM  # x32 getpid
    assert run_filter(seccomp.build_filter("aarch64"), 20, 0x40000028) == KILL  # arm32
    with pytest.raises(ValueError, match="no seccomp table"):
        seccomp.build_filter("riscv64")


_LIB = ctypes.util.find_library("seccomp")


@pytest.mark.skipif(_LIB is None, reason="libseccomp is not installed")
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_syscall_numbers_match_libseccomp(machine):
    lib = ctypes.CDLL(_LIB)
    resolve = lib.seccomp_syscall_resolve_name_arch
    resolve.argtypes, resolve.restype = [ctypes.c_uint32, ctypes.c_char_p], ctypes.c_int
    arch = seccomp.ARCHES[machine][0]  # SCMP_ARCH_* are the AUDIT_ARCH_* values
    for name in seccomp.SYSCALLS:
        assert seccomp.syscall_number(name, machine) == resolve(arch, name.encode()), name
