"""The third adversarial pass on the code grader (issue "Rewards and runs that hold under
hostile input"): each class a wrong program scored 1 or a right one 0 in, with the attack
and the correct program in the same style."""

from __future__ import annotations

import pytest

from runtime.workloads.rewards.code import TestSpec, parse_tests
from tests.integration import test_grader_second_pass as second_pass

# the same bubblewrap condition, sandbox fixture and grading call as the second pass
pytestmark = second_pass.pytestmark
sandbox = second_pass.sandbox
grade = second_pass.grade


# -- 1. a prelude name as APPS's fn_name: the call reached the prelude's function --

GCD = parse_tests({"fn_name": "gcd", "inputs": [[12, 18], [7, 5]], "outputs": [6, 1]})
SQRT = parse_tests({"fn_name": "sqrt", "inputs": [[16]], "outputs": [4.0]})


@pytest.mark.parametrize(
    "program", ["", "import math\n", "def solve(a, b=0):\n    return 0\n", "x = 1\n"]
)
@pytest.mark.parametrize("tests", [GCD, SQRT], ids=["gcd", "sqrt"])
def test_a_program_that_defines_no_prelude_named_entry_scores_0(program, tests, sandbox):
    r = grade(program, tests, sandbox)
    assert r.score == 0.0, r
    assert "is not defined by the program" in r.error, r.error


def test_a_program_that_defines_or_imports_the_entry_itself_scores_1(sandbox):
    right = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
    assert grade(right, GCD, sandbox).score == 1.0
    assert grade("from math import gcd\n", GCD, sandbox).score == 1.0  # its own import
    assert grade("import math\n\ngcd = math.gcd\n", GCD, sandbox).score == 1.0
    assert grade("def sqrt(x):\n    return x ** 0.5\n", SQRT, sandbox).score == 1.0
    method = (
        "class Solution:\n"
        "    def gcd(self, a, b):\n"
        "        return a if not b else self.gcd(b, a % b)\n"
    )
    assert grade(method, GCD, sandbox).score == 1.0


# -- 2. a prelude name on the expected side: heapq's names, star-imported for every test --

HEAP = parse_tests(
    [
        "assert k_smallest([5, 1, 4, 2], 2) == nsmallest(2, [5, 1, 4, 2])",
        "assert k_smallest([3, 3, 9], 1) == nsmallest(1, [3, 3, 9])",
    ]
)


