"""Class-based call targets in the code grader: LeetCode's ``Solution().method`` as an
entry point, as a test's own last line and called in asserts; objects of the program's
classes whose methods the tests call; linked lists and trees as answers. The reference
solutions of the shipped LeetCodeDataset slices all score 1 and wrong programs 0, and every
forgery of tests/integration/test_grader_attacks.py is tried in each class-based form."""

from __future__ import annotations

import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.config.schema import SandboxConfig
from runtime.data.datasets import load_records
from runtime.workloads.rewards.code import TestSpec, parse_tests, run_tests, sandbox_for
from tests.helpers import DATA_SLICES
from tests.integration.test_grader_attacks import ATTACKS, RIGHT, WRONG

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap not installed (make install adds it)"
)

LEETCODE = DATA_SLICES / "leetcode"
CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(2, 2) == 4\n"

# The same two tests as test_grader_attacks' MBPP/HUMANEVAL, with the function under test
# a method of class Solution, in the three ways datasets write that.
CLASS_STYLES = {
    "entry_point": parse_tests({"test": CHECK, "entry_point": "Solution().add"}),
    "test_calls_check": parse_tests({"test": CHECK + "\ncheck(Solution().add)\n"}),
    "asserts": parse_tests(
        ["assert Solution().add(1, 2) == 3", "assert Solution().add(2, 2) == 4"]
    ),
}


def as_class(program: str) -> str:
    """``program``'s ``add`` as LeetCode writes it: a method of class Solution (which calls
    the program's own function, so each attack runs as it was written)."""
    return program + "\n\nclass Solution:\n    def add(self, a, b):\n        return add(a, b)\n"


@pytest.fixture(scope="module")
def sandbox():
    return sandbox_for()


def score(program: str, tests: TestSpec, sandbox) -> float:
    return run_tests(program, tests, sandbox, test_timeout_s=4, total_timeout_s=20).score


@pytest.mark.parametrize("style", sorted(CLASS_STYLES))
def test_a_class_based_target_grades_right_and_wrong_programs(style, sandbox):
    assert score(as_class(RIGHT), CLASS_STYLES[style], sandbox) == 1.0
    assert score(as_class(WRONG), CLASS_STYLES[style], sandbox) == 0.0


@pytest.mark.parametrize("style", sorted(CLASS_STYLES))
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_every_forgery_scores_0_in_class_form(attack, style, sandbox):
    r = run_tests(
        as_class(ATTACKS[attack]),
        CLASS_STYLES[style],
        sandbox,
        test_timeout_s=4,
        total_timeout_s=20,
    )
    assert r.score == 0.0 and r.passed == 0, (attack, r)


def test_a_plain_entry_point_may_name_a_method_of_solution(sandbox):
    tests = parse_tests({"test": CHECK, "entry_point": "add"})
    assert (
        score(
            as_class(RIGHT)
            .replace("def add(a, b)", "def _add(a, b)")
            .replace("return add(a, b)", "return _add(a, b)"),
            tests,
            sandbox,
        )
        == 1.0
    )
    assert (
        score("class Solution:\n    def add(self, a, b):\n        return a - b\n", tests, sandbox)
        == 0.0
    )


def test_constructor_arguments_and_state_across_calls(sandbox):
    # Class(args).method: the object is built in the program's run, once per check, as
    # the dataset's own harness builds it; the tests see only plain results.
    test = "def check(candidate):\n    assert candidate(1) == 11\n    assert candidate(1) == 12\n"
    tests = parse_tests({"test": test, "entry_point": "Acc(10).add"})
    right = (
        "class Acc:\n    def __init__(self, s):\n        self.s = s\n"
        "    def add(self, x):\n        self.s += x\n        return self.s\n"
    )
    assert score(right, tests, sandbox) == 1.0
    assert score(right.replace("self.s += x", "pass"), tests, sandbox) == 0.0


def test_a_design_problem_calls_methods_of_the_program_object(sandbox):
    tests = parse_tests(
        [
            "obj = MinStack()\nobj.push(3)\nobj.push(1)\nassert obj.getMin() == 1\n"
            "obj.pop()\nassert obj.getMin() == 3"
        ]
    )
    right = (
        "class MinStack:\n    def __init__(self):\n        self.s = []\n"
        "    def push(self, x):\n        self.s.append(x)\n"
        "    def pop(self):\n        self.s.pop()\n"
        "    def getMin(self):\n        return min(self.s)\n"
    )
    assert score(right, tests, sandbox) == 1.0
    assert score(right.replace("min(self.s)", "self.s[0]"), tests, sandbox) == 0.0
    # An object of the program's class is never compared: only plain results are.
    rigged = right.replace("return min(self.s)", "return self")
    r = run_tests(rigged, tests, sandbox, test_timeout_s=4)
    assert r.score == 0.0 and r.failures[0].status == "non_plain", r


