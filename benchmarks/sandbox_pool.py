"""Graded programs per second per core through a rollout engine's reward pool, at 1, 32 and
256 conversations at once: ReFlow's grader against the one-process harness.

Each conversation is an asyncio task that grades one reference solution after another
through the same ``RewardPool`` a rollout engine uses (``sandbox.reward_workers`` processes,
``sandbox.concurrency`` = conversations threads), so the pool, the uid claims and the
sandbox starts are all in the figure. Two graders, each in the same run, on the same
programs and pool settings:

- ``run_tests`` (what ReFlow grades with): scripts and asserts in two sandboxed processes,
  the program's and the tests', with the relay between them; call and stdin tests a
  sandboxed process per case, ``sandbox.parallel`` at once.
- the one-process harness (what code-RL graders commonly run): the program and all its
  tests in one sandboxed process, passing when that process exits 0 (HumanEval and MBPP:
  the program, then its tests; APPS: a loop feeding each case to the program's code with
  ``exec``, comparing stdout or the call's value).

Sets: HumanEval (164 canonical solutions), MBPP (reference solutions) and APPS (every
solution of the APPS sample, ``../shared/data/apps``; skipped without it). A run grades
``max(--programs, 2 x conversations)`` programs per set, cycling through the set. The uid
pool is sized as a recipe derives it for one engine: conversations x max(2, parallel).
Reported per set, grader and concurrency: programs/s, programs/s per core (the machine's
cores), p50/p99 latency of one grading, references graded correct, claims that waited for
a uid, and the ratio of ReFlow's rate to the one-process rate.

Run:

    .venv/bin/python benchmarks/sandbox_pool.py [--conversations 1,32,256] [--programs 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runtime.config.schema import SandboxConfig
from runtime.data.datasets import load_records
from runtime.workloads.agents.pool import RewardPool
from runtime.workloads.agents.scoring import code_score
from runtime.workloads.rewards.code import PRELUDE, parse_tests
from runtime.workloads.sandbox import sandbox_for

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
SHIPPED = REPO / "recipes" / "data"


@dataclass(frozen=True)
class Task:
    program: str
    tests: Any  # what the dataset's record holds (code_score parses it)
    fn_name: str | None
    after: str = ""  # HumanEval, MBPP: the tests, run after the program in its process
    apps_cases: str = ""  # APPS: the input_output JSON the one-process loop feeds

    @property
    def one_process(self) -> str:
        """The program and its tests as one script (the one-process harness)."""
        if self.apps_cases:
            return _APPS_LOOP.format(cases=self.apps_cases, program=self.program, pre=PRELUDE)
        return f"{self.program}\n{self.after}\n"


# The one-process harness for APPS, as APPS's own testing_util runs it: every case through
# the program's code in this process, a stdin program wrapped in a function (APPS
# solutions may ``return`` at their top level), the prelude's names in its namespace.
_APPS_LOOP = """
import io, json, sys, textwrap
_CASES = json.loads({cases!r})
_SRC = {program!r}
_PRE = {pre!r}
for _inp, _out in zip(_CASES["inputs"], _CASES["outputs"]):
    _ns = {{"__name__": "__main__"}}
    exec(_PRE, _ns)
    if "fn_name" in _CASES:
        exec(_SRC, _ns)
        _fn = _ns["Solution"]().__getattribute__(_CASES["fn_name"]) if "Solution" in _ns \\
            else _ns[_CASES["fn_name"]]
        _got = _fn(*_inp)
        if _got != _out and [_got] != _out:
            sys.exit(1)
        continue
    # text streams over bytes, so that a program reading sys.stdin.buffer works too
    sys.stdin = io.TextIOWrapper(io.BytesIO(str(_inp).encode()))
    _raw = io.BytesIO()
    _real, sys.stdout = sys.stdout, io.TextIOWrapper(_raw, write_through=True)
    try:
        exec("def _code():\\n" + textwrap.indent(_SRC, "    ") + "\\n    pass\\n", _ns)
        _ns["_code"]()
    except SystemExit:
        pass
    finally:
        try:
            sys.stdout.flush()
            _got = _raw.getvalue()  # before the wrapper goes: it closes what it wraps
        except ValueError:  # the program closed its stdout
            _got = b""
        sys.stdout = _real
    if _got.decode(errors="replace").split() != str(_out).split():
        sys.exit(1)
