"""The conversation behind script and asserts tests: the program in one sandboxed process,
the tests as written in another, and the grader between them passing each call the tests
make into the program across, one line each way.

The program's process sees the arguments of its calls and nothing else of the tests; the
tests' process holds no program code, only the plain values the program's process
answered. So whatever the program does to its own process (an exit, a patched builtin, a
forged reply line, a walk over its frames) can at most change what it answered, which it
could have answered anyway; and it never sees an expected value to answer with."""

from __future__ import annotations

import json
from typing import Any

from runtime.workloads.rewards.code.harness import _HARNESS, _MARK
from runtime.workloads.sandbox import RunResult, Sandbox, SandboxLimits
from runtime.workloads.sandbox.session import Session, session

_MARK_BYTES = _MARK.encode()

Outcome = tuple[bool, str, str]  # (passed, status, what to show)


def converse(
    sandbox: Sandbox,
    program_job: dict[str, Any],
    units: list[dict[str, Any]],
    limits: SandboxLimits,
    sources: dict[str, str] | None = None,
) -> list[Outcome]:
    """Run ``units`` (``{"code", "names"}`` each) against the program; one outcome per
    unit. A unit the tests' process never reported on takes the reason it stopped.
    ``sources``: the program's text of its functions, by name, for ``inspect.getsource``
    in the tests (text, never run there)."""
    outcomes: list[Outcome] = []
    with (
        sandbox.reserve(2) as uids,  # both at once: one held while waiting deadlocks
        session(sandbox, _HARNESS, limits, uids) as program,
        session(sandbox, _HARNESS, limits, uids) as tests,
    ):
        program.send(json.dumps({**program_job, "mode": "serve"}).encode())
        tests.send(json.dumps({"mode": "tests", "units": units, "sources": sources or {}}).encode())
        gone, detail = _ready(program)
        while len(outcomes) < len(units):
            msg = _read(tests)
            if msg is None:
                break
            if isinstance(msg.get("unit"), dict):
                outcomes.append(_outcome(msg["unit"]))
            elif isinstance(msg.get("ask"), dict):
                if gone is None:
                    reply = _ask(program, msg["ask"])
                    if reply is None:
                        gone = _ended(program.finish())
                if gone is not None:
                    reply = json.dumps({"gone": gone, "why": detail}).encode()
                if not tests.send(reply):
                    break
            else:
                break
        if len(outcomes) < len(units):
            why = gone or _ended(tests.finish())
            shown = "" if gone else _stderr(tests)
            outcomes += [(False, why, shown)] * (len(units) - len(outcomes))
    return outcomes


def _ready(program: Session) -> tuple[str | None, str]:
    """(None, "") once the program loaded; else why not: a status and the last line of
    its traceback."""
    msg = _read(program)
    if msg is not None and msg.get("ready") is True:
        return None, ""
    if msg is not None and msg.get("ready") is False:
        lines = str(msg.get("error", "")).strip().splitlines()
        return "error", (lines[-1] if lines else "")[:300]
    return _ended(program.finish()), ""


def _ask(program: Session, request: dict[str, Any]) -> bytes | None:
    if not program.send(json.dumps(request).encode()):
        return None
    return program.recv(_MARK_BYTES)


def _read(s: Session) -> dict[str, Any] | None:
    line = s.recv(_MARK_BYTES)
    if line is None:
        return None
    try:
        msg = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return msg if isinstance(msg, dict) else None


def _outcome(res: dict[str, Any]) -> Outcome:
    if res.get("ok") is True:
        return True, "ok", ""
    return False, str(res.get("status", "error")), str(res.get("error", ""))


def _ended(r: RunResult) -> str:
    # A process that ended by itself before answering left early; a limit says which.
    return "early_exit" if r.status in ("ok", "error") else r.status


def _stderr(s: Session) -> str:
    return bytes(s.stderr).decode("utf-8", errors="replace").strip()[-600:]
