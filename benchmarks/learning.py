"""Learning quality of the execution modes on the demo task, over seeds.

Every mode in ``--modes`` runs the demo recipe (4 local ranks, real vLLM CPU rollout +
torch trainer) once per seed in ``--seeds`` (``train.seed``), all for the same ``--steps``,
one run at a time, each in its own folder under ``--out``:

    .venv/bin/python benchmarks/learning.py [--modes colocated_sync,one_step_off,async,reflow]
        [--seeds 0,1,2] [--steps 200] [--out reports/learning] [--level R] [--set k=v ...]
    .venv/bin/python benchmarks/learning.py --report-only reports/learning [--level R]

From each run it reads the held-out reward (greedy accuracy on the arith eval set) against
the step and against the wall time, and writes ``learning.md`` and ``learning.json`` (and,
with matplotlib, ``reward_vs_step.png`` and ``reward_vs_time.png``) to the output folder:
per mode the mean final reward with its min-max over seeds, the steps and seconds each run
took to a common reward level, and, for every pair of modes, whether their min-max ranges
overlap. Overlapping ranges are reported as indistinguishable at this spread.

The settings are the same for every mode except what the mode itself changes: like
``benchmarks/modes.py``, the demo's ``reflow.sigma: 0.5`` (replay) is set to 0 outside
``reflow``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

try:  # imported as benchmarks.learning (the tests) or run as a script (benchmarks/ on path)
    from benchmarks import learning_arms as arms
    from benchmarks.learning_plan import plan_arms
    from benchmarks.modes import cli, launch_args, mode_overrides
except ModuleNotFoundError:
    import learning_arms as arms
    from learning_plan import plan_arms
    from modes import cli, launch_args, mode_overrides

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "learning"

DEFAULT_MODES = ("colocated_sync", "one_step_off", "async", "reflow")
# the order modes are listed in when a folder is reported on (others follow, by name)
ORDER = ("colocated_sync", "disaggregated_sync", "sync", "one_step_off", "async", "reflow")
PREFIX = "learn"  # run folders are <PREFIX>-<mode>-s<seed>-<timestamp>

CLOCK = (
    "seconds since the run's first training step: metrics.jsonl `wall_s` minus the first "
    "line's (rank 0's clock, the same for every mode; engine start-up is before it)"
)


class BadInput(ValueError):
    """A run folder or an argument the report cannot use; the message names it."""


@dataclass
class Run:
    mode: str
    seed: int
    folder: str
    steps: int  # training steps in metrics.jsonl
    train_wall_s: float  # first to last step
    # (step, seconds since the first step, held-out reward); step 0 is the policy before
    # training, drawn at 0 s
    evals: list[tuple[int, float, float]]
    problem: str | None = None  # why the run is left out of the aggregates

    @property
    def trained(self) -> list[tuple[int, float, float]]:
        """The evals after training began: only these count as reaching a level (step 0
        is the same initial policy in every run)."""
        return [e for e in self.evals if e[0] >= 1]

    @property
    def final(self) -> float:
        return self.evals[-1][2]


# ---- reading run folders ----------------------------------------------------------------


def read_run(folder: Path) -> Run:
    """One run folder: mode and seed from its resolved config.yaml, the held-out evals from
    metrics.jsonl (``eval_reward_start`` as step 0, ``eval_reward`` at any step,
    ``eval_reward_end`` at the last), its state from summary.json."""
    cfg_path = folder / "config.yaml"
    try:
        cfg = yaml.safe_load(cfg_path.read_text())
        mode, seed = str(cfg["reflow"]["mode"]), int(cfg["train"]["seed"])
    except OSError as exc:
        raise BadInput(f"{cfg_path}: cannot read ({exc.strerror})") from None
    except (yaml.YAMLError, TypeError, KeyError, ValueError):
        raise BadInput(f"{cfg_path}: no reflow.mode / train.seed") from None
    run = Run(mode, seed, str(folder), 0, 0.0, [])
    if not (folder / "metrics.jsonl").exists():  # it failed before its first step
        run.problem = "no metrics.jsonl: the run ended before its first step"
        return run
    lines = read_metrics(folder / "metrics.jsonl")
    if not lines:
        run.problem = "metrics.jsonl has no steps"
        return run
    t0 = lines[0]["wall_s"]
    run.steps = len(lines)
    run.train_wall_s = lines[-1]["wall_s"] - t0
    by_step: dict[int, tuple[int, float, float]] = {}
    for x in lines:
        t = x["wall_s"] - t0
        if "eval_reward_start" in x:
            by_step[0] = (0, 0.0, float(x["eval_reward_start"]))
        for key in ("eval_reward", "eval_reward_end"):  # the end's wins at the last step
            if key in x:
                by_step[x["step"]] = (x["step"], t, float(x[key]))
    run.evals = [by_step[s] for s in sorted(by_step)]
    run.problem = run_problem(folder, lines, run)
    return run


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's lines in order, each checked for the fields the report uses."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror})") from None
    lines = []
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            x = json.loads(raw)
            float(x["wall_s"]), int(x["step"])
        except (json.JSONDecodeError, TypeError, KeyError, ValueError):
            raise BadInput(f"{path}:{i}: not a metrics line with step and wall_s") from None
        lines.append(x)
    return lines


def run_problem(folder: Path, lines: list[dict], run: Run) -> str | None:
    summary = folder / "summary.json"
    if not summary.exists():
        return "no summary.json (still running, or killed)"
    try:
        s = json.loads(summary.read_text())
    except json.JSONDecodeError:
        raise BadInput(f"{summary}: not JSON") from None
    if s.get("state") != "COMPLETED":
        return f"state {s.get('state')} ({s.get('reason')})"
    if any(x.get("attempt", 1) != 1 for x in lines):
        return "resumed: wall_s restarts at each attempt"
    if not run.trained or run.evals[-1][0] != lines[-1]["step"]:
        return "no held-out eval at the last step"
    return None


def find_runs(root: Path) -> tuple[list[Run], list[str]]:
    """The run folders under ``root`` (those with config.yaml and metrics.jsonl); of two of
    the same mode and seed the newest counts, the other is noted."""
    if not root.is_dir():
        raise BadInput(f"{root}: not a folder")
    runs = [read_run(d) for d in sorted(root.iterdir()) if is_run(d)]
    if not runs:
        raise BadInput(f"{root}: no run folders (config.yaml + metrics.jsonl)")
    newest: dict[tuple[str, int], Run] = {}
    notes = []
    for r in sorted(runs, key=lambda r: Path(r.folder).stat().st_mtime):
        if (r.mode, r.seed) in newest:
            notes.append(f"{newest[r.mode, r.seed].folder}: replaced by the newer {r.folder}")
        newest[r.mode, r.seed] = r
    return list(newest.values()), notes


def is_run(d: Path) -> bool:
    return d.is_dir() and (d / "config.yaml").exists() and (d / "metrics.jsonl").exists()


# ---- aggregation ------------------------------------------------------------------------


def spread(values: list[float]) -> dict:
    """Mean, min and max of a mode's runs (what the seeds support, no more)."""
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def common_level(runs: list[Run]) -> float:
    """The highest held-out reward that every run reached at some eval after training
    began: the lowest of the runs' best rewards."""
    return min(max(e[2] for e in r.trained) for r in runs)