"""


def task_sets() -> dict[str, list[Task]]:
    he_file = SHARED / "humaneval" / "HumanEval.jsonl.gz"
    he = load_records(he_file if he_file.is_file() else SHIPPED / "humaneval/HumanEval.jsonl.gz")
    mbpp_file = SHARED / "mbpp" / "mbpp.jsonl"
    mbpp_file = mbpp_file if mbpp_file.is_file() else SHIPPED / "mbpp" / "mbpp.jsonl"
    mbpp = [json.loads(x) for x in mbpp_file.open()]
    sets = {
        "HumanEval": [
            Task(
                r["prompt"] + r["canonical_solution"],
                {"test": r["test"], "entry_point": r["entry_point"]},
                None,
                after=f"{r['test']}\ncheck({r['entry_point']})",
            )
            for r in he
        ],
        "MBPP": [
            Task(
                r["code"],
                r,
                None,
                after=parse_tests(r).script + "\n" + "\n".join(r["test_list"]),
            )
            for r in mbpp
        ],
    }
    apps_file = SHARED / "apps" / "apps_train_sample_coderl.jsonl"
    if apps_file.is_file():
        sets["APPS"] = [
            Task(program, r["input_output"], cases.get("fn_name"), apps_cases=r["input_output"])
            for r in map(json.loads, apps_file.open())
            for cases in [json.loads(r["input_output"])]
            for program in json.loads(r["solutions"])
        ]
    return sets


def grade_reflow(task: Task, settings: SandboxConfig) -> tuple[bool, int, int]:
    """(passed, this process's pid, its claims that waited for a uid so far)."""
    out = code_score(task.program, task.tests, task.fn_name, None, settings, 60.0)
    return out["score"] == 1.0, *_uid_waits(settings)


def grade_one_process(task: Task, settings: SandboxConfig) -> tuple[bool, int, int]:
    result = sandbox_for(settings).run_python(PRELUDE + task.one_process)
    return result.ok, *_uid_waits(settings)


def _uid_waits(settings: SandboxConfig) -> tuple[int, int]:
    uids = sandbox_for(settings).uids
    return os.getpid(), uids.waits if uids is not None else 0


async def warm_up(pool: RewardPool, settings: SandboxConfig, workers: int) -> None:
    """Each pool process imports the grader and sets up its sandbox before the clock runs
    (a call at a time each: the pool gives each of these to the least loaded process)."""
    answers = await asyncio.gather(
        *(pool.call(_uid_waits, settings, on_thread=True) for _ in range(workers))
    )
    assert len({pid for (pid, _), _ in answers}) == workers, answers


async def drive(
    pool: RewardPool, grade: Any, tasks: list[Task], settings: SandboxConfig, conversations: int
) -> dict[str, Any]:
    queue: asyncio.Queue[Task] = asyncio.Queue()
    for task in tasks:
        queue.put_nowait(task)
    latencies: list[float] = []
    passed, failures, waits = 0, 0, {}

    async def conversation() -> None:
        nonlocal passed, failures
        while not queue.empty():
            task = queue.get_nowait()
            start = time.perf_counter()
            answer, why = await pool.call(grade, task, settings, on_thread=True)
            latencies.append(time.perf_counter() - start)
            if why is not None:
                failures += 1
                continue
            ok, pid, seen = answer
            passed += ok
            waits[pid] = max(waits.get(pid, 0), seen)

    start = time.perf_counter()
    await asyncio.gather(*(conversation() for _ in range(conversations)))
    elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "programs": len(tasks),
        "seconds": elapsed,
        "per_s": len(tasks) / elapsed,
        "p50_s": latencies[len(latencies) // 2],
        "p99_s": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "passed": passed,
        "pool_failures": failures,
        "uid_waits": sum(waits.values()),
    }


def measure(conversations: list[int], programs: int, workers: int) -> list[dict[str, Any]]:
    rows = []
    sets = task_sets()
    for c in conversations:
        base = SandboxConfig()
        settings = replace(base, concurrency=c, uid_slots=c * max(2, base.parallel))
        for name, all_tasks in sets.items():
            n = max(programs, 2 * c)
            tasks = [all_tasks[i % len(all_tasks)] for i in range(n)]
            for label, grade in (("one process", grade_one_process), ("run_tests", grade_reflow)):
                pool = RewardPool(workers, timeout_s=600, concurrency=c)
                try:
                    asyncio.run(warm_up(pool, settings, workers))
                    row = asyncio.run(drive(pool, grade, tasks, settings, c))
                finally:
                    pool.close()
                rows.append({"set": name, "grader": label, "conversations": c, **row})
                print(json.dumps(rows[-1]), flush=True)
    return rows


def table(rows: list[dict[str, Any]], cores: int) -> str:
    lines = [
        "| set | conversations | grader | programs/s | per core | p50 s | p99 s | "
        "graded correct | uid waits | ratio |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    base: dict[tuple[str, int], float] = {}
    for r in rows:
        key = (r["set"], r["conversations"])
        if r["grader"] == "one process":
            base[key] = r["per_s"]
        ratio = r["per_s"] / base[key]
        lines.append(
            f"| {r['set']} | {r['conversations']} | {r['grader']} | {r['per_s']:.2f} | "
            f"{r['per_s'] / cores:.2f} | {r['p50_s']:.2f} | {r['p99_s']:.2f} | "
            f"{r['passed']}/{r['programs']} | {r['uid_waits']} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conversations", default="1,32,256", help="comma-separated")
    ap.add_argument("--programs", type=int, default=100, help="at least, per set and level")
    ap.add_argument("--workers", type=int, default=SandboxConfig().reward_workers)
    ap.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = ap.parse_args()
    levels = [int(x) for x in args.conversations.split(",")]
    cores = os.cpu_count() or 1
    rows = measure(levels, args.programs, args.workers)
    print(f"\n{cores} cores, {args.workers} pool processes")
    print(table(rows, cores))
    if args.out:
        args.out.write_text(json.dumps({"cores": cores, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
