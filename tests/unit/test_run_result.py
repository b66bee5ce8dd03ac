"""A sandboxed program's error in one line (runtime/workloads/sandbox/limits.py
``RunResult.describe``): what feedback and error fields show."""

import pytest

from runtime.workloads.sandbox.limits import RunResult

pytestmark = pytest.mark.unit

FRAME = '  File "/sandbox/main.py", line 2, in <module>\n    while True: os.fork()\n'
HEAD = "Traceback (most recent call last):\n"


def error(stderr: str, exit_code: int = 1) -> RunResult:
    return RunResult("error", exit_code, "", stderr, 0.1)


def test_an_error_is_its_exception_line():
    assert error(HEAD + FRAME + "ZeroDivisionError: division by zero\n").describe() == (
        "ZeroDivisionError: division by zero"
    )
    assert error("bad input\n").describe() == "bad input"  # sys.exit("bad input")


def test_a_traceback_cut_after_a_frame_is_not_described_by_its_source_line():
    # forks write into one stderr; the last one killed mid-write: the whole one's exception
    # line describes it, not the cut one's source line (the line it gave before)
    whole = HEAD + FRAME + "BlockingIOError: [Errno 11] Resource temporarily unavailable\n"
    assert error(whole + HEAD + FRAME).describe() == (
        "BlockingIOError: [Errno 11] Resource temporarily unavailable"
    )
    assert error(HEAD + FRAME, exit_code=137).describe() == "exit code 137"
    assert error("").describe() == "exit code 1"


def test_a_status_other_than_error_is_the_status():
    assert RunResult("timeout", None, "", HEAD + FRAME, 6.0).describe() == "timeout"