def test_linked_lists_and_trees_cross_as_data(sandbox):
    test = (
        "def check(candidate):\n"
        "    assert is_same_list(candidate(head=list_node([1, 2, 3])), list_node([3, 2, 1]))\n"
        "    assert is_same_list(candidate(head=list_node([])), list_node([]))\n"
    )
    tests = parse_tests({"test": test, "entry_point": "Solution().reverseList"})
    right = (
        "class Solution:\n    def reverseList(self, head: Optional[ListNode]) -> "
        "Optional[ListNode]:\n        prev = None\n        while head:\n"
        "            head.next, prev, head = prev, head, head.next\n        return prev\n"
    )
    assert score(right, tests, sandbox) == 1.0
    assert score(right.replace("return prev", "return head"), tests, sandbox) == 0.0
    # The judging helper is the tests' own: a program's is_same_list decides nothing.
    rigged = "def is_same_list(a, b):\n    return True\n\n" + right.replace(
        "return prev", "return None"
    )
    assert score(rigged, tests, sandbox) == 0.0
    # A cycle is refused rather than walked.
    cyclic = right.replace("return prev", "prev.next = prev\n        return prev")
    r = run_tests(cyclic, tests, sandbox, test_timeout_s=4)
    assert r.score == 0.0 and r.failures[0].status == "non_plain", r

    tree = parse_tests(
        {
            "test": "def check(candidate):\n    assert is_same_tree(candidate(root=tree_node("
            "[4, 2, 7, 1, 3])), tree_node([4, 7, 2, None, None, 3, 1]))\n",
            "entry_point": "Solution().invertTree",
        }
    )
    invert = (
        "class Solution:\n    def invertTree(self, root):\n        if root:\n"
        "            root.left, root.right = self.invertTree(root.right), "
        "self.invertTree(root.left)\n        return root\n"
    )
    assert score(invert, tree, sandbox) == 1.0
    assert score(invert.replace("if root:", "if False:"), tree, sandbox) == 0.0


def _leetcode(name: str) -> list[dict]:
    return load_records(LEETCODE / name)


def _grade(pairs):
    sb = sandbox_for(SandboxConfig(test_timeout_s=30.0))
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda p: run_tests(p[0], p[1], sb, total_timeout_s=60), pairs))


def _spec(row: dict) -> TestSpec:
    return parse_tests(
        {"test": row["test"], "entry_point": row["entry_point"], "preamble": row["prompt"]}
    )


def _renamed(program: str, entry: str, to: str) -> str:
    method = entry.split(".")[-1]
    return re.sub(rf"def {re.escape(method)}\(", f"def {to.split('.')[-1]}(", program)


@pytest.mark.parametrize(
    "name", ["LeetCodeDataset-v0.2.0-test.jsonl.gz", "LeetCodeDataset-v0.1.0-train-nodes.jsonl.gz"]
)
def test_leetcode_references_score_1_and_wrong_programs_0(name):
    rows = _leetcode(name)
    results = _grade([(r["completion"], _spec(r)) for r in rows])
    failed = [(r["task_id"], x.error) for r, x in zip(rows, results, strict=True) if x.score != 1]
    assert failed == []
    # Wrong programs: the solution of a problem half the file away, its method renamed to
    # this problem's; and a method that returns None.
    half = len(rows) // 2
    wrong = [
        (
            _renamed(
                rows[(i + half) % len(rows)]["completion"],
                rows[(i + half) % len(rows)]["entry_point"],
                r["entry_point"],
            ),
            _spec(r),
        )
        for i, r in enumerate(rows)
    ]
    method = [r["entry_point"].split(".")[-1] for r in rows]
    wrong += [
        (f"class Solution:\n    def {m}(self, *a, **k):\n        return None\n", _spec(r))
        for m, r in zip(method, rows, strict=True)
    ]
    passed = [
        (p[1].fn_name, x.error) for p, x in zip(wrong, _grade(wrong), strict=True) if x.score != 0
    ]
    assert passed == []


def test_the_issue_shapes_all_grade(sandbox):
    # As a user wrote them: the preamble in the program and the check call in the test.
    row = _leetcode("LeetCodeDataset-v0.2.0-test.jsonl.gz")[0]
    program = row["prompt"] + row["completion"]
    call = f"\n\ncheck({row['entry_point']})\n"
    assert (
        score(program, parse_tests({"program": program, "test": row["test"] + call}), sandbox)
        == 1.0
    )
    assert (
        score(
            program, parse_tests({"test": row["test"], "entry_point": row["entry_point"]}), sandbox
        )
        == 1.0
    )
    method = row["entry_point"].split(".")[-1]
    assert score(program, parse_tests({"test": row["test"], "entry_point": method}), sandbox) == 1.0
