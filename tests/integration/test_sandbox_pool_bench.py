"""The sandbox pool benchmark's two graders are real graders: each passes a reference
and fails the same task with a wrong program, on every set it measures."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from benchmarks.sandbox_pool import grade_one_process, grade_reflow, task_sets
from runtime.config.schema import SandboxConfig

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap not installed")

WRONG = "def _nothing():\n    pass\nprint(0)\n"


@pytest.mark.parametrize("name", ["HumanEval", "MBPP", "APPS"])
def test_both_graders_pass_a_reference_and_fail_a_wrong_program(name):
    sets = task_sets()
    if name not in sets:
        pytest.skip(f"{name} needs ../shared/data")
    task = sets[name][0]
    settings = replace(SandboxConfig(), uid_slots=8)
    wrong = replace(task, program=WRONG)
    for grade in (grade_one_process, grade_reflow):
        assert grade(task, settings)[0] is True, grade.__name__
        assert grade(wrong, settings)[0] is False, grade.__name__
