"""Hostile programs against the code grader (not the sandbox: tests/integration/
test_sandbox.py has those). Each program is wrong, and each tries to score 1.0 anyway by
forging the verdict instead of computing the answer: an early exit, an exit hook, a
rebound exception, an object equal to everything, reading the tests from its own file or
its caller's frame, or a comparison loose enough to let a wrong number through. Each one
scored 1.0 on the grader that ran the tests in the program's own process and took "exited
0" for "passed"; here each must score 0."""

from __future__ import annotations

import shutil

import pytest

from runtime.config.schema import Config
from runtime.workloads.agents.code_agent import CodeAgent
from runtime.workloads.rewards import code as grader
from runtime.workloads.rewards.code import parse_tests, run_tests, sandbox_for
from tests.integration.agent_harness import ScriptedEngine, chat_codec, run_agent

pytestmark = pytest.mark.skipif(
    not shutil.which("bwrap"), reason="bubblewrap not installed (make install adds it)"
)

# The same two tests, as MBPP writes them and as HumanEval does.
MBPP = parse_tests(["assert add(1, 2) == 3", "assert add(2, 2) == 4"])
HUMANEVAL = parse_tests(
    {
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n"
        "    assert candidate(2, 2) == 4\n",
        "entry_point": "add",
    }
)
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"

ATTACKS = {
    # exits 0 before a single test has run
    "os_exit_before_the_tests": WRONG + "import os\nos._exit(0)\n",
    "system_exit_before_the_tests": WRONG + "raise SystemExit(0)\n",
    # exits 0 from inside the function under test
    "os_exit_inside_the_function": "import os\n\ndef add(a, b):\n    os._exit(0)\n",
    # lets the assert fail, then turns the failure into exit status 0
    "atexit_handler_exits_0": WRONG + "import atexit, os\natexit.register(lambda: os._exit(0))\n",
    "excepthook_exits_0": WRONG + "import os, sys\nsys.excepthook = lambda *a: os._exit(0)\n",
    # an answer equal to every expected value
    "result_equal_to_everything": (
        "class Yes:\n    def __eq__(self, other):\n        return True\n\n"
        "def add(a, b):\n    return Yes()\n"
    ),
    # reads the asserts from the file it runs from and returns their right-hand side
    "reads_its_own_source": (
        "import re, sys\n\ndef add(a, b):\n    src = open(sys.argv[0]).read()\n"
        "    return int(re.search(rf'\\({a}, {b}\\) == (\\d+)', src).group(1))\n"
    ),
    # reads the expected value out of the code objects of the frames that called it
    "reads_its_callers_frames": (
        "import sys\n\ndef add(a, b):\n    f, seen = sys._getframe(1), []\n"
        "    while f is not None:\n"
        "        seen += [c for c in f.f_code.co_consts if type(c) is int and c < 1000]\n"
        "        f = f.f_back\n    return max(seen)\n"
    ),
}


@pytest.fixture(scope="module")
def sandbox():
    return sandbox_for()


def score(program: str, tests: grader.TestSpec, sandbox: grader.Sandbox) -> float:
    return run_tests(program, tests, sandbox, test_timeout_s=4, total_timeout_s=20).score


@pytest.mark.parametrize("style", ["mbpp", "humaneval"])
def test_the_honest_program_passes_and_the_wrong_one_fails(style, sandbox):
    tests = MBPP if style == "mbpp" else HUMANEVAL
    assert score(RIGHT, tests, sandbox) == 1.0
    assert score(WRONG, tests, sandbox) == 0.0


