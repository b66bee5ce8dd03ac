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
