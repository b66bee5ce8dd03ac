"""The four execution modes on the demo task, same ranks, same run of this script.

Each mode runs the demo recipe (4 local ranks, real vLLM CPU rollout + torch trainer) for
the same number of steps, one after the other, and the script prints trainer tokens/s over
the training window (first to last step), trainer idle %, rollout idle %, wall time and
reward, with throughput as a ratio to `sync` measured in this run:

    .venv/bin/python benchmarks/modes.py [--steps 60] [--modes sync,one_step_off,async,reflow]

It also prints the median weight-sync time per mode (the trainer leader's bucketed gloo
broadcast to the rollout ranks) and, from one more `reflow` run rebalanced 2:2 -> 3:1 ->
2:2 mid-training (`--switch-steps`, 0 to skip), the role-switch times (the coordinator's
RoleSwitch to the last RoleSwitchDone: regrouping, trainer state to the new replica,
weights to the new rollout rank).

The runs go to a temporary runs folder unless REFLOW_RUNS_DIR is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs.launch import wait_until
from runtime.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]

MODES = ("sync", "one_step_off", "async", "reflow")


def cli(*args: str, runs: Path, **kw) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "reflow_cli.main", *args]
    env = {**os.environ, "REFLOW_RUNS_DIR": str(runs)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, **kw)


def launch_args(name: str, sets: list[str], *, wait: bool) -> list[str]:
    args = ["launch", str(REPO / "recipes/demo.yaml"), "--local", "--set", f"name={name}"]
    for s in sets:
        args += ["--set", s]
    return args + (["--wait"] if wait else [])


def run_mode(mode: str, steps: int, runs: Path) -> Path:
    sets = [f"train.steps={steps}", f"reflow.mode={mode}"]
    if mode != "reflow":
        sets.append("reflow.sigma=0")
    done = cli(*launch_args(f"bench-{mode}", sets, wait=True), runs=runs)
    run_dir = max(runs.glob(f"bench-{mode}-*"), key=lambda d: d.stat().st_mtime)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: run failed; see {run_dir}")
    return run_dir


def summarize(mode: str, run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if summary["state"] != "COMPLETED":
        raise SystemExit(f"{mode}: run {summary['state']} ({summary.get('reason')})")
    tail = lines[-max(1, len(lines) // 5) :]
    # Throughput over the training window (first to last step): engine start-up, the
    # same for every mode, would otherwise dilute the differences.
    window = lines[-1]["wall_s"] - lines[0]["wall_s"]
    return {
        "mode": mode,
        "wall_s": summary["wall_s"],
        "train_wall_s": window,
        "tokens_per_s": sum(x["tokens"] for x in lines[1:]) / window,
        "trainer_idle": summary["trainer_idle_ratio"],
        "rollout_idle": summary["rollout_idle_ratio"],
        "reward_last": statistics.fmean(x["reward_mean"] for x in tail),
        "eval_end": summary.get("eval_reward_end"),
        "sync_s": summary.get("weight_sync_s_median"),
    }


def run_switches(steps: int, runs: Path) -> list[dict]:
    """A reflow run rebalanced 2:2 -> 3:1 -> 2:2; the switch records from its summary."""
    started = cli(*launch_args("bench-switch", [f"train.steps={steps}"], wait=False), runs=runs)
    if started.returncode != 0:
        raise SystemExit(f"switch run did not start: {started.stderr.strip()}")
    run = max(runs.glob("bench-switch-*"), key=lambda d: d.stat().st_mtime)

    def wait(pred) -> dict:  # until pred holds or the run ends
        return wait_until(RunPaths(run), pred, timeout_s=900)

    for ratio, after in (("3:1", steps // 4), ("2:2", steps // 2)):
        wait(lambda s, after=after: s.get("step", 0) >= after)
        cli("rebalance", "--ratio", ratio, run.name, runs=runs)
        wait(
            lambda s, ratio=ratio: (
                s["layout"].get("rollout_gpus") == int(ratio[0])
                and not s["layout"].get("switching")
            )
        )
    wait(lambda s: False)
    for _ in range(120):
        if (run / "summary.json").exists():
            break
        time.sleep(0.5)
    summary = json.loads((run / "summary.json").read_text())
    if summary["state"] != "COMPLETED":
        raise SystemExit(f"switch run {summary['state']} ({summary.get('reason')})")
    return [x for x in summary["switches"] if x["applied"]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--switch-steps", type=int, default=60)
    ap.add_argument(
        "--report-only",
        metavar="RUNS_DIR",
        help="tabulate the newest bench-<mode>-* runs in RUNS_DIR instead of running",
    )
    args = ap.parse_args()
    results = []
    if args.report_only:
        runs = Path(args.report_only)
        for m in filter(None, args.modes.split(",")):
            run_dir = max(runs.glob(f"bench-{m}-*"), key=lambda d: d.stat().st_mtime)
            results.append(summarize(m, run_dir))
    else:
        runs = Path(os.environ.get("REFLOW_RUNS_DIR") or tempfile.mkdtemp(prefix="reflow-bench-"))
        for m in filter(None, args.modes.split(",")):
            results.append(summarize(m, run_mode(m, args.steps, runs)))
    switches = []
    if args.report_only:
        newest = sorted(runs.glob("bench-switch-*"), key=lambda d: d.stat().st_mtime)
        if newest and (newest[-1] / "summary.json").exists():
            summary = json.loads((newest[-1] / "summary.json").read_text())
            switches = [x for x in summary.get("switches", []) if x["applied"]]
    elif args.switch_steps:
        switches = run_switches(args.switch_steps, runs)
    base = next((r for r in results if r["mode"] == "sync"), results[0] if results else None)
    if results:
        steps = "steps per mode as run" if args.report_only else f"{args.steps} steps per mode"
        print(f"{steps}, demo recipe, 4 local ranks (2 rollout : 2 trainer)")
        print(
            "| mode | trainer tok/s (training window) | ratio to sync | trainer idle | "
            "rollout idle | wall s (training window) | batch reward, last 20% | eval end | "
            "weight sync s (median) |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for r in results:
            ratio = r["tokens_per_s"] / base["tokens_per_s"]
            sync = "-" if r["sync_s"] is None else f"{r['sync_s']:.3f}"
            print(
                f"| {r['mode']} | {r['tokens_per_s']:.0f} | {ratio:.2f}"
                f" | {100 * r['trainer_idle']:.1f}% | {100 * r['rollout_idle']:.1f}% | "
                f"{r['wall_s']:.0f} ({r['train_wall_s']:.0f}) | {r['reward_last']:.3f} | "
                f"{r['eval_end'] if r['eval_end'] is None else round(r['eval_end'], 3)} | "
                f"{sync} |"
            )
    if switches:
        print()
        print("| role switch | whole switch s (RoleSwitch to last done) | slowest rank s |")
        print("|---|---|---|")
        for x in switches:
            print(f"| to {x['ratio']} | {x['duration_s']:.3f} | {x['max_rank_switch_s']:.3f} |")


if __name__ == "__main__":
    main()