def test_a_program_that_defines_the_expected_sides_name_does_not_decide_it(sandbox):
    attack = "def nsmallest(k, x):\n    return 'same'\n\ndef k_smallest(x, k):\n    return 'same'\n"
    r = grade(attack, HEAP, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "wrong_answer", r


def test_a_right_program_need_not_define_the_expected_sides_name(sandbox):
    right = "import heapq\n\ndef k_smallest(x, k):\n    return heapq.nsmallest(k, x)\n"
    assert grade(right, HEAP, sandbox).score == 1.0
    # its own helper of that name is its business: the expected side stays heapq's
    helper = (
        "def nsmallest(k, x):\n    return sorted(x)[:k]\n\n"
        "def k_smallest(x, k):\n    return nsmallest(k, x)\n"
    )
    assert grade(helper, HEAP, sandbox).score == 1.0


def test_a_function_under_test_named_like_a_heapq_function_is_still_the_programs(sandbox):
    # nothing else in the test can be the function under test (as MBPP 126's ``sum``)
    tests = parse_tests(["assert merge([1, 4], [2, 3]) == [1, 2, 3, 4]"])
    assert grade("def merge(a, b):\n    return sorted(a + b)\n", tests, sandbox).score == 1.0
    assert grade("", tests, sandbox).score == 0.0


# -- 3. identity: every answer crossed as a copy, so ``b is not a`` held for any program --


def checked(body: str, entry: str) -> TestSpec:
    lines = "".join(f"    {line}\n" for line in body.strip().splitlines())
    return parse_tests({"test": f"def check(candidate):\n{lines}", "entry_point": entry})


NEW_LIST = checked("a = [3, 1, 2]\nb = candidate(a)\nassert b == [1, 2, 3]\nassert b is not a", "f")
SAME_LIST = checked("a = [3, 1, 2]\nassert candidate(a) is a\nassert a == [1, 2, 3]", "f")
IN_PLACE = "def f(x):\n    x.sort()\n    return x\n"
COPY = "def f(x):\n    return sorted(x)\n"


def test_a_program_that_returns_its_argument_fails_a_test_that_wants_a_new_object(sandbox):
    r = grade(IN_PLACE, NEW_LIST, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "wrong_answer", r
    assert grade(COPY, NEW_LIST, sandbox).score == 1.0


def test_a_program_that_returns_its_argument_passes_a_test_that_wants_the_same_one(sandbox):
    assert grade(IN_PLACE, SAME_LIST, sandbox).score == 1.0
    assert grade(COPY, SAME_LIST, sandbox).score == 0.0


# -- 4. eval of a returned expression: refused in the tests' process, so right ones scored 0 --

EVAL = checked("assert eval(candidate(10)) == 55\nassert eval(candidate(3)) == 6", "sum_expr")


def test_an_expression_the_program_returns_is_evaluated_in_its_process(sandbox):
    right = "def sum_expr(n):\n    return ' + '.join(str(i) for i in range(1, n + 1))\n"
    assert grade(right, EVAL, sandbox).score == 1.0
    assert grade("def sum_expr(n):\n    return '1 + 1'\n", EVAL, sandbox).score == 0.0


@pytest.mark.parametrize(
    ("expression", "status"),
    [
        ("__import__('os')._exit(0)", "early_exit"),  # ends the program's process only
        ("object()", "non_plain"),
        ("float('nan')", "non_plain"),
        ("__import__('builtins').__dict__.update(AssertionError=None)", "wrong_answer"),
    ],
)
def test_an_expression_cannot_reach_the_tests_process(expression, status, sandbox):
    program = f"def sum_expr(n):\n    return {expression!r}\n"
    r = grade(program, EVAL, sandbox)
    assert r.score == 0.0 and r.failures[0].status == status, r


# -- 5. source inspection: getsource of the stand-in raised, so right ones scored 0 --

NO_SORTED = checked(
    "import inspect\n"
    "assert 'sorted' not in inspect.getsource(candidate)\n"
    "assert candidate([3, 1, 2]) == [1, 2, 3]",
    "my_sort",
)
BUBBLE = (
    "def my_sort(x):\n"
    "    out = list(x)\n"
    "    for i in range(len(out)):\n"
    "        for j in range(len(out) - 1 - i):\n"
    "            if out[j] > out[j + 1]:\n"
    "                out[j], out[j + 1] = out[j + 1], out[j]\n"
    "    return out\n"
)


def test_a_test_reads_the_programs_own_source(sandbox):
    assert grade(BUBBLE, NO_SORTED, sandbox).score == 1.0
    r = grade("def my_sort(x):\n    return sorted(x)\n", NO_SORTED, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "wrong_answer", r
    # a name with no source of its own (bound to a builtin) has none to read
    assert grade("my_sort = sorted\n", NO_SORTED, sandbox).score == 0.0


def test_program_sources_are_the_programs_text():
    from runtime.workloads.rewards.code.names import program_sources

    program = (
        "import os\n\n@staticmethod\ndef f(x):\n    return x\n\n"
        "class S:\n    def g(self):\n        return 1\n"
    )
    got = program_sources(program)
    assert got["f"] == "@staticmethod\ndef f(x):\n    return x\n"
    assert got["S.g"] == "    def g(self):\n        return 1\n"
    assert got["S"].startswith("class S:") and "os" not in got
    assert program_sources("def (:") == {}


# APPS's harness runs a stdin program inside a function: 3 of the APPS sample's 101
# references return at their top level, which scored 0 here ('return' outside function).
TOP_LEVEL_RETURN = """n = int(input())
if n < 0:
    print("negative")
    return
for i in range(n):
    print(i * {k})
"""
COUNT = parse_tests({"inputs": ["3\n", "-1\n"], "outputs": ["0\n2\n4\n", "negative\n"]})


def test_a_stdin_program_that_returns_at_its_top_level_runs_as_apps_runs_it(sandbox):
    assert grade(TOP_LEVEL_RETURN.format(k=2), COUNT, sandbox).score == 1.0
    wrong = grade(TOP_LEVEL_RETURN.format(k=3), COUNT, sandbox)
    assert wrong.score == 0.0 and wrong.passed == 1
    # a program that Python accepts runs as written, line numbers and all
    broken = grade("n = int(input())\nprint(undefined_name)\n", COUNT, sandbox)
    assert 'File "main.py", line 2' in broken.failures[0].got
    # and a wrapped one's lines are the program's own too
    wrapped = grade("n = int(input())\nprint(undefined_name)\nreturn\n", COUNT, sandbox)
    assert 'File "main.py", line 2' in wrapped.failures[0].got, wrapped.failures[0].got


def test_only_a_return_outside_every_function_counts_as_top_level():
    from runtime.workloads.rewards.code.names import program_bindings

    def returns_at_top_level(program: str) -> bool:
        return program_bindings(program).returns_at_top_level

    assert returns_at_top_level("if True:\n    return\n")
    nested = "for x in []:\n    try:\n        return\n    except E:\n        pass\n"
    assert returns_at_top_level(nested)
    assert not returns_at_top_level("def f():\n    return 1\nprint(f())\n")
    assert not returns_at_top_level("class A:\n    def m(self):\n        return 2\n")
    assert not returns_at_top_level("f = lambda: 1\n")
    assert not returns_at_top_level("def broken(:\n")
