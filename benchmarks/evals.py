"""What held-out evals cost the training: examples/arith_retry on the CPU (4 local ranks,
vLLM CPU build + torch, its two eval sets), with an eval every ``--every`` steps.

Arms, one after another on the same seed:

- ``rollout``: the evals as this checkout plays them (on a pinned rollout engine, training
  going on: runtime/control/evals.py);
- ``none``: no eval sets (``data.eval={}``): the training alone;
- ``blocking`` (with ``--blocking-repo PATH``): the same recipe launched from another
  checkout, one whose trainer leader plays the sets itself while every rank waits (before
  the rollout evals; give it a ``git worktree`` of such a commit).

Per arm: wall seconds from the first to the last step (``wall_s`` of the step lines), the
run's wall seconds, the rounds and their seconds. The report gives each arm's training wall
time over the ``none`` arm's, measured in the same invocation:

    .venv/bin/python benchmarks/evals.py [--steps 75] [--every 25] [--out reports/evals]
        [--blocking-repo /tmp/wt-blocking]

One run per arm: a single seed, said so.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = "examples/arith_retry/recipe.yaml"


def run_arm(arm: str, repo: Path, steps: int, every: int, runs: Path) -> dict:
    sets = [f"name=evals-{arm}", f"train.steps={steps}"]
    # no sets, no eval_every (a launch refuses it with nothing to evaluate)
    sets += ["data.eval={}"] if arm == "none" else [f"train.eval_every={every}"]
    args = [sys.executable, "-m", "reflow_cli.main", "launch", str(repo / RECIPE), "--local"]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "REFLOW_RUNS_DIR": str(runs), "PYTHONPATH": str(repo)}
    started = time.monotonic()
    done = subprocess.run([*args, "--wait"], capture_output=True, text=True, env=env, cwd=repo)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{arm}: the run failed: {done.stderr.strip()[-500:]}")
    run_dir = max(runs.glob(f"evals-{arm}-*"), key=lambda d: d.stat().st_mtime)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_lines = [x for x in lines if "eval_version" not in x and "wall_s" in x]
    rounds = [x for x in lines if "eval_version" in x]
    blocking_s = sum(x.get("eval_s", 0.0) for x in steps_lines)  # the trainer leader's evals
    return {
        "arm": arm,
        "repo": str(repo),
        "run": run_dir.name,
        "launch_to_end_s": round(seconds, 1),
        "first_to_last_step_s": round(steps_lines[-1]["wall_s"] - steps_lines[0]["wall_s"], 1),
        "last_step_wall_s": round(steps_lines[-1]["wall_s"], 1),
        "rounds": [
            {k: x[k] for k in ("step", "eval_version", "eval_s", "eval_complete")} for x in rounds
        ],
        "blocking_eval_s": round(blocking_s, 1),
    }


def report(rows: list[dict], steps: int, every: int) -> str:
    base = next(r for r in rows if r["arm"] == "none")
    out = [
        f"examples/arith_retry, {steps} steps, an eval every {every} (and at the start and "
        "the end), one run per arm (a single seed).",
        "",
        "| arm | last step at (s) | x none | launch to end (s) | eval rounds (s each) "
        "| leader's blocking evals (s) |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        each = ", ".join(f"v{x['eval_version']}: {x['eval_s']:.1f}" for x in r["rounds"]) or "-"
        ratio = r["last_step_wall_s"] / base["last_step_wall_s"]
        out.append(
            f"| {r['arm']} | {r['last_step_wall_s']} | {ratio:.3f}x | {r['launch_to_end_s']} "
            f"| {each} | {r['blocking_eval_s']} |"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=75)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--out", type=Path, default=REPO / "reports/evals")
    ap.add_argument("--blocking-repo", type=Path, default=None)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    runs = a.out / "runs"
    runs.mkdir(exist_ok=True)
    arms = [("none", REPO), ("rollout", REPO)]
    if a.blocking_repo is not None:
        arms.append(("blocking", a.blocking_repo.resolve()))
    rows = []
    for arm, repo in arms:
        rows.append(run_arm(arm, repo, a.steps, a.every, runs))
        print(json.dumps(rows[-1]), flush=True)
        (a.out / "evals.json").write_text(json.dumps(rows, indent=1))
    (a.out / "evals.md").write_text(report(rows, a.steps, a.every))
    print(report(rows, a.steps, a.every))


if __name__ == "__main__":
    main()
