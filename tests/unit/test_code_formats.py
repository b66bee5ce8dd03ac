"""The public code-RL formats parse into the grader's test styles, and what cannot be graded
is refused in one line naming the field (pure parsing; grading them is
tests/integration/test_code_formats.py)."""

from __future__ import annotations

import base64
import json
import pickle
import zlib

import pytest

from runtime.config.recipe import build_config
from runtime.data.datasets import DatasetError, check_dataset
from runtime.workloads.rewards.code import TestSpecError, parse_tests
from runtime.workloads.rewards.code import tests_of as record_tests
from runtime.workloads.rewards.code.spec import check_code_tests, record_check

PYTEST_FILE = """import pytest
from solution import add

def test_add():
    assert add(1, 2) == 3

@pytest.mark.parametrize("a, b, s", [(1, 1, 2), (2, 5, 7)])
def test_many(a, b, s):
    assert solution.add(a, b) == s
"""


def test_a_pytest_file_is_one_test_per_function_and_parameter_set():
    spec = parse_tests({"test": PYTEST_FILE})
    assert spec.kind == "asserts" and spec.total == 3
    assert "from solution" not in spec.script and "def test_" not in spec.script
    assert spec.inputs[1] == "# test_many\na = 1\nb = 1\ns = 2\nassert add(a, b) == s\n"
    assert parse_tests(PYTEST_FILE).total == 3  # a bare string too


@pytest.mark.parametrize(
    "test, message",
    [
        ("from solution import f\ndef test_x(tmp_path):\n    assert f(1)\n", "pytest fixture"),
        ("import pytest\n@pytest.fixture\ndef test_x():\n    pass\n", "pytest.fixture"),
        ("import solution as s\ndef test_x():\n    assert s.f(1)\n", "import solution as"),
        ("from solution import f\ndef test_x():\n    return f(1)\n", "returns"),
        (
            "import pytest\n@pytest.mark.parametrize('a', x)\ndef test_x(a):\n    pass\n",
            "literal names and values",
        ),
    ],
)
def test_pytest_files_it_cannot_run_are_refused_in_one_line(test, message):
    with pytest.raises(TestSpecError, match=message) as info:
        parse_tests({"test": test})
    assert "\n" not in str(info.value)


def _pickled(cases: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def test_livecodebench_stdin_and_functional_tests():
    stdin = {
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _pickled([{"input": "2 2\n", "output": "4\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }
    spec = parse_tests(stdin)
    assert (spec.kind, spec.inputs, spec.outputs) == ("stdio", ["1 2\n", "2 2\n"], ["3\n", "4\n"])
    functional = {
        "public_test_cases": [{"input": "[1, 2]\n3", "output": "[0, 1]", "testtype": "functional"}],
        "metadata": json.dumps({"func_name": "twoSum"}),
    }
    spec = parse_tests(functional)
    assert (spec.kind, spec.fn_name, spec.inputs, spec.outputs) == (
        "call",
        "twoSum",
        [[[1, 2], 3]],
        [[0, 1]],
    )


def test_livecodebench_private_cases_never_unpickle_a_class():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    evil = base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()
    with pytest.raises(TestSpecError, match="private_test_cases is neither JSON"):
        parse_tests({"private_test_cases": evil, "metadata": "{}"})
    with pytest.raises(TestSpecError, match=r"functional tests need metadata\.func_name"):
        parse_tests(
            {"public_test_cases": [{"input": "1", "output": "1", "testtype": "functional"}]}
        )


def test_verifiable_coding_verification_info():
    info = {
        "language": "python",
        "test_cases": [{"type": "stdin_stdout", "input": "5\n", "output": "25\n"}],
    }
    spec = parse_tests({"verification_info": json.dumps(info)})
    assert (spec.kind, spec.inputs, spec.outputs) == ("stdio", ["5\n"], ["25\n"])
    with pytest.raises(TestSpecError, match="language 'cpp'"):
        parse_tests({"verification_info": {**info, "language": "cpp"}})
    with pytest.raises(TestSpecError, match="test case type"):
        parse_tests({"test_cases": [{"type": "function_call", "input": "1", "output": "1"}]})


def test_a_record_carries_its_entry_point_preamble_and_tolerance_with_its_tests():
    record = {
        "tests": "def check(candidate):\n    assert candidate(1) == 2\n",
        "entry_point": "Solution().f",
        "preamble": "from typing import *\n",
    }
    spec = parse_tests(record_tests(record))
    assert (spec.kind, spec.fn_name, spec.preamble) == (
        "script",
        "Solution",
        "from typing import *\n",
    )
    apps = {"tests": json.dumps({"inputs": ["1\n"], "outputs": ["0.5\n"]}), "tolerance": 1e-6}
    assert parse_tests(record_tests(apps)).tolerance == 1e-6


def test_launch_refuses_tests_it_cannot_grade_naming_the_record():
    records = [
        {"tests": "def check(c):\n    assert c(1)\n", "entry_point": "Solution().f"},
        {"tests": "def check(c):\n    assert c(1)\n", "entry_point": "Solution(x).f"},
    ]
    with pytest.raises(DatasetError, match=r"data.jsonl: record 1: tests: entry_point"):
        check_code_tests(records, "data.jsonl")


def test_the_launch_check_of_a_kind_with_tests_is_the_graders(tmp_path):
    """``reflow launch`` hands check_dataset the kind's record check: the code kind's
    refuses a file whose tests it cannot grade; a kind without tests has none."""
    assert record_check("code_agent") is check_code_tests
    assert record_check("math") is None and record_check("custom") is None
    bad = {"prompt": "p", "tests": "def check(c):\n    assert c(1)\n", "entry_point": "S(x).f"}
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(bad) + "\n")
    cfg = build_config({"workload": {"kind": "code_agent"}, "data": {"train": str(path)}})
    with pytest.raises(DatasetError, match=r"record 0: tests: entry_point"):
        check_dataset(cfg, record_check(cfg.workload.kind))
