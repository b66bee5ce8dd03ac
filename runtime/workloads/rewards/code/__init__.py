"""Code-execution reward: run a program against test cases in the sandbox, with a verdict
the program cannot forge.

Four test styles, as the public datasets write them:

- ``stdio`` (APPS/CodeContests ``{"inputs": [str], "outputs": [str]}``): each input is
  the program's stdin; its stdout must match the output (trailing whitespace ignored, then
  token by token; see :func:`outputs_match` for where a tolerance applies);
- ``call`` (APPS ``fn_name``): each input is the argument list of ``fn_name`` (a function,
  or a method of LeetCode's ``class Solution``); the return value must equal the output
  (APPS wraps some outputs in a list: both forms count; see :func:`values_match`);
- ``script`` (HumanEval ``test`` + ``entry_point``): test code that calls the program; it
  passes when it runs to its end without an error;
- ``asserts`` (MBPP ``test_list``, or a list of strings): each assert line is one test,
  run after ``test_setup_code``.

How a verdict is reached (docs/code-reward.md has the whole argument):

- The expected answers never enter the program's process. stdio: the program runs alone
  (its file holds only itself) and its stdout is compared here. call: a harness calls the
  function and reports the return value as *plain data* (exact built-in types, see
  :func:`_encode`; a subclass or an object with an ``__eq__`` of its own is refused), which
  is compared here.
- script/asserts tests hold their answers in code, so each runs twice. The *record* run
  (program + harness) executes a probe made from the test code: every ``assert`` is cut
  down to the calls into the program it makes, and statements that only compute expected
  values are sliced away (:func:`probe_code`). The harness records each call's arguments
  and plain result. The *replay* run (harness + the test code as written, no program in
  it) runs the real asserts with every call into the program answered from that record.
  The test passes only when the replay ran to its end: an early exit, a missing or
  duplicated record, a call the record lacks, or a non-plain result is a failure.
- The program's file is the harness alone; the program and the tests come on stdin, the
  probe having no answers in it. Whatever the record run prints (it is the program's to
  forge) is only a claim about what the program's functions returned, which the program
  could as well have returned; it cannot name the answers, which it never saw.

What the program's code may decide is kept to its own calls. A probe keeps whole only the
calls of program names, of names that hold one (``candidate``, by
:func:`_carriers`), and hand-offs like ``check(add)`` whose arguments are all such names;
of any other call (builtins, imports, the test's own helpers such as ``_close(candidate(x),
1.41)``) it keeps only the program calls inside the arguments, and an expression or
assignment that no later call needs is cut down the same way. A builtin or prelude name the
program redefines counts as the program's only with no entry point, no other program name
in the test and no second such name (MBPP 126 tests ``sum``); elsewhere the replay, which
holds no program code, runs the real builtin. A recorded ``StopIteration`` or
``StopAsyncIteration`` is refused: raised into ``map`` or ``iter(f, x)`` it would end the
test's iteration early.

Residual risk, honestly: a probe keeps what the calls' arguments need, so a test that
derives an argument from its answer gives the answer away (HumanEval 38/50 encode the
answer with the prompt's ``encode_*``, which is the program's own code); a check that
judges with a helper the program defines (HumanEval 32's ``poly``) is judged by the
program, as in HumanEval's own harness; a table of ``(input, answer)`` pairs that a loop
walks stays in the probe whole, and so do the headers of ``if``/``while``/``for`` and
``return``/``raise`` statements that call the program (their comparisons and lambdas
included); a builtin-named function under test (MBPP 126's ``sum``, or an entry point
named like a builtin) is the program's throughout its test, expected side included, as
in the datasets' own harnesses. A test helper that calls the program itself, or is handed
it beside other arguments, has no calls in the probe: such a test fails even for a right
program (a cost in correctness, never a pass). The sandbox (runtime/workloads/sandbox)
bounds what either run can do; nothing here depends on the program failing to inspect its
own process.

Each run is one sandboxed process, tests of one program run ``parallel`` at a time, and
all of them share ``total_timeout_s``. The score is 1.0 when every test passes, else 0.0;
``passed``/``total`` say how close it came.

The parts, one module each: :mod:`.spec` (parsing the tests, taking the program from a
response), :mod:`.probe` (cutting the answers out of test code), :mod:`.plain` (the plain
values that cross from the program's process), :mod:`.harness` (the in-sandbox source and
its verdict line), :mod:`.compare` (answers against the expected ones) and :mod:`.driver`
(:func:`run_tests`). The public names are all importable from here, with the sandbox the
grader runs in (:func:`sandbox_for`, from :mod:`runtime.workloads.sandbox`).
"""

from runtime.workloads.rewards.code.compare import outputs_match, values_match
from runtime.workloads.rewards.code.driver import CodeResult, TestFailure, run_tests
from runtime.workloads.rewards.code.prelude import PRELUDE
from runtime.workloads.rewards.code.probe import probe_code, program_names
from runtime.workloads.rewards.code.spec import (
    TEST_FIELDS,
    TestSpec,
    TestSpecError,
    extract_program,
    parse_tests,
    stated_tolerance,
    tests_of,
)
from runtime.workloads.sandbox import Sandbox, sandbox_for

__all__ = [
    "PRELUDE",
    "TEST_FIELDS",
    "CodeResult",
    "Sandbox",
    "TestFailure",
    "TestSpec",
    "TestSpecError",
    "extract_program",
    "outputs_match",
    "parse_tests",
    "probe_code",
    "program_names",
    "run_tests",
    "sandbox_for",
    "stated_tolerance",
    "tests_of",
    "values_match",
]
