"""The second adversarial pass on the code grader (issue "Code rewards on the datasets
people train on"): wrong programs that scored 1.0 and right ones that scored 0, one class
each, with controls in the same style that must pass; and failures that say why."""

from __future__ import annotations

import shutil

import pytest

from runtime.workloads.rewards.code import TestSpec, parse_tests, run_tests, sandbox_for

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap not installed (make install adds it)"
)


@pytest.fixture(scope="module")
def sandbox():
    return sandbox_for()


def grade(program: str, tests: TestSpec, sandbox):
    return run_tests(program, tests, sandbox, test_timeout_s=4, total_timeout_s=20)


def stdio(expected: str, **extra) -> TestSpec:
    return parse_tests({"inputs": [""], "outputs": [expected], **extra})


# -- comparison rules: tolerance belongs to the problem, never to integers or strings --


@pytest.mark.parametrize(
    "printed, expected, right",
    [
        ("100000000000000000000", "100000000000000000000", True),
        ("1e20", "100000000000000000000", False),  # a big integer printed as a float
        ("100000000000000004096", "100000000000000000000", False),  # off by thousands
        ("007", "007", True),
        ("7", "007", False),  # dropped zero-padding
        ("101", "00000101", False),  # binary width
        ("0.10", "0.1", True),  # the same decimal
        ("0.1000004", "0.1", False),  # money or probability: no tolerance stated
    ],
)
def test_stdio_comparison_rules(printed, expected, right, sandbox):
    assert grade(f"print({printed!r})", stdio(expected), sandbox).score == float(right)


def test_a_stated_tolerance_applies_to_numbers_only(sandbox):
    tests = stdio("0.333333 5", tolerance=1e-6)
    assert grade("print(1 / 3, 5)", tests, sandbox).score == 1.0
    assert grade("print(1 / 3, '5.001')", tests, sandbox).score == 0.0


def test_call_results_compare_exactly_up_to_rounding(sandbox):
    tests = parse_tests({"fn_name": "price", "inputs": [[1]], "outputs": [0.1]})
    assert grade("def price(x):\n    return 0.3 - 0.2", tests, sandbox).score == 1.0
    assert grade("def price(x):\n    return 0.1000004", tests, sandbox).score == 0.0


# -- the prelude: names the grader imports for the program are not the program --


def test_an_empty_program_does_not_pass_a_test_of_a_prelude_named_function(sandbox):
    tests = parse_tests(["assert gcd(12, 18) == 6", "assert gcd(7, 5) == 1"])
    assert grade("", tests, sandbox).score == 0.0
    assert grade("import math\n", tests, sandbox).score == 0.0
    right = "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
    assert grade(right, tests, sandbox).score == 1.0
    entry = parse_tests({"test": "def check(c):\n    assert c(4, 6) == 2\n", "entry_point": "gcd"})
    assert grade("x = 1\n", entry, sandbox).score == 0.0
    assert grade(right, entry, sandbox).score == 1.0


def test_a_test_that_never_calls_the_program_fails(sandbox):
    r = grade(
        "def f(x):\n    return x\n", parse_tests(["assert sorted([2, 1]) == [1, 2]"]), sandbox
    )
    assert r.score == 0.0 and r.failures[0].status == "no_program_call"


# -- semantics kept by record and replay --


def test_state_kept_between_asserts_is_seen_as_in_the_datasets_harness(sandbox):
    tests = parse_tests(["assert nxt() == 1", "assert nxt() == 2"])
    assert grade("n = [0]\ndef nxt():\n    n[0] += 1\n    return n[0]\n", tests, sandbox).score == 1
    # One run per assert hid this: every call was the first.
    assert grade("def nxt(_n=[0]):\n    return 1\n", tests, sandbox).score == 0.0


def test_nan_cannot_pass_a_negated_tolerance_check(sandbox):
    tests = parse_tests(["assert not abs(area(2) - 12.566370614359172) > 1e-6"])
    assert grade("def area(r):\n    return float('nan')\n", tests, sandbox).score == 0.0
    assert (
        grade("import math\ndef area(r):\n    return math.pi * r * r\n", tests, sandbox).score == 1
    )


# -- false negatives --


