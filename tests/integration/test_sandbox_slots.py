"""The node's sandbox slots under load. Uids: gradings that need two processes at once
claim theirs together, so more gradings than the pool has pairs for queue instead of each
holding one uid and waiting for a second; a pool that would run programs as existing
accounts is refused. Run slots: no more programs run at once than the node has slots for,
and a grading's clocks start once it holds its slots."""

from __future__ import annotations

import itertools
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.workloads.rewards.code import parse_tests, run_tests
from runtime.workloads.sandbox import Sandbox, SandboxError, SandboxLimits

pytestmark = [
    pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="uid switching needs root"),
]
LIMITS = SandboxLimits(wall_s=10.0, cpu_s=5, memory_mb=512, max_processes=16, scratch_mb=16)
PROGRAM = "def add(a, b):\n    return a + b\n"
TESTS = {"test_list": ["assert add(1, 2) == 3", "assert add(2, 2) == 4"]}


def test_more_gradings_than_uid_pairs_all_grade():
    """Six gradings on four uids. Claimed one process at a time, four gradings took a uid
    each and waited for their second until the claim gave up."""
    sandbox = Sandbox(LIMITS, isolation="bwrap", uid_slots=4, wait_s=60)
    spec = parse_tests(TESTS)
    assert spec.kind in ("script", "asserts")  # graded by two processes and the relay

    def grade(_: int) -> float:
        return run_tests(PROGRAM, spec, sandbox, total_timeout_s=120).score

    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(grade, range(6))) == [1.0] * 6


def test_a_pool_over_existing_accounts_is_refused():
    with pytest.raises(SandboxError, match=r"sandbox.uid_base: .* include accounts \(root \(0\)"):
        Sandbox(LIMITS, isolation="bwrap", uid_base=0, uid_slots=2)


def _intervals(out: str) -> tuple[float, float]:
    start, end = map(float, out.split())
    return start, end


def test_no_more_programs_run_at_once_than_the_node_has_run_slots():
    sandbox = Sandbox(LIMITS, isolation="bwrap", running=1)
    program = "import time\nprint(time.time())\ntime.sleep(0.5)\nprint(time.time())"
    with ThreadPoolExecutor(3) as ex:
        runs = list(ex.map(lambda _: sandbox.run_python(program), range(3)))
    assert all(r.ok for r in runs), runs
    spans = sorted(_intervals(r.stdout) for r in runs)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, spans  # one after the other


def test_a_grading_that_waits_for_its_slot_keeps_its_whole_time_limit():
    """The only run slot is held for 3 s; a grading with a 2 s total limit waits for it
    and still passes: its clocks start once it holds the slot."""
    sandbox = Sandbox(LIMITS, isolation="bwrap", running=1)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with sandbox.admitted(1):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(30)
        threading.Timer(3.0, release.set).start()
        began = time.monotonic()
        result = run_tests(PROGRAM, parse_tests(TESTS), sandbox, total_timeout_s=2)
        assert time.monotonic() - began >= 2.9  # it did wait for the slot
    finally:
        release.set()
        holder.join()
    assert result.score == 1.0, result.error


_AS_NOBODY = """
import os
from runtime.workloads.sandbox.runner import _lock_dir
from runtime.workloads.sandbox.uids import NodeSlots
os.setgroups([]); os.setgid(65534); os.setuid(65534)  # imported first: root's files
folder = _lock_dir()
try:
    with NodeSlots("run", 0, 2, folder, "sandbox.running").claim(2, timeout_s=1) as got:
        print("claimed", sorted(got), folder, oct(folder.stat().st_mode & 0o777))
except PermissionError as e:
    print("refused", e)
"""


def test_a_non_root_worker_claims_in_a_folder_of_its_own_and_refuses_another_users(tmp_path):
    """A worker that is not root shares run slots with its own processes only, in a
    folder whose name anyone can know: one another user made first (and could fill with
    held locks) is refused with the folder named, not used."""
    import subprocess
    import sys
    import tempfile

    def as_nobody(tmp: str) -> str:
        env = {k: v for k, v in os.environ.items() if k != "REFLOW_SANDBOX_LOCKS"}
        env["TMPDIR"] = tmp
        done = subprocess.run(
            [sys.executable, "-c", _AS_NOBODY], env=env, capture_output=True, text=True,
            timeout=60, cwd=os.getcwd(),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    for planted in (False, True):
        tmp = tempfile.mkdtemp(prefix="reflow-slots-")  # under /tmp: nobody can reach it
        try:
            os.chmod(tmp, 0o1777)
            folder = os.path.join(tmp, "reflow-sandbox-65534")
            if planted:  # another user (root here) made it first, open to all
                os.mkdir(folder)
                os.chmod(folder, 0o777)
                assert as_nobody(tmp) == (
                    f"refused sandbox: lock folder {folder} is not this user's own (owner "
                    "uid 0, mode 777): remove it, or set REFLOW_SANDBOX_LOCKS"
                )
            else:
                assert as_nobody(tmp) == f"claimed [0, 1] {folder} 0o700"
                assert os.stat(folder).st_uid == 65534
        finally:
            shutil.rmtree(tmp)
