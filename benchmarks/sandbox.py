"""Isolation overhead: programs/s through ReFlow's sandbox against plain ``subprocess``.

Both sides run the same programs (MBPP reference solutions with their asserts, from
``../shared/data`` when present, else the first 300, shipped in ``recipes/data``), the same
number at once, with the same interpreter; the plain side has no uid change, no rlimits, no
namespaces.
Run:

    .venv/bin/python benchmarks/sandbox.py [--programs 300] [--parallel 2]

Prints programs/s for plain subprocess, the rlimits-only fallback and bwrap, and their
ratios to plain, all measured in this run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from runtime.workloads.rewards.code import PRELUDE, parse_tests
from runtime.workloads.sandbox import Sandbox

REPO = Path(__file__).resolve().parents[1]
FULL_MBPP = REPO.parent / "shared" / "data" / "mbpp" / "mbpp.jsonl"
MBPP = FULL_MBPP if FULL_MBPP.is_file() else REPO / "recipes" / "data" / "mbpp" / "mbpp.jsonl"


def programs(n: int) -> list[str]:
    if MBPP.is_file():
        rows = [json.loads(x) for x in MBPP.open()][:n]
        return [PRELUDE + r["code"] + "\n" + parse_tests(r).script for r in rows]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--programs", type=int, default=300)
    ap.add_argument("--parallel", type=int, default=2)
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


if __name__ == "__main__":
    main()