def test_big_integer_results_are_graded_not_an_early_exit(sandbox):
    big = 7**6000  # 5,071 digits: over the 4,300 a str() of an int may have
    call = parse_tests({"fn_name": "f", "inputs": [[6000]], "outputs": [big]})
    assert grade("def f(n):\n    return 7 ** n\n", call, sandbox).score == 1.0
    assert grade("def f(n):\n    return 7 ** n + 1\n", call, sandbox).score == 0.0
    asserts = parse_tests(["assert f(6000) == 7 ** 6000", "assert f(6000) % 10 == 1"])
    assert grade("def f(n):\n    return 7 ** n\n", asserts, sandbox).score == 1.0
    assert grade("def f(n):\n    return 7 ** n - 2\n", asserts, sandbox).score == 0.0


def test_a_5000_digit_line_is_compared_not_parsed(sandbox):
    digits = "9" * 5000
    assert grade(f"print('{digits}')", stdio(digits), sandbox).score == 1.0
    assert grade(f"print('{digits}8')", stdio(digits), sandbox).score == 0.0


# -- failures that say why --


def test_failures_say_why(sandbox):
    tests = parse_tests({"test": "def check(c):\n    assert c(1) == 1\n", "entry_point": "f"})
    r = grade("def f(x):\n    return x // 0\n", tests, sandbox)
    assert r.error.startswith("test 0: error: ZeroDivisionError"), r.error
    r = grade("def f(x):\n    return x + 1\n", tests, sandbox)
    assert r.error.startswith("test 0: wrong_answer: AssertionError at assert c(1) == 1"), r.error
    r = grade("class Solution:\n    pass\n\ndef f(x):\n    return Solution()\n", tests, sandbox)
    assert r.error == (
        "test 0: non_plain: f() returned a Solution object where a plain value was expected"
    ), r.error
    r = run_tests("import time\ntime.sleep(30)", stdio("1"), sandbox, test_timeout_s=2)
    assert r.error == "test 0: timeout: timeout after 2 s", r.error
    r = grade("print(2)", stdio("1"), sandbox)
    assert r.error == "test 0: wrong_answer: expected 1, got 2", r.error
    assert r.as_json(explain=True)["tests"] == ["test 0: wrong_answer: expected 1, got 2"]


# -- expected values reaching the program's process --

# A wrong program that searches everything its process holds (the frames that called it,
# their code's constants, every object the collector tracks) for the expected answer
# 424242 and returns it when found: it scores 1.0 wherever a test's answer reaches the
# process the program runs in.
SNOOP = (
    "import gc, sys\n\ndef f(*args):\n"
    "    want = int('4242' + '42')  # never a constant of its own code\n"
    "    seen = set()\n    frame = sys._getframe(1)\n"
    "    while frame is not None:\n"
    "        seen |= set(frame.f_code.co_consts) | set(map(repr, frame.f_locals.values()))\n"
    "        frame = frame.f_back\n"
    "    for o in gc.get_objects():\n"
    "        if type(o) is type(f.__code__):\n            seen |= set(o.co_consts)\n"
    "        elif type(o) in (list, tuple, dict):\n            seen |= set(map(repr, o))\n"
    "    if want in seen or str(want) in seen:\n        return want\n"
    "    return 0\n"
)
LEAKS = {
    "comprehension": "assert [f(x) for x in [1]] == [424242]\n",
    "tuple_assignment": "x, want = 1, 424242\nassert f(x) == want\n",
    "reused_variable": "x = 424242\nassert f(1) == x\nx = 3\nassert f(x) == 0\n",
    "match": (
        "match f(1):\n    case 424242:\n        pass\n    case _:\n        raise AssertionError\n"
    ),
    "if_header": "if f(1) != 424242:\n    raise AssertionError('wrong')\n",
    "table": "for arg, want in [(1, 424242)]:\n    assert f(arg) == want\n",
    "helper_handed_the_answer": (
        "def check(candidate, want):\n    assert candidate(1) == want\n\ncheck(f, 424242)\n"
    ),
}


@pytest.mark.parametrize("style", sorted(LEAKS))
def test_no_expected_value_reaches_the_program(style, sandbox):
    tests = parse_tests(LEAKS[style])
    r = grade(SNOOP, tests, sandbox)
    assert r.score == 0.0, (style, r)
    # The control: a program that computes the answer passes the same test.
    right = "def f(*args):\n    return 424242 if args != (3,) else 0\n"
    assert grade(right, tests, sandbox).score == 1.0, style


# -- semantics the old record/replay changed --


