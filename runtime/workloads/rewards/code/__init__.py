"""Code-execution reward: run a program against test cases in the sandbox, with a verdict
the program cannot forge.

Four test styles, as the public datasets write them (:mod:`.formats` turns LeetCode's,
KodCode's pytest files, LiveCodeBench's and the verifiable-coding sets' into these; the
list with each format's ``data.fields`` mapping is in docs/code-reward.md):

- ``stdio`` (APPS/CodeContests ``{"inputs": [str], "outputs": [str]}``): each input is
  the program's stdin; its stdout must match the output (see :func:`outputs_match`: an
  integer digit for digit, a decimal exactly or within the problem's stated tolerance);
- ``call`` (APPS ``fn_name``): each input is the argument list of ``fn_name`` (a function,
  or a method of LeetCode's ``class Solution``); the return value must equal the output
  (APPS wraps some outputs in a list: both forms count; see :func:`values_match`);
- ``script`` (HumanEval ``test`` + ``entry_point``, LeetCode's ``Solution().method``):
  test code that calls the program; it passes when it runs to its end without an error;
- ``asserts`` (MBPP ``test_list``, a list of strings, a pytest file's test functions):
  each is one test, run after ``test_setup_code``.

How a verdict is reached (docs/code-reward.md has the whole argument):

- The expected answers never enter the program's process. stdio: the program runs alone
  (its file holds only itself) and its stdout is compared here. call: a harness calls the
  function and reports the return value as *plain data* (exact built-in types, see
  :func:`_encode`; a subclass or an object with an ``__eq__`` of its own is refused), which
  is compared here.
- script/asserts tests hold their answers in code, so the program and the tests run in two
  sandboxed processes at once (:mod:`.relay`). The tests' process runs the test code as
  written, with every name that stands for the program (:func:`program_names`) bound to a
  stand-in; each call of a stand-in sends its plain arguments through the grader to the
  program's process, which runs the call and answers with a plain value (or the exception
  it raised, or a handle to an object of its class). The program's process never sees the
  tests, only the arguments of its calls; the tests' process never runs program code.
- A test passes only when it ran to its end and called the program at least once: an
  early exit of the program's process, a non-plain answer, comparing an object of the
  program's class, a ``StopIteration`` raised into the test's loop, or a NaN are failures.

A builtin or prelude name the program redefines counts as the program's only with no entry
point, no other program name in the test and no second such name (MBPP 126 tests ``sum``);
elsewhere the tests' process runs the real builtin, and a name only the prelude gave the
program is not the program's. Residual risk, honestly: a check that judges with a helper
the program defines (HumanEval 32's ``poly``) is judged by the program, as in HumanEval's
own harness; a test that derives an argument from its answer with the program's own code
(HumanEval 38/50's ``encode_*``) hands it that answer. The sandbox (runtime/workloads/
sandbox) bounds what either process can do; nothing here depends on the program failing
to inspect its own process.

Tests of one program share ``total_timeout_s``; stdio and call tests run ``parallel`` at
a time. The score is 1.0 when every test passes, else 0.0; ``passed``/``total`` say how
close it came, and each failure says why in one line (``error``).

The parts, one module each: :mod:`.spec` and :mod:`.formats` (parsing the tests, taking
the program from a response), :mod:`.names` (which names are the program's), :mod:`.plain`
(the plain values that cross between the processes), :mod:`.harness` and :mod:`.sides`
(the in-sandbox source), :mod:`.relay` (the conversation), :mod:`.compare` (answers
against the expected ones) and :mod:`.driver` (:func:`run_tests`). The public names are
all importable from here, with the sandbox the grader runs in (:func:`sandbox_for`).
"""

from runtime.workloads.rewards.code.compare import outputs_match, values_match
from runtime.workloads.rewards.code.driver import CodeResult, TestFailure, run_tests
from runtime.workloads.rewards.code.names import program_names
from runtime.workloads.rewards.code.prelude import PRELUDE
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
    "program_names",
    "run_tests",
    "sandbox_for",
    "stated_tolerance",
    "tests_of",
    "values_match",
]
