"""Hostile programs against the real sandbox (bubblewrap + seccomp + rlimits + a memory and
pids cgroup + own uid): each one is contained, and the test checks the specific
containment, not just "it failed"."""

from __future__ import annotations

import errno
import os
import platform
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits
from runtime.workloads.sandbox.runner import _processes_of
from runtime.workloads.sandbox.uids import DEFAULT_UID_BASE

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap not installed (make install adds it)"
)
LIMITS = SandboxLimits(wall_s=4.0, cpu_s=2, memory_mb=512, max_processes=16, scratch_mb=16)
UIDS = range(DEFAULT_UID_BASE, DEFAULT_UID_BASE + 64)  # Sandbox()'s own pool


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(LIMITS, isolation="bwrap")


def sandbox_processes() -> list[tuple[int, str, int]]:
    return [p for uid in UIDS for p in _processes_of(uid)]


@pytest.fixture
def listener():
    """A TCP server on the host's loopback that records any connection."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.2)
    hits: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, addr = srv.accept()
                hits.append(str(addr))
                conn.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1], hits
    stop.set()
    t.join()
    srv.close()


def test_network_connect_to_host_is_blocked(sandbox, listener):
    port, hits = listener
    r = sandbox.run_python(
        f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "print('CONNECTED')"
    )
    assert "CONNECTED" not in r.stdout
    assert "ConnectionRefusedError" in r.stderr or "unreachable" in r.stderr
    time.sleep(0.3)
    assert hits == []  # the host's server saw nothing


def test_dns_is_blocked(sandbox):
    r = sandbox.run_python("import socket\nprint(socket.getaddrinfo('example.com', 80))")
    assert r.status == "error" and "gaierror" in r.stderr


def test_udp_to_host_is_blocked(sandbox):
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(0.5)
    port = rx.getsockname()[1]
    sandbox.run_python(
        f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.sendto(b'leak', ('127.0.0.1', {port}))"
    )
    with pytest.raises(TimeoutError):
        rx.recvfrom(16)
    rx.close()


def test_host_file_system_is_read_only(sandbox):
    name = f"reflow-escape-{uuid.uuid4().hex}"
    r = sandbox.run_python(f"open('/usr/{name}', 'w').write('x')")
    assert r.status == "error" and ("Read-only" in r.stderr or "Permission" in r.stderr)
    assert not os.path.exists(f"/usr/{name}")


def test_own_source_is_read_only(sandbox):
    r = sandbox.run_python("open(__file__, 'a').write('#')")
    assert r.status == "error"
    assert "Read-only file system" in r.stderr or "PermissionError" in r.stderr


def test_tmp_is_private(sandbox):
    name = f"reflow-escape-{uuid.uuid4().hex}"
    r = sandbox.run_python(f"open('/tmp/{name}', 'w').write('x'); print('wrote')")
    assert r.ok and "wrote" in r.stdout  # its own /tmp is writable...
    assert not os.path.exists(f"/tmp/{name}")  # ...and not the host's


@pytest.mark.skipif(os.geteuid() != 0, reason="no uid switch: the program runs as our uid")
def test_a_private_tmpdir_does_not_stop_the_sandboxed_uid(sandbox, tmp_path, monkeypatch):
    # A rank's TMPDIR is its run folder's tmp/rank<K>/ (0700, under a private runs folder):
    # the program's own uid could not reach code placed there (bwrap: "Can't find source
    # path ... Permission denied"). The sandbox puts its folders where that uid can reach.
    private = tmp_path / "run" / "tmp" / "rank1"
    private.mkdir(parents=True, mode=0o700)
    (tmp_path / "run").chmod(0o700)
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", None)
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    result = sandbox.run_python("print(6 * 7)")
    assert result.stdout == "42\n", result.stderr
    assert len(made) == 2 and not any(Path(d).is_relative_to(private) for d in made)


def test_root_home_is_not_visible(sandbox):
    r = sandbox.run_python("print(open('/root/.bashrc').read())")
    assert r.status == "error" and "FileNotFoundError" in r.stderr


def test_run_folder_keys_are_not_readable(sandbox, tmp_path):
    keys = tmp_path / "run" / "keys"
    keys.mkdir(parents=True)
    secret = uuid.uuid4().hex
    (keys / "server.key_secret").write_text(secret)
    (keys / "server.key_secret").chmod(0o600)
    r = sandbox.run_python(f"print(open({str(keys / 'server.key_secret')!r}).read())")
    assert secret not in r.stdout + r.stderr
    assert "FileNotFoundError" in r.stderr


def test_shadow_file_is_not_readable(sandbox):
    r = sandbox.run_python("print(open('/etc/shadow').read())")
    assert r.status == "error" and "root:" not in r.stdout


def test_environment_secrets_do_not_leak(sandbox, monkeypatch):
    secret = uuid.uuid4().hex
    monkeypatch.setenv("REFLOW_TEST_SECRET", secret)
    r = sandbox.run_python("import os\nprint(dict(os.environ))")
    assert r.ok and secret not in r.stdout and "REFLOW_TEST_SECRET" not in r.stdout


def test_fork_bomb_stops_at_the_process_limit(sandbox):
    r = sandbox.run_python(
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(60)\n        n += 1\n"
        "except OSError as e:\n    print('stopped at', n, type(e).__name__)\n"
    )
    assert "stopped at" in r.stdout
    n = int(r.stdout.split()[2])
    assert n < LIMITS.max_processes  # the limit held (root would not be limited at all)
    assert sandbox_processes() == []  # and the sleeping children are gone


def test_thread_bomb_stops_at_the_process_limit(sandbox):
    r = sandbox.run_python(
        "import threading, time\nn = 0\ntry:\n    while True:\n"
        "        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError:\n    print('stopped at', n)\n"
    )
    assert "stopped at" in r.stdout and int(r.stdout.split()[2]) < LIMITS.max_processes


def test_memory_bomb_gets_memory_error(sandbox):
    r = sandbox.run_python("x = bytearray(2 * 1024**3)")
    assert r.status == "error" and "MemoryError" in r.stderr


def test_infinite_loop_hits_the_cpu_limit(sandbox):
    start = time.monotonic()
    r = sandbox.run_python("while True:\n    pass")
    # SIGXCPU at the soft limit, SIGKILL at the hard one, or the wall clock: all kill it.
    assert r.status in ("cpu_limit", "signal", "timeout")
    assert time.monotonic() - start < LIMITS.wall_s + 3


def test_sleep_past_the_timeout_is_killed(sandbox):
    start = time.monotonic()
    r = sandbox.run_python("import time\ntime.sleep(60)")
    assert r.status == "timeout"
    assert time.monotonic() - start < LIMITS.wall_s + 3


def test_background_process_does_not_outlive_its_run(sandbox):
    marker = uuid.uuid4().hex
    r = sandbox.run_python(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
        f"    time.sleep(30)  # {marker}\nprint('parent leaves')"
    )
    assert r.ok
    assert sandbox_processes() == []
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps


def test_cannot_signal_host_processes(sandbox):
    me = os.getpid()
    r = sandbox.run_python(
        f"import os, signal\nos.kill({me}, signal.SIGKILL)\nprint('sent')"
    )  # the test process itself: it is still here to assert
    assert "ProcessLookupError" in r.stderr
    r = sandbox.run_python("import os\nos.kill(os.getppid() or 1, 9)\nprint('alive')")
    assert sandbox.run_python("print('next run fine')").stdout.strip() == "next run fine"


def test_host_processes_are_invisible(sandbox):
    r = sandbox.run_python(
        "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    )
    assert r.ok and str(os.getpid()) not in r.stdout.replace("[", " ").replace(",", " ").split()


def test_cannot_become_root(sandbox):
    r = sandbox.run_python("import os\nos.setuid(0)\nprint('root')")
    assert r.status == "error" and "root" not in r.stdout


def test_huge_output_is_cut_and_killed(sandbox):
    r = sandbox.run_python("while True:\n    print('x' * 10000)")
    assert r.status == "output_limit"
    assert len(r.stdout) <= LIMITS.output_bytes


def test_big_file_hits_the_file_size_limit(sandbox):
    r = sandbox.run_python(f"open('big', 'wb').write(b'x' * {(LIMITS.file_size_mb + 1) << 20})")
    assert r.status in ("error", "file_limit") and "File too large" in r.stderr + r.status.replace(
        "file_limit", "File too large"
    )


def test_many_files_fill_only_the_private_scratch(sandbox):
    r = sandbox.run_python(
        "i = 0\ntry:\n    while True:\n"
        "        open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n        i += 1\n"
        "except OSError as e:\n    print(i, e.errno)"
    )
    written, errno = map(int, r.stdout.split())
    assert errno == 28  # ENOSPC: the tmpfs is full at its size...
    assert written <= LIMITS.scratch_mb  # ...and that size is small


def test_too_many_open_files(sandbox):
    r = sandbox.run_python("fs = [open('/dev/null') for _ in range(100000)]")
    assert r.status == "error" and "Too many open files" in r.stderr


def test_unread_stdin_flood_does_not_hang(sandbox):
    start = time.monotonic()
    r = sandbox.run_python("print('ignoring stdin')", "x" * (8 << 20))
    assert r.ok and time.monotonic() - start < LIMITS.wall_s


def test_the_sandbox_still_works_after_the_suite(sandbox):
    r = sandbox.run_python("print(sum(int(x) for x in input().split()))", "1 2 3\n")
    assert r.ok and r.stdout.strip() == "6"
    assert sandbox_processes() == []


def test_rlimits_fallback_still_blocks_network_and_root_files(listener, caplog):
    port, hits = listener
    with caplog.at_level("WARNING"):
        weak = Sandbox(LIMITS, isolation="rlimits")
    r = weak.run_python(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)")
    assert r.status == "error" and hits == []
    r = weak.run_python("print(open('/root/.bashrc').read())")
    assert "PermissionError" in r.stderr
    r = weak.run_python(
        "import os\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(60)\n        n += 1\n"
        "except OSError:\n    print(n)"
    )
    assert r.stdout.strip() and int(r.stdout) < LIMITS.max_processes
    assert sandbox_processes() == []


def test_auto_without_bwrap_warns_loudly(monkeypatch, caplog):
    import runtime.workloads.sandbox.isolation as iso

    monkeypatch.setattr(iso.shutil, "which", lambda name: None if name == "bwrap" else "/x")
    with caplog.at_level("WARNING"):
        assert iso.resolve("auto") == "rlimits"
    assert "SANDBOX WEAKENED" in caplog.text


def test_launch_rejects_an_unusable_sandbox_in_one_line(runs_dir):
    from tests.helpers import REPO, reflow

    recipe = str(REPO / "recipes" / "retool_cpu.yaml")
    for value, message in (
        ("/usr/bin/nope", "sandbox.python: '/usr/bin/nope' is not an executable file"),
        ("/opt/python3", "sandbox.python: '/opt/python3' must be under /usr with bwrap"),
    ):
        done = reflow("launch", recipe, "--local", "--set", f"sandbox.python={value}")
        assert done.returncode == 2 and done.stderr.strip().endswith(message)
        assert done.stderr.count("\n") == 1
    assert not runs_dir.exists() or not any(runs_dir.iterdir())  # nothing was created


# --- memory, /dev, namespaces and system calls ----------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENTS = [
    CGROUP_ROOT / "memory" / "reflow-sandbox",
    CGROUP_ROOT / "pids" / "reflow-sandbox",
]
_MB = 1 << 20


def _machine_has_cgroups() -> bool:
    """What the machine offers, not what the sandbox detected: root and cgroup v1 memory +
    pids hierarchies, or a v2 one with both controllers."""
    if os.geteuid() != 0:
        return False
    v1 = all(os.access(CGROUP_ROOT / c / "cgroup.procs", os.W_OK) for c in ("memory", "pids"))
    v2 = any(
        {"memory", "pids"} <= set((d / "cgroup.controllers").read_text().split())
        for d in (CGROUP_ROOT, CGROUP_ROOT / "unified")
        if (d / "cgroup.controllers").exists()
    )
    return v1 or v2


needs_cgroups = pytest.mark.skipif(
    not _machine_has_cgroups(), reason="no writable memory + pids cgroup (not root?)"
)


def _run_folders() -> list[Path]:
    return [
        d for parent in CGROUP_PARENTS if parent.is_dir() for d in parent.iterdir() if d.is_dir()
    ]


def _mine(folder: Path) -> bool:
    """A run's cgroup holds the launch's outer process, a child of this test process (other
    sandboxes may run on the machine at the same time)."""
    for pid in (folder / "cgroup.procs").read_text().split():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if f"\nPPid:\t{os.getpid()}\n" in status:
            return True
    return False


def run_watched(sandbox: Sandbox, source: str) -> tuple[RunResult, dict[Path, dict[str, str]]]:
    """Run ``source`` while recording this run's cgroup folders and their limits."""
    seen: dict[Path, dict[str, str]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for d in _run_folders():
                try:
                    if d not in seen and _mine(d):
                        seen[d] = {
                            f.name: f.read_text().strip()
                            for f in (d / "memory.limit_in_bytes", d / "pids.max")
                            if f.exists()
                        }
                except OSError:  # removed meanwhile
                    continue
            time.sleep(0.01)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        r = sandbox.run_python(source)
    finally:
        done.set()
        t.join()
    return r, seen


def test_dev_shm_is_a_small_tmpfs(sandbox):
    # 512 one-MiB files (RLIMIT_FSIZE would stop one big file first): bwrap's own /dev
    # tmpfs took them all, tmpfs pages count against no rlimit.
    r = sandbox.run_python(
        "i = err = 0\ntry:\n    while i < 512:\n"
        "        open(f'/dev/shm/f{i}', 'wb').write(b'x' * (1 << 20))\n        i += 1\n"
        "except OSError as e:\n    err = e.errno\nprint(i, err)"
    )
    written, err = map(int, r.stdout.split())
    assert err == errno.ENOSPC and written <= LIMITS.scratch_mb, r


def test_dev_is_read_only_and_its_devices_work(sandbox):
    r = sandbox.run_python(
        "import os\ntry:\n    open('/dev/reflow-evil', 'w').write('x')\n    print('created')\n"
        "except OSError as e:\n    print('refused', e.errno)\n"
        "open('/dev/null', 'w').write('x')\nprint(len(open('/dev/urandom', 'rb').read(16)))\n"
        "print(len(open('/dev/zero', 'rb').read(8)))"
    )
    assert r.ok, r
    assert r.stdout.split() == ["refused", str(errno.EROFS), "16", "8"]


@needs_cgroups
def test_processes_together_stop_at_the_memory_cgroup(sandbox):
    # 8 children of 200 MB each: every one well under RLIMIT_AS (512 MB), together 1.6 GB,
    # far over the program's memory cgroup (RLIMIT_AS + its tmpfs mounts + headroom).
    assert LIMITS.group_memory_bytes < 8 * 200 * _MB
    r, folders = run_watched(
        sandbox,
        "import os, time\nkids = []\nfor _ in range(8):\n    pid = os.fork()\n"
        "    if pid == 0:\n        x = b'\\x01' * (200 << 20)\n        time.sleep(1)\n"
        "        os._exit(0)\n    kids.append(pid)\n"
        "ok = sum(os.waitpid(p, 0)[1] == 0 for p in kids)\nprint('held', ok)",
    )
    assert r.status == "memory_limit", r
    assert "held 8" not in r.stdout
    assert folders and not any(d.exists() for d in folders)  # removed after an OOM kill


@needs_cgroups
def test_unmapped_shared_memory_counts_against_the_cgroup(sandbox):
    # memfd pages written, never mapped: no address space, so RLIMIT_AS never sees them.
    r = sandbox.run_python(
        "import os\nfds = []\nfor i in range(50):\n"
        "    fd = os.memfd_create(f'm{i}')\n    os.write(fd, b'\\x01' * (16 << 20))\n"
        "    fds.append(fd)\n    print((i + 1) * 16, flush=True)\nprint('all')"
    )
    assert r.status == "memory_limit", r
    assert "all" not in r.stdout
    held = int(r.stdout.split()[-1]) if r.stdout.split() else 0
    assert held * _MB <= LIMITS.group_memory_bytes  # the host lost no more than the limit


@needs_cgroups
def test_fork_bomb_stops_at_the_pids_cgroup_without_rlimit_nproc(sandbox, monkeypatch):
    # RLIMIT_NPROC counts a uid; where it does not bind (no uid of its own), the pids
    # cgroup still does. The program stops itself at 200, the old unbounded case.
    import runtime.workloads.sandbox.isolation as iso

    real = iso.rlimit_prefix
    monkeypatch.setattr(
        iso, "rlimit_prefix", lambda limits, set_nproc: real(limits, set_nproc=False)
    )
    assert "--nproc" not in " ".join(iso.rlimit_prefix(LIMITS, set_nproc=True))
    r, folders = run_watched(
        sandbox,
        "import os\nn = 0\ntry:\n    while n < 200:\n        if os.fork() == 0:\n"
        "            import time; time.sleep(60)\n        n += 1\n"
        "except OSError as e:\n    print('stopped at', n, type(e).__name__)\nelse:\n"
        "    print('unbounded', n)",
    )
    assert "stopped at" in r.stdout, r
    assert int(r.stdout.split()[2]) < LIMITS.max_processes
    # The sleepers were killed: a cgroup is removed only once empty.
    assert folders and not any(d.exists() for d in folders)


@needs_cgroups
def test_each_run_has_its_own_cgroup_and_it_is_removed(sandbox):
    r, folders = run_watched(sandbox, "import time\ntime.sleep(1)\nprint('done')")
    assert r.ok
    limits = {name: value for found in folders.values() for name, value in found.items()}
    assert limits == {
        "memory.limit_in_bytes": str(LIMITS.group_memory_bytes),
        "pids.max": str(LIMITS.max_processes),
    }
    assert {d.parent.parent.name for d in folders} == {"memory", "pids"}
    assert not any(d.exists() for d in folders)  # removed after the run


def test_nested_user_namespaces_fail(sandbox):
    r = sandbox.run_python(
        "import ctypes, os, subprocess\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "NEWUSER, NEWNS, SIGCHLD = 0x10000000, 0x20000, 17\n"
        "def err(rc):\n    return 0 if rc >= 0 else ctypes.get_errno()\n"
        "print('unshare', err(libc.unshare(NEWUSER)))\n"
        "print('unshare_ns', err(libc.unshare(NEWUSER | NEWNS)))\n"
        "pid = libc.syscall(" + str(_nr("clone")) + ", NEWUSER | SIGCHLD, 0, 0, 0, 0)\n"
        "if pid == 0:\n    os._exit(0)\n"
        "print('clone', err(pid))\nif pid > 0:\n    os.waitpid(pid, 0)\n"
        "p = subprocess.run(['unshare', '--user', 'true'], capture_output=True)\n"
        "print('tool', p.returncode)"
    )
    got = dict(line.split() for line in r.stdout.splitlines())
    assert got == {
        "unshare": str(errno.EPERM),
        "unshare_ns": str(errno.EPERM),
        "clone": str(errno.EPERM),
        "tool": "1",
    }, r


def _nr(name: str) -> int:
    # The filter's own table (its numbers are checked against libseccomp's in
    # tests/unit/test_sandbox_seccomp.py), plus getpid for the x32 probe.
    from runtime.workloads.sandbox.seccomp import SYSCALLS

    table = {**SYSCALLS, "getpid": (39, 172)}
    return table[name][0 if platform.machine() == "x86_64" else 1]


# Arguments with which each call does something (or fails for another reason than
# EPERM) when unfiltered: EPERM then can only come from the filter.
DENIED_CALLS = {
    "io_uring_setup": "1, ctypes.create_string_buffer(120)",  # a ring: a new fd
    "io_uring_enter": "-1, 0, 0, 0, None, 0",  # EBADF
    "io_uring_register": "-1, 0, None, 0",  # EBADF
    "userfaultfd": "1",  # UFFD_USER_MODE_ONLY: allowed unprivileged
    "keyctl": "0, -2, 1",  # KEYCTL_GET_KEYRING_ID of the process keyring, create
    "add_key": "b'user', b'reflow', b'x', 1, -2",
    "request_key": "b'user', b'reflow-none', None, 0",  # ENOKEY
    "bpf": "9999, None, 0",  # an unknown command: EINVAL
    "perf_event_open": "PERF_ATTR, 0, -1, -1, 0",  # a software counter's attr: EINVAL
    "ptrace": "16, 99999, 0, 0",  # PTRACE_ATTACH to no such pid: ESRCH
    "process_vm_readv": "99999, None, 0, None, 0, 0",
    "setns": "-1, 0",  # EBADF
    # In a fresh user + mount namespace mount would work; the unshare is refused first.
    "mount": "b'none', b'/tmp', b'tmpfs', 0, None",
}


@pytest.mark.parametrize("name", sorted(DENIED_CALLS))
def test_dangerous_system_calls_return_eperm(sandbox, name):
    r = sandbox.run_python(
        "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.syscall.restype = ctypes.c_long\n"
        # type PERF_TYPE_SOFTWARE, size 0 (= version 0), config CPU_CLOCK, flags
        # exclude_kernel | exclude_hv
        "PERF_ATTR = ctypes.create_string_buffer(\n"
        "    struct.pack('=IIQQQQ', 1, 0, 0, 0, 0, 0x60), 128)\n"
        "libc.unshare(0x10000000 | 0x20000)\n"
        "ctypes.set_errno(0)\n"
        f"rc = libc.syscall({_nr(name)}, {DENIED_CALLS[name]})\n"
        "print(rc, ctypes.get_errno())"
    )
    rc, err = map(int, r.stdout.split())
    assert (rc, err) == (-1, errno.EPERM), f"{name}: {r}"


def test_clone3_answers_enosys_and_normal_programs_still_work(sandbox):
    program = textwrap.dedent(
        f"""\
        import ctypes, os, subprocess, sys, tempfile, threading
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall({_nr("clone3")}, None, 0)
        print("clone3", rc, ctypes.get_errno())
        out = []
        ts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
        print("threads", len(out))
        p = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True)
        print("child", p.stdout.decode().strip())
        pid = os.fork()
        if pid == 0:
            os._exit(3)
        print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        open("/dev/null", "w").write("x")
        print("urandom", len(os.urandom(8)), len(open("/dev/urandom", "rb").read(8)))
        with tempfile.TemporaryFile() as f:
            f.write(b"x")
            f.seek(0)
            print("tmp", f.read().decode())
        """
    )
    r = sandbox.run_python(program)
    assert r.ok, r
    assert r.stdout.splitlines() == [
        f"clone3 -1 {errno.ENOSYS}",
        "threads 4",
        "child 42",
        "fork 3",
        "urandom 8 8",
        "tmp x",
    ]


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the x32 ABI is x86_64's")
def test_x32_system_calls_are_denied(sandbox):
    r = sandbox.run_python(
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"rc = libc.syscall(0x40000000 | {_nr('getpid')})\nprint(rc, ctypes.get_errno())"
    )
    assert r.stdout.split() == ["-1", str(errno.EPERM)], r


def test_not_root_says_there_is_no_uid_switch_in_one_line(monkeypatch, caplog):
    import runtime.workloads.sandbox.configured as code  # holds the Sandbox cache
    import runtime.workloads.sandbox.runner as runner
    from runtime.config.recipe import load_recipe
    from runtime.workloads.sandbox import check_sandbox
    from tests.helpers import REPO

    cfg = load_recipe(REPO / "recipes" / "retool_cpu.yaml")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(code, "_DEFAULT", {})  # a Sandbox made as root would be reused
    monkeypatch.setattr(runner, "_logged", set(), raising=False)
    with caplog.at_level("WARNING", logger="runtime.workloads.sandbox"):
        lines = check_sandbox(cfg)
    assert isinstance(lines, list) and len(lines) == 1, lines
    assert "no uid switch" in lines[0] and "\n" not in lines[0]
    assert "bwrap still hides" in lines[0]  # and what isolation remains
    warned = [rec.getMessage() for rec in caplog.records if rec.levelname == "WARNING"]
    assert warned == lines


def test_launch_says_no_uid_switch_before_the_run_starts(tmp_path, runs_dir, monkeypatch):
    from tests.helpers import REPO, reflow

    # The real CLI in a subprocess, made to believe it is not root and stopped where it
    # would submit: what it printed by then is what a user on Slurm reads.
    (tmp_path / "sitecustomize.py").write_text(
        "import os\nos.geteuid = lambda: 1000\n"
        "import jobs.launch\nfrom jobs.errors import UserError\n"
        "def submit(*args, **kwargs):\n    raise UserError('stopped before submitting')\n"
        "jobs.launch.submit = submit\n"
    )
    path = [str(tmp_path), *filter(None, [os.environ.get("PYTHONPATH")])]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(path))
    done = reflow("launch", str(REPO / "recipes" / "retool_cpu.yaml"), "--local")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1].endswith("stopped before submitting"), done.stderr
    assert len(lines) == 2 and "no uid switch" in lines[0], done.stderr
