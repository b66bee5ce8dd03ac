"""Tokens generated again after a preemption: ``reflow stop`` of the CPU demo while its
rollout ranks are generating, then ``reflow launch --resume``.

One run, real engines (vLLM CPU build, torch), this machine: ``recipes/demo.yaml --local``
in a fresh runs folder; at step >= ``--stop-at``, ``reflow stop`` (the checkpoint keeps
what the rollout ranks had generated of the requests in flight: ``partial_rollouts`` in
its record), then ``--resume`` with ``train.steps`` ``--more`` steps past the saved one.
Reported from the final status (``buffer.partial_rollouts``): the requests and tokens
kept, the tokens the resumed run continued (same token under the same policy version as
before the stop) and those it generated again, and the sample ledger.

There is no baseline run: before partial rollouts were kept, a stop put every request in
flight back in the queue from its prompt, so every kept token was generated again by
construction; this reports counts, not times.

    .venv/bin/python benchmarks/preemption.py [--stop-at 14] [--more 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TERMINAL = ("COMPLETED", "FAILED", "STOPPED")
WAIT_S = 1800  # a bound on each phase: the demo's first start builds and caches its model


def reflow(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "reflow_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"reflow {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done.stdout


def wait_for(env: dict[str, str], run: str, done, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        s = json.loads(reflow(env, "status", run, "--json"))
        if done(s):
            return s
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {WAIT_S} s waiting for {what}; state {s['state']}")
        time.sleep(1.0)


def wait_gone(pids: list[int]) -> None:
    """The stopped run's processes have left (a resume is refused while its job is alive)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                os.kill(pid, 0)
                alive.append(pid)
            except ProcessLookupError:
                pass
        if not alive:
            return
        time.sleep(0.5)
    raise SystemExit(f"gave up after {WAIT_S} s waiting for ranks {alive} to leave")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stop-at", type=int, default=14, help="stop once this step is done")
    ap.add_argument("--more", type=int, default=6, help="steps past the saved one to resume")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args()

    runs = Path(tempfile.mkdtemp(prefix="reflow-preemption-"))
    env = {**os.environ, "REFLOW_RUNS_DIR": str(runs), "COLUMNS": "200"}
    reflow(env, "launch", "recipes/demo.yaml", "--local")
    (run_dir,) = runs.iterdir()
    run = run_dir.name
    s = wait_for(
        env, run, lambda s: s["step"] >= args.stop_at or s["state"] in TERMINAL, "the stop step"
    )
    reflow(env, "stop", run)
    job = json.loads((run_dir / "job.json").read_text())  # local: the controller's pid
    wait_gone([w["pid"] for w in s["workers"]] + [int(job["job_id"])])
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = summary["checkpoints"][-1]
    target = saved["step"] + args.more
    reflow(env, "launch", "--resume", run, "--local", "--set", f"train.steps={target}")
    final = wait_for(env, run, lambda s: s["state"] in TERMINAL, "the resumed run's end")

    partials = final["buffer"]["partial_rollouts"]
    report = {
        "run": str(run_dir),
        "stopped_at_step": saved["step"],
        "checkpoint_ok": saved["ok"],
        "kept": saved.get("partial_rollouts", {"requests": 0, "tokens": 0}),
        "resumed_state": final["state"],
        "resumed_step": final["step"],
        "continued_tokens": partials.get("continued_tokens", 0),
        "regenerated_tokens": partials.get("regenerated_tokens", 0),
        "refused": {k: v for k, v in partials.items() if k.startswith("refused_")},
        "ranks_not_reported": partials.get("ranks_not_reported", 0),
        "ledger": final["buffer"]["ledger"],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
