"""The five execution modes on the demo task, same ranks, same run of this script.

Each mode runs the demo recipe (4 local ranks, real vLLM CPU rollout + torch trainer) for
the same number of steps, one after the other, and the script prints trainer tokens/s over
the training window (first to last step), trainer idle %, rollout idle %, wall time and
reward, with throughput as a ratio to the strongest baseline measured in this run (the
mode with the most trainer tokens/s among the baselines, runtime/config/modes.py):

    .venv/bin/python benchmarks/modes.py [--steps 60] [--modes colocated_sync,...,reflow]

It also prints the median weight-sync time per mode (the trainer leader's bucketed gloo
broadcast to the rollout ranks) and, from one more `reflow` run rebalanced 2:2 -> 3:1 ->
2:2 mid-training (`--switch-steps`, 0 to skip), the role-switch times (the coordinator's
RoleSwitch to the last RoleSwitchDone: regrouping, trainer state to the new replica,
weights to the new rollout rank).

With ``--out DIR`` it writes ``report.md``, ``modes.json`` and PNG plots (throughput and
idle ratios, rollout reward against wall time, rollout ranks over time) there; the report
adds each mode's time to a common reward level (``--target-reward``, by default the lowest
final level of the modes) and each run simulated with parameters fitted from its own folder
(``runtime/sim/fit.py``; ``--no-fit`` skips it).

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
from runtime.config.modes import MODES, policy
from runtime.sim.cluster import SimStalled
from runtime.sim.fit import fit_run, simulate_fit, window_throughput
from runtime.store.run_dir import RunPaths

REPO = Path(__file__).resolve().parents[1]

SMOOTH = 20  # steps in the reward's trailing mean


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
    sets = [f"train.steps={steps}", *policy(mode).recipe_sets()]
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
        "tokens_per_s": window_throughput(lines),
        "trainer_idle": summary["trainer_idle_ratio"],
        "rollout_idle": summary["rollout_idle_ratio"],
        "reward_last": statistics.fmean(x["reward_mean"] for x in tail),
        "eval_end": summary.get("eval_reward_end"),
        "sync_s": summary.get("weight_sync_s_median"),
        "run_dir": str(run_dir),
        # per step, from the first step on: for the reward and placement plots
        "t": [x["wall_s"] - lines[0]["wall_s"] for x in lines],
        # the reward of every sample generated (before the sampler drops uniform groups)
        "reward": smoothed(rollout_rewards(lines)),
        "layout": [x["layout"] for x in lines],
    }


def rollout_rewards(lines: list[dict]) -> list[float]:
    """Per step, the mean reward of the samples delivered since the step before (the last
    known value where a step saw none)."""
    out, last = [], 0.0
    for x in lines:
        last = x.get("rollout_reward_mean", last)
        out.append(last)
    return out


def smoothed(values: list[float], window: int = SMOOTH) -> list[float]:
    """Trailing mean over ``window`` steps (batch rewards are noisy at b = 32)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v - (values[i - window] if i >= window else 0.0)
        out.append(acc / min(i + 1, window))
    return out


def time_to(target: float, r: dict) -> float | None:
    """Seconds from the first step until the smoothed batch reward first reaches target."""
    return next((t for t, v in zip(r["t"], r["reward"], strict=True) if v >= target), None)


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
    return switch_records(run)


def switch_records(run: Path) -> list[dict]:
    """The applied switches of a run, the first carrying the run's placement per step."""
    summary = json.loads((run / "summary.json").read_text())
    records = [x for x in summary.get("switches", []) if x["applied"]]
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    if records and lines:
        t0 = lines[0]["wall_s"]
        records[0]["series"] = ([x["wall_s"] - t0 for x in lines], [x["layout"] for x in lines])
    return records


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--switch-steps", type=int, default=60)
    ap.add_argument("--out", type=Path, help="write report.md, modes.json and PNG plots here")
    ap.add_argument(
        "--target-reward",
        type=float,
        help="reward level for 'time to reward' (default: the lowest final level of the modes)",
    )
    ap.add_argument(
        "--no-fit", dest="fit", action="store_false", help="skip the simulation of each run"
    )
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
            switches = switch_records(newest[-1])
    elif args.switch_steps:
        switches = run_switches(args.switch_steps, runs)
    fits = fitted(results) if args.fit else {}
    report = render(results, switches, fits, args, target=args.target_reward)
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "report.md").write_text(report)
        (args.out / "modes.json").write_text(
            json.dumps({"results": results, "switches": switches, "fits": fits}, indent=1)
        )
        plots(results, switches, args.out)


def fitted(results: list[dict]) -> dict[str, dict]:
    """Each mode's run simulated with parameters fitted from that run (runtime/sim/fit.py):
    the simulator against the real vLLM/torch engines."""
    out = {}
    for r in results:
        try:
            fit = fit_run(r["run_dir"])
            sim = simulate_fit(fit)
        except (ValueError, KeyError, SimStalled) as exc:
            print(f"{r['mode']}: no fit ({exc})", file=sys.stderr)
            continue
        out[r["mode"]] = {
            "real_tokens_per_s": round(fit.tokens_per_s, 1),
            "sim_tokens_per_s": round(sim, 1),
            "ratio": round(sim / fit.tokens_per_s, 3),
            "decode_step_s": [round(fit.model.step_base_s, 5), round(fit.model.step_per_seq_s, 6)],
            "train_tok_s_per_rank": round(fit.model.train_tok_s, 1),
        }
    return out


