"""Isolation overhead, and what grading costs.

1. Programs/s through ReFlow's sandbox against plain ``subprocess``: both sides run the
   same programs (MBPP reference solutions with their asserts, from ``../shared/data``
   when present, else the first 300, shipped in ``recipes/data``), the same number at
   once, with the same interpreter; the plain side has no uid change, no rlimits, no
   namespaces.
2. The grader (``run_tests``: the program's and the tests' processes and the relay
   between them, sandbox starts included) against the one-process harness the grader
   used before it guarded the verdict (program and tests appended into one sandboxed
   process, "exited 0" taken for "passed"), on MBPP, HumanEval and the LeetCodeDataset
   v0.2.0 slice: programs/s per core, p50/p99 latency per program, and the ratio.

Run:

    .venv/bin/python benchmarks/sandbox.py [--programs 300] [--parallel 2] [--graded 100]

Every figure is measured in the run that prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime.data.datasets import load_records
from runtime.workloads.rewards.code import PRELUDE, parse_tests, run_tests
from runtime.workloads.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[1]
FULL_MBPP = REPO.parent / "shared" / "data" / "mbpp" / "mbpp.jsonl"
MBPP = FULL_MBPP if FULL_MBPP.is_file() else REPO / "recipes" / "data" / "mbpp" / "mbpp.jsonl"


def programs(n: int) -> list[str]:
    if MBPP.is_file():
        rows = [json.loads(x) for x in MBPP.open()][:n]
        return [
            PRELUDE + r["code"] + "\n" + parse_tests(r).script + "\n" + "\n".join(r["test_list"])
            for r in rows
        ]
    return [PRELUDE + f"assert sum(range({i})) == {i * (i - 1) // 2}" for i in range(n)]


def plain(source: str, python: str) -> bool:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "main.py"
        path.write_text(source)
        done = subprocess.run([python, "-s", str(path)], capture_output=True, timeout=10, cwd=d)
    return done.returncode == 0


def measure(run, sources: list[str], parallel: int) -> tuple[float, int]:
    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        ok = sum(pool.map(run, sources))
    return len(sources) / (time.perf_counter() - start), ok


def graded_sets(n: int) -> dict[str, list[tuple[str, dict, str]]]:
    """(program, tests record, the one-process source) per task: reference solutions."""
    data = REPO / "recipes" / "data"
    mbpp = [json.loads(x) for x in MBPP.open()][:n]
    he = load_records(data / "humaneval/HumanEval.jsonl.gz")[:n]
    lc = load_records(data / "leetcode/LeetCodeDataset-v0.2.0-test.jsonl.gz")[:n]
    return {
        "MBPP": [
            (
                r["code"],
                r,
                r["code"] + "\n" + parse_tests(r).script + "\n" + "\n".join(r["test_list"]),
            )
            for r in mbpp
        ],
        "HumanEval": [
            (
                r["prompt"] + r["canonical_solution"],
                r,
                r["prompt"]
                + r["canonical_solution"]
                + "\n"
                + r["test"]
                + f"\ncheck({r['entry_point']})\n",
            )
            for r in he
        ],
        "LeetCode": [
            (
                r["completion"],
                {"test": r["test"], "entry_point": r["entry_point"], "preamble": r["prompt"]},
                r["prompt"] + r["completion"] + "\n" + r["test"] + f"\ncheck({r['entry_point']})\n",
            )
            for r in lc
        ],
    }


def timed(run, items: list, parallel: int) -> tuple[float, list[float], int]:
    def one(item):
        t = time.perf_counter()
        ok = run(item)
        return time.perf_counter() - t, ok

    start = time.perf_counter()
    with ThreadPoolExecutor(parallel) as pool:
        done = list(pool.map(one, items))
    return (
        len(items) / (time.perf_counter() - start),
        sorted(t for t, _ in done),
        sum(ok for _, ok in done),
    )


def pct(xs: list[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def grading(n: int, parallel: int) -> None:
    sb = Sandbox(isolation="bwrap")
    cores = min(parallel, os.cpu_count() or 1)
    print(f"\n{n} reference solutions per set, {parallel} at a time on {cores} cores")
    print("| set | grader | programs/s per core | p50 s | p99 s | passed | ratio |")
    print("|---|---|---|---|---|---|---|")
    for name, items in graded_sets(n).items():
        one = timed(lambda it: sb.run_python(PRELUDE + it[2]).ok, items, parallel)
        full = timed(
            lambda it: run_tests(it[0], parse_tests(it[1]), sb).score == 1.0,
            items,
            parallel,
        )
        for label, (rate, lat, ok) in (("one process (old)", one), ("run_tests", full)):
            ratio = rate / one[0]
            print(
                f"| {name} | {label} | {rate / cores:.2f} | {pct(lat, 0.5):.3f} | "
                f"{pct(lat, 0.99):.3f} | {ok}/{len(items)} | {ratio:.2f} |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--graded", type=int, default=100, help="tasks per set graded (0: skip)")
    args = ap.parse_args()
    sources = programs(args.programs)
    python = "/usr/bin/python3"
    rows = [("plain subprocess", *measure(lambda s: plain(s, python), sources, args.parallel))]
    for isolation in ("rlimits", "bwrap"):
        sb = Sandbox(isolation=isolation, python=python)
        rate, ok = measure(lambda s, sb=sb: sb.run_python(s).ok, sources, args.parallel)
        rows.append((f"sandbox ({isolation})", rate, ok))
    base = rows[0][1]
    print(f"{len(sources)} programs, {args.parallel} at a time, {python}")
    print("| runner | programs/s | passed | ratio to plain |")
    print("|---|---|---|---|")
    for name, rate, ok in rows:
        print(f"| {name} | {rate:.1f} | {ok}/{len(sources)} | {rate / base:.2f} |")
    if args.graded:
        grading(args.graded, args.parallel)


if __name__ == "__main__":
    main()