def test_an_argument_the_program_changes_is_changed_for_the_test(sandbox):
    tests = parse_tests(
        ["xs = [3, 1, 2]\nassert sort_in_place(xs) is None\nassert xs == [1, 2, 3]"]
    )
    assert grade("def sort_in_place(xs):\n    xs.sort()\n", tests, sandbox).score == 1.0
    assert grade("def sort_in_place(xs):\n    pass\n", tests, sandbox).score == 0.0


def test_the_programs_random_is_not_the_tests(sandbox):
    # The test draws its inputs; a program that reseeds or patches random changes only its
    # own process's generator.
    tests = parse_tests(
        [
            "import random\nrandom.seed(7)\nxs = [random.randint(0, 9) for _ in range(5)]\n"
            "assert total(xs) == sum(xs)"
        ]
    )
    assert grade("def total(xs):\n    return sum(xs)\n", tests, sandbox).score == 1.0
    rigged = "import random\nrandom.randint = lambda a, b: 0\ndef total(xs):\n    return 0\n"
    assert grade(rigged, tests, sandbox).score == 0.0


def test_a_test_that_maps_over_the_program(sandbox):
    tests = parse_tests(["assert list(map(sq, [1, 2, 3])) == [1, 4, 9]"])
    assert grade("def sq(x):\n    return x * x\n", tests, sandbox).score == 1.0
    assert grade("def sq(x):\n    return x + x\n", tests, sandbox).score == 0.0


def test_a_structure_the_test_builds_of_the_programs_class(sandbox):
    # MBPP 367/927 build a tree of the program's Node in their setup code, setting
    # attributes of the objects: the program's objects are what is changed.
    setup = "root = Node(1)\nroot.left = Node(2)\nroot.left.left = Node(3)\n"
    tests = parse_tests({"test_list": ["assert depth(root) == 3"], "test_setup_code": setup})
    node = (
        "class Node:\n    def __init__(self, v):\n"
        "        self.v, self.left, self.right = v, None, None\n"
    )
    right = node + (
        "def depth(n):\n    return 0 if n is None else 1 + max(depth(n.left), depth(n.right))\n"
    )
    assert grade(right, tests, sandbox).score == 1.0
    assert grade(right.replace("1 + max", "max"), tests, sandbox).score == 0.0


def test_a_builtin_type_crosses_by_name(sandbox):
    tests = parse_tests(["assert drop(('a', 1, 2.5), int) == ['a', 2.5]"])
    right = "def drop(xs, t):\n    return [x for x in xs if not isinstance(x, t)]\n"
    assert grade(right, tests, sandbox).score == 1.0
    assert grade(right.replace("not ", ""), tests, sandbox).score == 0.0


