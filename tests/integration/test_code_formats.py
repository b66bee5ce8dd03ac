"""The public code-RL formats graded for real, each read through its ``data.fields``
mapping as a recipe would read it (docs/code-reward.md lists the mappings): KodCode's
pytest tests and LeetCodeDataset on the slices shipped in recipes/data, CodeContests
(stdin/stdout, several tests each) on ../shared/data, LiveCodeBench and the verifiable-
coding sets on records written here (no licensed copy with tests was at hand)."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.config.schema import SandboxConfig
from runtime.data.datasets import load_records
from runtime.workloads.rewards.code import parse_tests, run_tests, sandbox_for
from runtime.workloads.rewards.code import tests_of as record_tests
from runtime.workloads.rewards.code.spec import check_code_tests
from tests.helpers import DATA_SLICES, SHARED_DATA, needs_full_data

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap not installed (make install adds it)"
)

# The mappings docs/code-reward.md gives, as a recipe's data.fields.
KODCODE_FIELDS = {"prompt": "question", "tests": "test_code"}
LEETCODE_FIELDS = {
    "prompt": "query",
    "tests": "test",
    "entry_point": "entry_point",
    "preamble": "prompt",
}


def _grade(pairs):
    sb = sandbox_for(SandboxConfig(test_timeout_s=30.0))
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda p: run_tests(p[0], p[1], sb, total_timeout_s=60), pairs))


def _right_and_wrong(rows, solution: str) -> None:
    specs = [parse_tests(record_tests(r)) for r in rows]
    results = _grade([(r[solution], s) for r, s in zip(rows, specs, strict=True)])
    assert [(i, x.error) for i, x in enumerate(results) if x.score != 1] == []
    half = len(rows) // 2
    swapped = _grade([(rows[(i + half) % len(rows)][solution], s) for i, s in enumerate(specs)])
    assert [i for i, x in enumerate(swapped) if x.score != 0] == []


def test_kodcode_pytest_tests_through_their_mapping():
    path = DATA_SLICES / "kodcode/KodCode-prefill-demo-first27.jsonl.gz"
    rows = load_records(path, fields=KODCODE_FIELDS, required=("prompt", "tests"))
    check_code_tests(rows, path)
    # A pytest file is one test per function; one that runs its tests itself is a script.
    kinds = [parse_tests(record_tests(r)).kind for r in rows]
    assert set(kinds) == {"asserts", "script"} and kinds.count("asserts") >= 20
    _right_and_wrong(rows, "solution")


def test_leetcode_through_its_mapping():
    path = DATA_SLICES / "leetcode/LeetCodeDataset-v0.1.0-train-nodes.jsonl.gz"
    rows = load_records(path, fields=LEETCODE_FIELDS, required=("prompt", "tests"))[:20]
    check_code_tests(rows, path)
    assert rows[0]["prompt"].startswith(rows[0]["query"][:20])  # the role, not the column
    assert "class ListNode" in rows[0]["preamble"]
    _right_and_wrong(rows, "completion")


@needs_full_data("the CodeContests test split (code_contests/test.json)")
def test_codecontests_stdin_stdout_with_several_tests():
    problems = json.loads((SHARED_DATA / "code_contests/test.json").read_text())[:20]
    specs = [parse_tests(p["tests"]) for p in problems]
    assert all(s.kind == "stdio" for s in specs) and max(s.total for s in specs) > 20
    # No reference solutions ship with this split: an oracle that answers each listed input
    # is right by construction, and one that gives every input the first answer is wrong
    # wherever the answers differ.
    oracles = [
        "import sys\nanswers = "
        + repr(dict(zip(s.inputs, s.outputs, strict=True)))
        + "\nprint(answers[sys.stdin.read()])\n"
        for s in specs
    ]
    assert [x.error for x in _grade(list(zip(oracles, specs, strict=True))) if x.score != 1] == []
    first = [f"print({s.outputs[0]!r})\n" for s in specs]
    differing = [i for i, s in enumerate(specs) if len(set(s.outputs)) > 1]
    graded = _grade([(first[i], specs[i]) for i in differing])
    assert differing and all(x.score == 0 for x in graded)


def test_livecodebench_functional_and_stdin_records(tmp_path):
    functional = {
        "question_content": "Return the indices of the two numbers adding up to target.",
        "public_test_cases": json.dumps(
            [{"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"}]
        ),
        "private_test_cases": json.dumps(
            [{"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"}]
        ),
        "metadata": json.dumps({"func_name": "twoSum"}),
    }
    stdin = {
        "question_content": "Print the sum of two integers.",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": "",
        "metadata": "{}",
    }
    path = tmp_path / "lcb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (functional, stdin)))
    fields = {"prompt": "question_content", "tests": "public_test_cases"}
    rows = load_records(path, fields=fields, required=("prompt",))
    # The whole record holds the tests (public and private, and the metadata).
    two_sum = parse_tests(record_tests(rows[0]))
    add = parse_tests(record_tests(rows[1]))
    assert (two_sum.kind, two_sum.total, add.kind) == ("call", 2, "stdio")
    right = (
        "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n"
        "                return [seen[target - x], i]\n            seen[x] = i\n"
    )
    sb = sandbox_for()
    assert run_tests(right, two_sum, sb).score == 1.0
    assert run_tests(right.replace("[seen[target - x], i]", "[i, 0]"), two_sum, sb).score == 0
    assert run_tests("a, b = map(int, input().split())\nprint(a + b)", add, sb).score == 1.0
    assert run_tests("print(3)", add, sb).passed == 1  # the only test happens to be 3


def test_verifiable_coding_verification_info():
    info = {
        "language": "python",
        "test_cases": [
            {"type": "stdin_stdout", "input": "3\n", "output": "9\n"},
            {"type": "stdin_stdout", "input": "12\n", "output": "144\n"},
        ],
    }
    spec = parse_tests(record_tests({"tests": json.dumps({"verification_info": info})}))
    sb = sandbox_for()
    assert run_tests("n = int(input())\nprint(n * n)", spec, sb).score == 1.0
    assert run_tests("n = int(input())\nprint(n + n)", spec, sb).score == 0.0