def render(results, switches, fits, args, *, target: float | None) -> str:
    out: list[str] = []
    baselines = [r for r in results if policy(r["mode"]).baseline]
    base = max(baselines or results, key=lambda r: r["tokens_per_s"]) if results else None
    if results:
        if target is None:  # the level every mode reached: the lowest final smoothed reward
            target = round(min(r["reward"][-1] for r in results), 3)
        steps = "steps per mode as run" if args.report_only else f"{args.steps} steps per mode"
        out += [
            f"{steps}, demo recipe, 4 local ranks (2 rollout : 2 trainer). Throughput over "
            f"the training window (first to last step); time to reward = seconds from the "
            f"first step until the reward of the generated samples ({SMOOTH}-step trailing mean, "
            f"all groups, before the sampler drops uniform ones) reaches "
            f"{target}.",
            "",
            "| mode | trainer tok/s | ratio to the strongest baseline "
            f"({base['mode']}) | trainer idle | rollout idle | "
            f"wall s (training window) | time to reward {target} | batch reward, last 20% | "
            "eval end | weight sync s (median) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results:
            ratio = r["tokens_per_s"] / base["tokens_per_s"]
            sync = "-" if r["sync_s"] is None else f"{r['sync_s']:.3f}"
            reach = time_to(target, r)
            out.append(
                f"| {r['mode']} | {r['tokens_per_s']:.0f} | {ratio:.2f}"
                f" | {100 * r['trainer_idle']:.1f}% | {100 * r['rollout_idle']:.1f}% | "
                f"{r['wall_s']:.0f} ({r['train_wall_s']:.0f}) | "
                f"{'not reached' if reach is None else f'{reach:.0f} s'} | "
                f"{r['reward_last']:.3f} | "
                f"{r['eval_end'] if r['eval_end'] is None else round(r['eval_end'], 3)} | "
                f"{sync} |"
            )
    if switches:
        out += [
            "",
            "| role switch | whole switch s (RoleSwitch to last done) | slowest rank s |",
            "|---|---|---|",
        ]
        for x in switches:
            out.append(
                f"| to {x['ratio']} | {x['duration_s']:.3f} | {x['max_rank_switch_s']:.3f} |"
            )
    if fits:
        out += [
            "",
            "Each run simulated with parameters fitted from it (runtime/sim/fit.py: the "
            "rollout engines' decode step base + per_seq * c fitted to their tokens/s by "
            "concurrency, trainer tokens per busy rank-second, weight sync, response lengths):",
            "",
            "| mode | decode step base + per_seq·c (ms) | train tok/s per rank | real tok/s | "
            "simulated tok/s | simulated / real |",
            "|---|---|---|---|---|---|",
        ]
        for mode, f in fits.items():
            base, per_seq = f["decode_step_s"]
            out.append(
                f"| {mode} | {1e3 * base:.1f} + {1e3 * per_seq:.2f}·c"
                f" | {f['train_tok_s_per_rank']:.0f}"
                f" | {f['real_tokens_per_s']:.0f} | {f['sim_tokens_per_s']:.0f} | "
                f"{f['ratio']:.2f} |"
            )
    return "\n".join(out) + "\n"


def plots(results: list[dict], switches: list[dict], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (make bench installs it)", file=sys.stderr)
        return
    modes = [r["mode"] for r in results]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    axes[0].bar(modes, [r["tokens_per_s"] for r in results])
    axes[0].set_title("trainer tokens/s (training window)")
    xs = range(len(results))
    axes[1].bar([x - 0.2 for x in xs], [r["trainer_idle"] for r in results], 0.4, label="trainer")
    axes[1].bar([x + 0.2 for x in xs], [r["rollout_idle"] for r in results], 0.4, label="rollout")
    axes[1].set_xticks(list(xs))
    axes[1].set_xticklabels(modes)
    axes[1].set_title("idle ratio")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(out / "throughput_idle.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in results:
        ax.plot(r["t"], r["reward"], label=r["mode"])
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel(f"rollout reward ({SMOOTH}-step mean)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "reward_vs_time.png", dpi=120)
    plt.close(fig)

    # the placement over time of the runs whose allocator may move it (no baseline's does)
    series = [(r["mode"], r["t"], r["layout"]) for r in results if not policy(r["mode"]).baseline]
    if switches and switches[0].get("series"):
        series.append(("reflow, rebalanced by hand", *switches[0]["series"]))
    if series:
        fig, ax = plt.subplots(figsize=(6, 3))
        for name, t, layout in series:
            ax.step(t, [int(x.split(":")[0]) for x in layout], where="post", label=name)
        ax.set_xlabel("seconds since the first step")
        ax.set_ylabel("rollout ranks")
        ax.yaxis.get_major_locator().set_params(integer=True)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "placement.png", dpi=120)
        plt.close(fig)


if __name__ == "__main__":
    main()