def test_a_returned_generator_the_test_consumes(sandbox):
    tests = parse_tests(["assert list(evens(6)) == [0, 2, 4]", "assert next(evens(6)) == 0"])
    assert grade("def evens(n):\n    yield from range(0, n, 2)\n", tests, sandbox).score == 1.0
    assert grade("def evens(n):\n    yield from range(0, n)\n", tests, sandbox).score == 0.0
    endless = "import itertools\ndef evens(n):\n    return (2 * i for i in itertools.count())\n"
    r = grade(endless, tests, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "non_plain", r


def test_eval_of_a_returned_string_runs_no_program_code_in_the_tests(sandbox):
    tests = parse_tests(["assert eval(expr(2)) == 4"])
    right = "def expr(n):\n    return str(n * n)\n"
    assert grade(right, tests, sandbox).score == 1.0  # a literal is read in the tests
    # A returned expression run in the tests' process could rebind the tests' names: here
    # only a rebinding of the tests' own helper can pass. It is evaluated in the program's
    # process instead (the third pass: a right expression scores), where it rebinds the
    # program's names only.
    rigged = 'def expr(n):\n    return "globals().update(helper=lambda: 1) or 4"\n'
    tests = parse_tests(
        ["def helper():\n    return 0\n\nassert eval(expr(2)) == 4\nassert helper() == 1"]
    )
    r = grade(rigged, tests, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "wrong_answer", r


def test_a_test_inspecting_the_programs_source_cannot_pass_vacuously(sandbox):
    tests = parse_tests(
        [
            "import inspect\nassert 'sorted(' not in inspect.getsource(my_sort)\n"
            "assert my_sort([2, 1]) == [1, 2]"
        ]
    )
    r = grade("def my_sort(xs):\n    return sorted(xs)\n", tests, sandbox)
    assert r.score == 0.0, r


# -- the channel between the grader and the program's process --


def test_a_program_talking_on_the_channel_itself_decides_nothing(sandbox):
    from runtime.workloads.rewards.code.harness import _MARK

    # It writes, on every descriptor it can, a 'ready' line, answers of its own for calls
    # not yet made and a 'gone' line, reads the requests meant for the harness, then
    # answers wrongly. Lines on the channel are only ever its answers: it knows no
    # expected value to write (answering 3 and 4 here would be answering right).
    lines = "".join(
        f"\n{_MARK}{x}\n"
        for x in ('{"ready": true}', '{"r": 0}', '{"r": 1}', '{"gone": "ok"}', '{"ok": true}')
    )
    forger = (
        "import os\n"
        f"for fd in range(1, 20):\n    try:\n        os.write(fd, {lines!r}.encode())\n"
        "    except OSError:\n        pass\n"
        "for fd in range(3, 20):\n    try:\n        os.set_blocking(fd, False)\n"
        "        os.read(fd, 1 << 16)\n    except OSError:\n        pass\n"
        "def add(a, b):\n    return 0\n"
    )
    tests = parse_tests(["assert add(1, 2) == 3", "assert add(2, 2) == 4"])
    r = grade(forger, tests, sandbox)
    assert r.score == 0.0 and r.passed == 0, r
    # An endless line with no newline on the channel: stopped, not waited on forever.
    flood = (
        "import os\ndef add(a, b):\n    for fd in range(1, 20):\n        try:\n"
        "            os.write(fd, b'x' * (1 << 27))\n        except OSError:\n"
        "            pass\n    return a + b\n"
    )
    r = run_tests(flood, tests, sandbox, test_timeout_s=4, total_timeout_s=20)
    assert r.score == 0.0 and r.wall_s < 20, r


# -- found by a review of the two-process grader (each failed before its fix) --


def test_nan_is_refused_where_the_program_cannot_reach_the_check(sandbox):
    program = (
        "import sys\nsys.modules['__main__']._has_nan = lambda v: False\n"
        "def area(r):\n    return float('nan')\n"
    )
    tests = parse_tests(["assert not abs(area(1) - 3.14159) > 1e-4"])
    r = grade(program, tests, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "non_plain", r


def test_a_forged_call_verdict_never_makes_the_grader_raise(sandbox):
    from runtime.workloads.rewards.code.harness import _MARK

    for value in ('["Q", [[], 100000000000000000000]]', '["c", [["I", "' + "9" * 400 + '"], 0]]'):
        line = "\n" + _MARK + '{"value": ' + value + "}\n"
        program = (
            "import os\nfor fd in range(1, 12):\n    try:\n"
            f"        os.write(fd, {line!r}.encode())\n"
            "    except OSError:\n        pass\nos._exit(0)\ndef f(x):\n    return x\n"
        )
        tests = parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": [1]})
        assert grade(program, tests, sandbox).score == 0.0


def test_a_lone_surrogate_in_a_program_is_its_own_error(sandbox):
    r = grade("print(3)  # \ud800\n", stdio("3"), sandbox)
    assert r.score == 0.0 and r.failures[0].status == "error", r


def test_nan_anywhere_in_an_answer_is_refused(sandbox):
    # A NaN inside an object's attribute or a complex number got past the NaN check.
    program = (
        "class Box:\n    pass\n\ndef f(n):\n    b = Box()\n    b.x = float('nan')\n"
        "    return [b]\n\ndef g(n):\n    return complex(float('nan'), 0)\n"
    )
    setup = "class Box:\n    pass\n"  # the tests know Box: its objects cross as data
    tests = parse_tests(
        {
            "test_list": [
                "assert not abs(f(1)[0].x - 3.0) > 1e-6",
                "assert not abs(g(1) - 3) > 1e-6",
            ],
            "test_setup_code": setup,
        }
    )
    r = grade(program, tests, sandbox)
    assert r.passed == 0 and {f.status for f in r.failures} == {"non_plain"}, r
    right = program.replace("float('nan')", "3.0")
    assert grade(right, tests, sandbox).score == 1.0


def test_a_large_argument_crosses_in_time(sandbox):
    tests = parse_tests(["assert count(list(range(10 ** 6))) == 10 ** 6"])
    assert grade("def count(xs):\n    return len(xs)\n", tests, sandbox).score == 1.0


def test_a_structure_built_of_the_tests_own_class_crosses_as_data(sandbox):
    setup = (
        "class Node:\n    def __init__(self, d):\n"
        "        self.data, self.left, self.right = d, None, None\n"
        "root = Node(1)\nroot.left = Node(2)\n"
    )
    tests = parse_tests({"test_list": ["assert max_height(root) == 2"], "test_setup_code": setup})
    height = (
        "def max_height(n):\n"
        "    return 0 if n is None else 1 + max(max_height(n.left), max_height(n.right))\n"
    )
    assert grade(height, tests, sandbox).score == 1.0
    assert grade(height.replace("1 + max", "max"), tests, sandbox).score == 0.0


def test_objects_of_the_programs_class_answer_as_it_would(sandbox):
    stack = (
        "class Stack:\n    def __init__(self):\n        self.x = []\n"
        "    def push(self, v):\n        self.x.append(v)\n"
        "    def __len__(self):\n        return len(self.x)\n"
        "    def __str__(self):\n        return str(self.x)\n"
        "    def __iter__(self):\n        return iter(self.x)\n"
        "    @staticmethod\n    def cap():\n        return 8\n"
    )
    tests = parse_tests(
        [
            "s = Stack()\ns.push(1)\nassert isinstance(s, Stack) and len(s) == 1 and s\n"
            "assert str(s) == '[1]' and list(s) == [1] and Stack.cap() == 8"
        ]
    )
    assert grade(stack, tests, sandbox).score == 1.0
    assert grade(stack.replace("str(self.x)", "'[1]' * 2"), tests, sandbox).score == 0.0
    # Comparing one still hands the expected value to no one: refused.
    r = grade(stack, parse_tests(["s = Stack()\nassert s == []"]), sandbox)
    assert r.score == 0.0 and r.failures[0].status == "non_plain", r


def test_common_return_types(sandbox):
    tests = parse_tests(
        [
            "assert list(evens(5)) == [0, 2, 4]",
            "assert list(sq([1, 2])) == [1, 4]",
            "assert half(1) == 0.5",
        ]
    )
    right = (
        "from fractions import Fraction\ndef evens(n):\n    return range(0, n, 2)\n"
        "def sq(xs):\n    return map(lambda x: x * x, xs)\n"
        "def half(x):\n    return Fraction(x, 2)\n"
    )
    assert grade(right, tests, sandbox).score == 1.0
    assert grade(right.replace("Fraction(x, 2)", "Fraction(x, 3)"), tests, sandbox).score == 0


def test_a_linked_list_changed_in_place_reaches_the_test(sandbox):
    test = (
        "def check(candidate):\n    head = list_node([1, 2, 3, 4])\n    candidate(head)\n"
        "    assert is_same_list(head, list_node([1, 4, 2, 3]))\n"
    )
    tests = parse_tests({"test": test, "entry_point": "Solution().reorderList"})
    right = (
        "class Solution:\n    def reorderList(self, head):\n        nodes = []\n"
        "        while head:\n            nodes.append(head)\n            head = head.next\n"
        "        i, j, order = 0, len(nodes) - 1, []\n        while i <= j:\n"
        "            order.append(nodes[i])\n            if i != j:\n"
        "                order.append(nodes[j])\n"
        "            i, j = i + 1, j - 1\n        for a, b in zip(order, order[1:]):\n"
        "            a.next = b\n        order[-1].next = None\n"
    )
    assert grade(right, tests, sandbox).score == 1.0
    assert grade(right.replace("order[-1].next = None", "pass"), tests, sandbox).score == 0.0


def test_a_program_with_a_main_block_is_graded_by_its_functions(sandbox):
    program = (
        "def add(a, b):\n    return a + b\n\nif __name__ == '__main__':\n"
        "    print(add(*map(int, input().split())))\n"
    )
    assert grade(program, parse_tests(["assert add(1, 2) == 3"]), sandbox).score == 1.0
    as_script = parse_tests({"inputs": ["1 2\n"], "outputs": ["3\n"]})
    assert grade(program, as_script, sandbox).score == 1.0


def test_a_stated_tolerance_makes_integers_real_numbers_too(sandbox):
    assert grade("print('3.000000000')", stdio("3", tolerance=1e-6), sandbox).score == 1.0
    assert grade("print('3.000000000')", stdio("3"), sandbox).score == 0.0
    call = parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": [3], "tolerance": 1e-6})
    assert grade("def f(x):\n    return 3.0000000001\n", call, sandbox).score == 1.0
