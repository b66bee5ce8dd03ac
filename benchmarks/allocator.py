"""The producer/consumer allocator on real engines: a workload that drifts.

Runs ``recipes/demo_drift.yaml`` (4 local ranks, vLLM CPU rollout + torch trainer, the
arithmetic task with problem lengths that rise over 600 prompts and fall back over the
next 600, the allocator on) and reports, per block of steps, the rollout ranks, the mean
response length of the generated samples, and every placement the allocator applied with
the rates it measured; then the sample ledger (lost, duplicated).

    .venv/bin/python benchmarks/allocator.py [--steps 700] [--block 50] [--out DIR]
                                             [--set FIELD=VALUE ...] [--run-dir DIR]

``--run-dir`` reports on a finished run instead of starting one. The run goes to a
temporary runs folder unless REFLOW_RUNS_DIR is set. Nothing here asserts a direction: on
a 2-core machine the rates are what they are, and the report says which way it went.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "demo_drift.yaml"


def run(steps: int, sets: list[str], runs: Path) -> Path:
    cmd = [sys.executable, "-m", "reflow_cli.main", "launch", str(RECIPE), "--local", "--wait"]
    for s in [f"train.steps={steps}", *sets]:
        cmd += ["--set", s]
    env = {**os.environ, "REFLOW_RUNS_DIR": str(runs)}
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    run_dir = max(runs.glob("demo-drift-*"), key=lambda d: d.stat().st_mtime)
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.stderr.strip()[-300:]}); see {run_dir}")
    return run_dir


def report(run_dir: Path, block: int) -> str:
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out = [
        f"Run {run_dir.name}: {summary['state']} ({summary.get('reason')}), "
        f"{summary['steps']} steps, {summary['wall_s']:.0f} s.",
        "",
        "| steps | wall s | rollout:trainer | mean response tokens | rollout reward |",
        "|---|---|---|---|---|",
    ]
    for i in range(0, len(lines), block):
        part = lines[i : i + block]
        layouts = " → ".join(dict.fromkeys(x["layout"] for x in part))
        resp = [x["rollout_response_tokens"] for x in part if "rollout_response_tokens" in x]
        reward = [x["rollout_reward_mean"] for x in part if "rollout_reward_mean" in x]
        out.append(
            f"| {part[0]['step']}-{part[-1]['step']} | {part[0]['wall_s']:.0f} | {layouts} | "
            f"{statistics.fmean(resp) if resp else float('nan'):.1f} | "
            f"{statistics.fmean(reward) if reward else float('nan'):.2f} |"
        )
    out += [
        "",
        "Placements applied (rates are samples per busy rank-second over the window):",
        "",
        "| step | from → to | rollout rate r | trainer rate t | target coverage | "
        "predicted coverage (from, to) |",
        "|---|---|---|---|---|---|",
    ]
    for x in lines:
        d = x.get("placement")
        if d and d["applied"]:
            out.append(
                f"| {d['step']} | {d['current']} → {d['best']} | {d['rollout_rate']:.2f} | "
                f"{d['trainer_rate']:.2f} | {d['target_coverage']:.2f} | "
                f"{d['predicted'][d['current']]:.2f}, {d['predicted'][d['best']]:.2f} |"
            )
    transitions = [t for x in lines for t in x.get("transitions", [])]
    if transitions:
        out += [
            "",
            "Role switches: "
            + ", ".join(f"{t['ratio']} in {t['duration_s']:.2f} s" for t in transitions),
        ]
    ledger = summary["samples"]
    out += [
        "",
        f"Samples: lost {ledger['lost']}, duplicated {ledger['duplicated']}; "
        f"eval {summary.get('eval_reward_start')} → {summary.get('eval_reward_end')}.",
    ]
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--block", type=int, default=50, help="steps per table row")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--out", type=Path, help="write report.md there")
    ap.add_argument("--run-dir", type=Path, help="report on this finished run")
    args = ap.parse_args()
    if args.run_dir is not None:
        run_dir = args.run_dir
    else:
        runs = Path(os.environ.get("REFLOW_RUNS_DIR") or tempfile.mkdtemp(prefix="reflow-alloc-"))
        run_dir = run(args.steps, args.set, runs)
    text = report(run_dir, args.block)
    print(text, end="")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(text)


if __name__ == "__main__":
    main()