def first_reach(run: Run, level: float) -> tuple[int, float] | None:
    """(step, seconds) of the run's first eval after training began at or above level."""
    return next(((s, t) for s, t, v in run.trained if v >= level), None)


def ranges_overlap(a: dict, b: dict) -> bool:
    """Whether two min-max ranges share a point."""
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def compare(name_a: str, a: dict, name_b: str, b: dict, what: str, fmt: str, higher: str) -> str:
    """One sentence on two modes' ranges of ``what``, both ranges quoted: indistinguishable
    at this spread when they overlap, otherwise which one is ahead (``higher``: "higher"
    for rewards, "faster" for times, where the lower range is ahead); not compared when
    either mode has a single run."""
    ra = f"{name_a} {a['min']:{fmt}}-{a['max']:{fmt}}"
    rb = f"{name_b} {b['min']:{fmt}}-{b['max']:{fmt}}"
    seeds = f"{a['n']} and {b['n']} runs"
    if min(a["n"], b["n"]) < 2:  # a single run has no spread to set a difference against
        return (
            f"{name_a} and {name_b}: not compared, a single run has no spread ({what}: {ra}, "
            f"{rb}; {seeds})."
        )
    if ranges_overlap(a, b):
        return (
            f"{name_a} and {name_b}: indistinguishable at this spread ({what}: {ra}, {rb}; "
            f"{seeds})."
        )
    lead, other = (name_a, name_b) if a["min"] > b["max"] else (name_b, name_a)
    if higher == "faster":  # less time is better: the lower range leads
        lead, other = other, lead
    return f"{lead} {higher} than {other}: the ranges do not overlap ({what}: {ra}, {rb}; {seeds})."


