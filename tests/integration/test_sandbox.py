"""Hostile programs against the real sandbox (bubblewrap + rlimits + own uid): each one
is contained, and the test checks the specific containment, not just "it failed"."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid

import pytest

from runtime.sandbox import Sandbox, SandboxLimits
from runtime.sandbox.runner import _processes_of

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap not installed (make install adds it)"
)
LIMITS = SandboxLimits(wall_s=4.0, cpu_s=2, memory_mb=512, max_processes=16, scratch_mb=16)
UIDS = range(61000, 61064)


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
    import runtime.sandbox.isolation as iso

    monkeypatch.setattr(iso.shutil, "which", lambda name: None if name == "bwrap" else "/x")
    with caplog.at_level("WARNING"):
        assert iso.resolve("auto") == "rlimits"
    assert "SANDBOX WEAKENED" in caplog.text


def test_launch_rejects_an_unusable_sandbox_in_one_line(runs_dir):
    from tests.conftest import REPO, reflow

    recipe = str(REPO / "recipes" / "retool_cpu.yaml")
    for value, message in (
        ("/usr/bin/nope", "sandbox.python: '/usr/bin/nope' is not an executable file"),
        ("/opt/python3", "sandbox.python: '/opt/python3' must be under /usr with bwrap"),
    ):
        done = reflow("launch", recipe, "--local", "--set", f"sandbox.python={value}")
        assert done.returncode == 2 and done.stderr.strip().endswith(message)
        assert done.stderr.count("\n") == 1
    assert not runs_dir.exists() or not any(runs_dir.iterdir())  # nothing was created