@pytest.mark.parametrize("style", ["mbpp", "humaneval"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_forged_verdict_scores_0(attack, style, sandbox):
    tests = MBPP if style == "mbpp" else HUMANEVAL
    r = run_tests(ATTACKS[attack], tests, sandbox, test_timeout_s=4, total_timeout_s=20)
    assert r.score == 0.0 and r.passed == 0, (attack, r)
    assert r.failures and all(f.status != "ok" for f in r.failures)


def test_a_rebound_assertion_error_does_not_end_the_tests_with_0(sandbox):
    # A test that raises AssertionError by name; the program makes that name SystemExit(0).
    tests = parse_tests("if add(1, 2) != 3:\n    raise AssertionError('add(1, 2) is not 3')\n")
    attack = WRONG + "import builtins\nbuiltins.AssertionError = lambda *a: SystemExit(0)\n"
    assert score(RIGHT, tests, sandbox) == 1.0
    assert score(attack, tests, sandbox) == 0.0


def test_an_early_exit_is_a_failure_not_a_pass(sandbox):
    r = run_tests(ATTACKS["os_exit_before_the_tests"], MBPP, sandbox, test_timeout_s=4)
    assert {f.status for f in r.failures} == {"early_exit"}


def test_a_record_written_by_the_program_decides_nothing(sandbox):
    # The record channel is no secret: the program finds it (any fd) and writes a record
    # of its own, then leaves. A record with no calls in it leaves the replay with calls
    # nobody answered; one it writes besides the harness's makes the record ambiguous.
    from runtime.workloads.rewards.code.harness import _MARK

    line = "\n" + _MARK + '{"calls": []}' + "\n"
    forged = (
        WRONG + "import os\nfor fd in range(1, 12):\n    try:\n"
        f"        os.write(fd, {line!r}.encode())\n"
        "    except OSError:\n        pass\n"
    )
    assert score(forged, MBPP, sandbox) == 0.0
    assert score(forged + "os._exit(0)\n", MBPP, sandbox) == 0.0
    assert score(RIGHT + forged[len(WRONG) :], MBPP, sandbox) == 0.0


def test_stdio_integers_compare_exactly(sandbox):
    tests = parse_tests({"inputs": ["\n"], "outputs": ["1000000\n"]})
    assert score("print(1000000)", tests, sandbox) == 1.0
    assert score("print(1000001)", tests, sandbox) == 0.0
    floats = parse_tests({"inputs": ["\n"], "outputs": ["0.3333333\n"], "tolerance": 1e-6})
    assert score("print(1 / 3)", floats, sandbox) == 1.0
    # No stated tolerance: a decimal answer is the number printed, exactly.
    exact = parse_tests({"inputs": ["\n"], "outputs": ["0.3333333\n"]})
    assert score("print(1 / 3)", exact, sandbox) == 0.0
    assert score("print('0.33333330')", exact, sandbox) == 1.0


def test_call_based_a_float_is_not_a_string_answer(sandbox):
    tests = parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": ["3"]})
    assert score("def f(x):\n    return '3'", tests, sandbox) == 1.0
    assert score("def f(x):\n    return 3.0", tests, sandbox) == 0.0
    ints = parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": [1]})
    assert score("def f(x):\n    return True", ints, sandbox) == 0.0  # a bool is not an int


def test_call_based_result_equal_to_everything_scores_0(sandbox):
    tests = parse_tests({"fn_name": "f", "inputs": [[1]], "outputs": [3]})
    program = (
        "class Yes:\n    def __eq__(self, o):\n        return True\n\ndef f(x):\n    return Yes()"
    )
    r = run_tests(program, tests, sandbox)
    assert r.score == 0.0 and r.failures[0].status == "non_plain"


# ---- code_agent: the public tests never include a hidden one ----


def test_split_keeps_a_hidden_test_apart_from_the_public_ones():
    from runtime.workloads.agents.code_agent import split_tests  # here: the old module had none

    for total in range(1, 6):
        for k in range(0, 7):
            public, hidden = split_tests(total, k)
            assert hidden and not set(public) & set(hidden)
            assert sorted(public + hidden) == list(range(total))
    assert split_tests(1, 1) == ([], [0])  # a single test stays hidden: no feedback turn


def _agent_config() -> Config:
    cfg = Config()
    cfg.workload.kind = "code_agent"
    cfg.model.max_seq_len = 4096
    cfg.workload.max_response_tokens = 512
    cfg.workload.max_turns = 3
    cfg.workload.public_tests = 1
    return cfg


def test_code_agent_with_one_test_gives_no_feedback_on_it():
    codec = chat_codec()
    engine = ScriptedEngine(codec, [f"```python\n{WRONG}```", f"```python\n{RIGHT}```"])
    record = {"tests": ["assert add(40, 2) == 42"]}
    ep, _ = run_agent(CodeAgent(), _agent_config(), engine, "Write add(a, b).", record)
    # one attempt, scored on the one (hidden) test; nothing about it was fed back
    assert ep.info["turns"] == 1 and ep.info["hidden_total"] == 1 and ep.reward == 0.0
    assert all(m == 1 for m in ep.loss_mask)
    assert "42" not in codec.decode(ep.token_ids[len(ep.prompt_ids) :])


def test_code_agent_feedback_shows_the_public_test_only():
    codec = chat_codec()
    engine = ScriptedEngine(codec, [f"```python\n{WRONG}```", f"```python\n{WRONG}```"])
    record = {"tests": ["assert add(1, 2) == 3", "assert add(20, 22) == 42"]}
    cfg = _agent_config()
    cfg.workload.max_turns = 2
    ep, _ = run_agent(CodeAgent(), cfg, engine, "Write add(a, b).", record)
    env_text = codec.decode([t for t, m in zip(ep.token_ids, ep.loss_mask, strict=True) if not m])
    assert "add(1, 2)" in env_text and "add(20, 22)" not in env_text and "42" not in env_text
    assert ep.info["hidden_total"] == 1


# ---- the probe and the replay: what the program's own code may decide ----

# With no entry point, a builtin the program defines at top level used to count as the
# program's everywhere in the test, so the expected side of the comparison (its answer in
# the arguments) ran on the program's builtin and both sides came from its record.
BUILTIN_REDEFINITIONS = {
    "set_on_both_sides_mbpp_2": (
        ["assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"],
        "def set(*a, **k):\n    return 0\n\ndef similar_elements(a, b):\n    return []\n",
    ),
    "abs_around_the_difference": (
        ["assert abs(area(2) - 12.566) < 0.01"],
        "abs = lambda *a: 0\n\ndef area(r):\n    return -1\n",
    ),
    "sorted_on_both_sides": (
        ["assert sorted(f([3,1,2])) == sorted([1,2,3])"],
        "def sorted(*a, **k):\n    return 1\n\ndef f(x):\n    return []\n",
    ),
    "len_in_a_script_without_entry_point": (
        {"test": "assert len(f([1,2])) == len([1,2,3])\n"},
        "def len(*a):\n    return 0\n\ndef f(x):\n    return x\n",
    ),
}


@pytest.mark.parametrize("attack", sorted(BUILTIN_REDEFINITIONS))
def test_a_builtin_the_program_redefines_stays_real_in_the_comparison(attack, sandbox):
    tests, program = BUILTIN_REDEFINITIONS[attack]
    assert score(program, parse_tests(tests), sandbox) == 0.0


def test_a_function_literally_named_like_a_builtin_is_still_tested(sandbox):
    # MBPP 126 tests a function called ``sum``: with no other program name in the test,
    # the builtin-named function is the one under test.
    tests = parse_tests(["assert sum(10, 15) == 6", "assert sum(4, 6) == 3"])
    right = (
        "def sum(a, b):\n    total = 0\n    for d in range(1, min(a, b) + 1):\n"
        "        if a % d == 0 and b % d == 0:\n            total += d\n    return total\n"
    )
    assert score(right, tests, sandbox) == 1.0
    assert score("def sum(a, b):\n    return 0\n", tests, sandbox) == 0.0


# Reads the probe out of the harness frame that holds the job, and returns the number that
# follows its own call there (the test's answer, when a test helper's call is kept whole).
PROBE_READER = (
    "import re, sys\n\ndef sqrt2(x):\n    f = sys._getframe(1)\n    while f is not None:\n"
    "        job = f.f_locals.get('job')\n"
    "        if type(job) is dict and 'probe' in job:\n"
    "            m = re.search(r'candidate\\(' + re.escape(repr(x)) + r'\\), ([-0-9.e]+)',"
    " job['probe'])\n"
    "            return float(m.group(1)) if m else -1.0\n"
    "        f = f.f_back\n    return -1.0\n"
)
HELPER_CHECKS = {
    "helper_in_an_assert": "    assert _close(candidate(2.0), 1.4142135)\n"
    "    assert _close(candidate(9.0), 3.0)\n",
    "helper_as_a_statement": "    _close_or_fail(candidate(2.0), 1.4142135)\n"
    "    _close_or_fail(candidate(9.0), 3.0)\n",
    "helper_in_an_assignment": "    ok = _close(candidate(2.0), 1.4142135)\n"
    "    assert ok\n    ok = _close(candidate(9.0), 3.0)\n    assert ok\n",
}


@pytest.mark.parametrize("style", sorted(HELPER_CHECKS))
def test_a_test_helper_call_keeps_its_answer_out_of_the_probe(style, sandbox):
    tests = parse_tests(
        {
            "test": "def _close(a, b):\n    return abs(a - b) < 1e-6\n\n"
            "def _close_or_fail(a, b):\n    assert abs(a - b) < 1e-6\n\n"
            "def check(candidate):\n" + HELPER_CHECKS[style],
            "entry_point": "sqrt2",
        }
    )
    right = "def sqrt2(x):\n    return x ** 0.5\n"
    assert score(right, tests, sandbox) == 1.0
    assert score(PROBE_READER, tests, sandbox) == 0.0


def test_a_recorded_stop_iteration_does_not_end_the_tests_early(sandbox):
    # Raised into ``map`` in the replay, a StopIteration would end the iteration there, and
    # ``all`` of nothing is true: the grader refuses it as the program's outcome.
    tests = parse_tests(
        {
            "test": "def check(candidate):\n"
            "    if not all(map(lambda x: candidate(x) == 2 * x, [1, 2, 3])):\n"
            "        raise AssertionError('not doubled')\n",
            "entry_point": "double",
        }
    )
    assert score("def double(x):\n    return 2 * x\n", tests, sandbox) == 1.0
    for exc in ("StopIteration", "StopAsyncIteration"):
        program = f"def double(x):\n    raise {exc}\n"
        r = run_tests(program, tests, sandbox, test_timeout_s=4, total_timeout_s=20)
        assert r.score == 0.0 and r.failures[0].status == "error", (exc, r)
