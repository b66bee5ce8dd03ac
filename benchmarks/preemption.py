"""Tokens generated again after a preemption: ``reflow stop`` of the CPU demo while its
rollout ranks are generating, then ``reflow launch --resume``.

One run, real engines (vLLM CPU build, torch), this machine: ``recipes/demo.yaml --local``
in a fresh runs folder; at step >= ``--stop-at``, ``reflow stop`` (the checkpoint keeps
what the rollout ranks had generated of the requests in flight: ``parked_rollouts`` in
its record), then ``--resume`` with ``train.steps`` ``--more`` steps past the saved one.
Reported from the final status (``buffer.parked_rollouts``): the requests and tokens
kept, the tokens the resumed run continued (same token under the same policy version as
before the stop) and those it generated again, and the sample ledger.

There is no baseline run: before parked rollouts were kept, a stop put every request in
flight back in the queue from its prompt, so every kept token was generated again by
construction; this reports counts, not times.

    .venv/bin/python benchmarks/preemption.py [--stop-at 14] [--more 6] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

try:  # imported as benchmarks.preemption or run as a script (benchmarks/ on path)
    from benchmarks.modes import cli, launch_args
except ModuleNotFoundError:
    from modes import cli, launch_args

TERMINAL = ("COMPLETED", "FAILED", "STOPPED")
WAIT_S = 1800  # a bound on each phase: the demo's first start builds and caches its model


def reflow(runs: Path, *args: str) -> str:
    done = cli(*args, runs=runs, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"reflow {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done.stdout


def wait_for(runs: Path, run: str, done, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        s = json.loads(reflow(runs, "status", run, "--json"))
        if done(s):
            return s
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {WAIT_S} s waiting for {what}; state {s['state']}")
        time.sleep(1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stop-at", type=int, default=14, help="stop once this step is done")
    ap.add_argument("--more", type=int, default=6, help="steps past the saved one to resume")
    ap.add_argument("--json", type=Path, help="also write the report here")
    args = ap.parse_args()

    runs = Path(tempfile.mkdtemp(prefix="reflow-preemption-"))
    reflow(runs, *launch_args("preemption", [], wait=False))
    (run_dir,) = runs.iterdir()
    run = run_dir.name
    wait_for(
        runs, run, lambda s: s["step"] >= args.stop_at or s["state"] in TERMINAL, "the stop step"
    )
    reflow(runs, "stop", run)  # returns once the job has left: the resume may follow
    summary = json.loads((run_dir / "summary.json").read_text())
    saved = summary["checkpoints"][-1]
    target = saved["step"] + args.more
    reflow(runs, "launch", "--resume", run, "--local", "--set", f"train.steps={target}")
    final = wait_for(runs, run, lambda s: s["state"] in TERMINAL, "the resumed run's end")

    parked = final["buffer"]["parked_rollouts"]
    report = {
        "run": str(run_dir),
        "stopped_at_step": saved["step"],
        "checkpoint_ok": saved["ok"],
        "kept": saved.get("parked_rollouts", {"requests": 0, "tokens": 0}),
        "resumed_state": final["state"],
        "resumed_step": final["step"],
        "continued_tokens": parked.get("continued_tokens", 0),
        "regenerated_tokens": parked.get("regenerated_tokens", 0),
        "refused": {k: v for k, v in parked.items() if k.startswith("refused_")},
        "ranks_not_reported": parked.get("ranks_not_reported", 0),
        "ledger": final["buffer"]["ledger"],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