def band(series: list[list[tuple[float, float]]]) -> dict:
    """Mean and min-max of step functions: each run's value at x is its latest eval at or
    before x (after its last eval, its final policy's), on the union of the runs' xs."""
    xs = sorted({x for s in series for x, _ in s})
    mean, lo, hi = [], [], []
    for x in xs:
        ys = [next(y for xi, y in reversed(s) if xi <= x) for s in series if s[0][0] <= x]
        mean.append(statistics.fmean(ys))
        lo.append(min(ys))
        hi.append(max(ys))
    return {"x": xs, "mean": mean, "min": lo, "max": hi}


def aggregate(runs: list[Run], level: float | None = None, modes: list[str] | None = None) -> dict:
    """Everything the report says, from the runs: per mode the spread of final reward and
    of steps and seconds to the level, the curves, and the pairwise comparisons."""
    good = [r for r in runs if r.problem is None]
    if not good:
        raise BadInput("no complete run to report on (every run is listed with its problem)")
    modes = modes or sorted({r.mode for r in good}, key=mode_key)
    level_source = "given (--level)"
    if level is None:
        level, level_source = common_level(good), "the highest every run reached"
    out: dict = {
        "level": level,
        "level_source": level_source,
        "clock": CLOCK,
        "modes": {},
        "runs": [asdict(r) for r in runs],
        "comparisons": {"final_reward": [], "time_to_level": []},
    }
    for m in modes:
        mine = sorted((r for r in good if r.mode == m), key=lambda r: r.seed)
        if not mine:
            out["modes"][m] = {"runs": 0}
            continue
        reach = [first_reach(r, level) for r in mine]
        reached = [x for x in reach if x is not None]
        starts = [r.evals[0][2] for r in mine if r.evals[0][0] == 0]
        out["modes"][m] = {
            "runs": len(mine),
            "seeds": [r.seed for r in mine],
            "final_reward": spread([r.final for r in mine]),
            "start_reward": spread(starts) if starts else None,
            "train_wall_s": spread([r.train_wall_s for r in mine]),
            "reached": len(reached),
            "steps_to_level": spread([s for s, _ in reached]) if reached else None,
            "time_to_level": spread([t for _, t in reached]) if reached else None,
            "per_run": [
                {"seed": r.seed, "final": r.final, "to_level": x}
                for r, x in zip(mine, reach, strict=True)
            ],
            "vs_step": band([[(s, v) for s, _, v in r.evals] for r in mine]),
            "vs_time": band([[(t, v) for _, t, v in r.evals] for r in mine]),
        }
    present = [m for m in modes if out["modes"][m]["runs"]]
    for a, b in itertools.combinations(present, 2):
        ma, mb = out["modes"][a], out["modes"][b]
        out["comparisons"]["final_reward"].append(
            compare(a, ma["final_reward"], b, mb["final_reward"], "final reward", ".3f", "higher")
        )
        if ma["reached"] == ma["runs"] and mb["reached"] == mb["runs"]:
            sentence = compare(
                a, ma["time_to_level"], b, mb["time_to_level"], "seconds to level", ".0f", "faster"
            )
        else:
            sentence = f"{a} and {b}: not compared on time to level (not every run reached it)."
        out["comparisons"]["time_to_level"].append(sentence)
    return out


