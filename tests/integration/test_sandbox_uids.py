"""The sandbox's uid pool under load: gradings that need two processes at once claim their
uids together, so more gradings than the pool has pairs for queue instead of each holding
one uid and waiting for a second; a pool that would run programs as existing accounts is
refused."""

from __future__ import annotations

import os
import shutil
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
    sandbox = Sandbox(LIMITS, isolation="bwrap", uid_slots=4, uid_wait_s=60)
    spec = parse_tests(TESTS)
    assert spec.kind in ("script", "asserts")  # graded by two processes and the relay

    def grade(_: int) -> float:
        return run_tests(PROGRAM, spec, sandbox, total_timeout_s=120).score

    with ThreadPoolExecutor(6) as ex:
        assert list(ex.map(grade, range(6))) == [1.0] * 6


def test_a_pool_over_existing_accounts_is_refused():
    with pytest.raises(SandboxError, match=r"sandbox.uid_base: .* include accounts \(root \(0\)"):
        Sandbox(LIMITS, isolation="bwrap", uid_base=0, uid_slots=2)