def mode_key(mode: str) -> tuple[int, str]:
    return (ORDER.index(mode) if mode in ORDER else len(ORDER), mode)


# ---- the report -------------------------------------------------------------------------


def fmt_spread(s: dict | None, fmt: str, unit: str = "") -> str:
    if s is None:
        return "-"
    if s["min"] == s["max"]:  # one run, or every run the same
        return f"{s['mean']:{fmt}}{unit}"
    return f"{s['mean']:{fmt}}{unit} [{s['min']:{fmt}}-{s['max']:{fmt}}]"


def render(agg: dict, *, settings: str, notes: list[str], plot_note: str) -> str:
    level = agg["level"]
    out = [
        "# Learning quality by execution mode (demo recipe, seeds)",
        "",
        settings,
        "",
        f"Held-out reward: greedy accuracy on the arith eval set (`eval_reward*` in "
        f"metrics.jsonl). Wall time: {CLOCK}. The policy before training (step 0) is drawn "
        f"at 0 s and does not count as reaching a level.",
        "",
        f"Common level: **{level:.3f}** ({agg['level_source']}); a run's steps and seconds to "
        f"it are those of its first eval at or above it. Figures are the mean over seeds "
        f"[min-max].",
    ]
    evals = sorted({len(r["evals"]) - (r["evals"][0][0] == 0) for r in agg["runs"] if r["evals"]})
    if evals == [1]:
        out += [
            "",
            "These runs have one held-out eval after training starts (at the last step): the "
            "curves have two points, and the steps and seconds to the level are those of the "
            "last step.",
        ]
    out += [
        "",
        "| mode | runs (seeds) | start reward | final reward | training window s | "
        f"reached {level:.3f} | steps to it | seconds to it |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m, s in agg["modes"].items():
        if not s["runs"]:
            out.append(f"| {m} | 0 | - | - | - | - | - | - |")
            continue
        out.append(
            f"| {m} | {s['runs']} ({', '.join(map(str, s['seeds']))}) | "
            f"{fmt_spread(s['start_reward'], '.3f')} | {fmt_spread(s['final_reward'], '.3f')} | "
            f"{fmt_spread(s['train_wall_s'], '.0f')} | {s['reached']}/{s['runs']} | "
            f"{fmt_spread(s['steps_to_level'], '.0f')} | "
            f"{fmt_spread(s['time_to_level'], '.0f')} |"
        )
    short = [m for m, s in agg["modes"].items() if s["runs"] and s["reached"] < s["runs"]]
    if short:
        out += ["", f"Not every run reached {level:.3f} in: {', '.join(short)}."]
    out += ["", "## What the spread supports", ""]
    if any(s["runs"] == 1 for s in agg["modes"].values()):
        out += [
            "Some modes have one run: a single run has no spread, so its range is that run "
            "alone and says nothing about seed-to-seed variation.",
            "",
        ]
    comps = agg["comparisons"]
    if not comps["final_reward"]:
        out.append("One mode only: nothing to compare.")
    out += [f"- {x}" for x in comps["final_reward"]]
    if comps["time_to_level"]:
        out += ["", f"Time to {level:.3f}:", ""]
        out += [f"- {x}" for x in comps["time_to_level"]]
    left_out = [r for r in agg["runs"] if r["problem"]]
    if left_out or notes:
        out += ["", "## Left out", ""]
        out += [f"- {r['folder']}: {r['problem']}" for r in left_out]
        out += [f"- {n}" for n in notes]
    out += ["", plot_note]
    return "\n".join(out) + "\n"


def plots(agg: dict, out: Path) -> str:
    """reward_vs_step.png and reward_vs_time.png: per mode the mean line and a min-max band
    over seeds. Returns the report's line about them."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No plots: matplotlib is not importable (`pip install -e '.[bench]'`)."
    names = []
    for key, xlabel, name in (
        ("vs_step", "training step", "reward_vs_step.png"),
        ("vs_time", "seconds since the first step", "reward_vs_time.png"),
    ):
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        for m, s in agg["modes"].items():
            if not s["runs"]:
                continue
            b = s[key]
            (line,) = ax.step(
                b["x"], b["mean"], where="post", marker="o", ms=3, label=f"{m} ({s['runs']} runs)"
            )
            ax.fill_between(
                b["x"], b["min"], b["max"], step="post", alpha=0.2, color=line.get_color()
            )
        ax.axhline(agg["level"], color="grey", linestyle="--", linewidth=0.8, label="level")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out reward (mean, min-max)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        names.append(f"`{name}`")
    return f"Plots: {', '.join(names)} (mean line, min-max band over seeds)."


def write_report(agg: dict, out: Path, *, settings: str, notes: list[str]) -> str:
    out.mkdir(parents=True, exist_ok=True)
    plot_note = plots(agg, out)
    report = render(agg, settings=settings, notes=notes, plot_note=plot_note)
    (out / "learning.md").write_text(report)
    (out / "learning.json").write_text(
        json.dumps({**agg, "settings": settings, "notes": notes, "plots": plot_note}, indent=1)
    )
    return report


# ---- running ----------------------------------------------------------------------------


def mode_sets(mode: str, seed: int, steps: int) -> list[str]:
    """The overrides of one run: the steps, the seed and the mode (as benchmarks/modes.py
    runs a mode: the demo's sigma 0.5 is reflow's, 0 for every other mode)."""
    return [f"train.steps={steps}", f"train.seed={seed}", *mode_overrides(mode)]


def run_one(mode: str, seed: int, steps: int, extra: list[str], out: Path) -> Run:
    name = f"{PREFIX}-{mode}-s{seed}"
    before = set(out.glob(f"{name}-*"))
    done = cli(*launch_args(name, [*mode_sets(mode, seed, steps), *extra], wait=True), runs=out)
    made = sorted(set(out.glob(f"{name}-*")) - before)
    if not made:
        msg = (done.stderr or done.stdout).strip().splitlines()
        raise BadInput(f"{mode} seed {seed}: no run folder ({msg[-1] if msg else 'no output'})")
    run = read_run(made[-1])
    if done.returncode != 0 and run.problem is None:
        run.problem = f"reflow launch exited {done.returncode}"
    return run


def parse_list(text: str, what: str, conv=str) -> list:
    try:
        items = [conv(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BadInput(f"--{what}: not a comma-separated list ({text!r})") from None
    if not items:
        raise BadInput(f"--{what}: empty")
    return items


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", help=f"comma-separated (default {','.join(DEFAULT_MODES)})")
    ap.add_argument("--seeds", default="0,1,2", help="train.seed values, comma-separated")
    ap.add_argument("--steps", type=int, default=200, help="training steps of every run")
    ap.add_argument("--out", type=Path, default=Path("reports/learning"))
    ap.add_argument("--level", type=float, help="reward level (default: the common one)")
    ap.add_argument(
        "--set", action="append", default=[], metavar="K=V", help="override for every run"
    )
    ap.add_argument("--report-only", type=Path, metavar="DIR", help="report on DIR's runs")
    ap.add_argument("--plan", help="run the named plans' arms that have no record yet")
    ap.add_argument("--records", type=Path, default=RECORDS, help="arm records folder")
    ap.add_argument("--arm-timeout", type=float, default=3600.0, help="seconds per arm")
    ap.add_argument("--max-arms", type=int, help="stop after running this many arms")
    args = ap.parse_args(argv)
    if args.plan:
        try:
            run_plan(args)
        except (ValueError, arms.BadRecord) as exc:
            raise SystemExit(f"learning.py: {exc}") from None
        return
    try:
        report, out = (report_only if args.report_only else run_all)(args)
    except BadInput as exc:
        raise SystemExit(f"learning.py: {exc}") from None
    print(report, end="")
    print(f"wrote {out / 'learning.md'} and {out / 'learning.json'}", file=sys.stderr)


def run_plan(args) -> None:
    """Run the planned arms that have no record in ``--records``, one at a time, each
    record written as its arm ends (commit it: a later session goes on from there)."""
    todo = [a for a in plan_arms(parse_list(args.plan, "plan")) if not recorded(a, args.records)]
    if args.max_arms is not None:
        todo = todo[: args.max_arms]
    print(f"{len(todo)} arm(s) to run: {', '.join(a.name for a in todo)}", file=sys.stderr)
    for i, arm in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {arm.name} ...", file=sys.stderr, flush=True)
        out, records = args.out.resolve(), args.records.resolve()
        rec = arms.run_arm(arm, repo=REPO, runs=out, records=records, timeout_s=args.arm_timeout)
        evals = rec["evals"]
        end = f"final {evals[-1]['reward']:.3f}" if evals else "no eval"
        print(
            f"    {rec['machine']['seconds']:.0f} s, {end}, problem: {rec['problem']}, "
            f"busy: {rec['machine']['busy']}",
            file=sys.stderr,
            flush=True,
        )


def recorded(arm, records: Path) -> bool:
    """Whether ``arm`` has a record already (a record of a failed run counts as none)."""
    path = records / f"{arm.name}.json"
    if not path.exists():
        return False
    rec = arms.read_record(path)
    return rec["spec"] == arm and rec["problem"] is None


def report_only(args) -> tuple[str, Path]:
    runs, notes = find_runs(args.report_only)
    modes = parse_list(args.modes, "modes") if args.modes else None
    if modes:
        runs = [r for r in runs if r.mode in modes]
    steps = sorted({r.steps for r in runs if r.problem is None})
    settings = (
        f"Report on the run folders in `{args.report_only}` (demo recipe; steps per run: "
        f"{', '.join(map(str, steps)) or '-'})."
    )
    agg = aggregate(runs, args.level, modes)
    return write_report(agg, args.report_only, settings=settings, notes=notes), args.report_only


def run_all(args) -> tuple[str, Path]:
    from runtime.config.schema import MODES

    modes = parse_list(args.modes or ",".join(DEFAULT_MODES), "modes")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise BadInput(f"--modes: {', '.join(unknown)} not a mode here ({', '.join(MODES)})")
    seeds = parse_list(args.seeds, "seeds", int)
    if args.steps < 1:
        raise BadInput("--steps: must be at least 1")
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for i, (m, seed) in enumerate(itertools.product(modes, seeds), 1):
        started = time.monotonic()
        print(f"[{i}/{len(modes) * len(seeds)}] {m} seed {seed} ...", file=sys.stderr, flush=True)
        r = run_one(m, seed, args.steps, args.set, out)
        took = time.monotonic() - started
        end = f"final {r.final:.3f}" if r.problem is None else f"left out: {r.problem}"
        print(f"    {Path(r.folder).name}: {took:.0f} s, {end}", file=sys.stderr, flush=True)
        runs.append(r)
    extra = "".join(f", `--set {s}`" for s in args.set)
    settings = (
        f"Demo recipe (`recipes/demo.yaml`, 4 local ranks, 2 rollout : 2 trainer), "
        f"{args.steps} steps per run, seeds {', '.join(map(str, seeds))} (`train.seed`), "
        f"one run at a time{extra}; `reflow.sigma=0` outside reflow."
    )
    agg = aggregate(runs, args.level, modes)
    return write_report(agg, out, settings=settings, notes=[]), out


if __name__ == "__main__":
    main()
