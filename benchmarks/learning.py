"""Time to reward, measured: learning arms that accumulate across sessions, and the report.

An arm is one recipe in one mode with one seed and one set of overrides, run on the real
engines (4 local ranks, vLLM CPU build + torch trainer) to its full length; it leaves a
small JSON record in ``docs/learning/arms/`` (benchmarks/learning_arms.py) to be committed at
once. The plans (benchmarks/learning_plan.py) list the arms of the report; an arm already
recorded is skipped, so the report is built a few arms at a time, session by session:

    .venv/bin/python benchmarks/learning.py --plan equivalence,modes [--max-arms N]
    .venv/bin/python benchmarks/learning.py --report-only [docs/learning]
    .venv/bin/python benchmarks/learning.py --grid-from reports/sim/grid.json

``--report-only`` rebuilds the report (``learning.md``, ``learning.json``, the plots, in
the folder) from the records in its ``arms/`` alone, no run folder needed; ``--grid-from``
distills a simulated grid (``benchmarks/sim_grid.py --best-placement``) into the folder's
``grid.json``, which the report's projection to cluster scale reads
(benchmarks/learning_projection.py).

Run arms with nothing else heavy beside them (an arm whose machine was busy is marked and
left out of the seconds figures), and the test suite after them. Arms run the code of the
checkout this script is in: run them from a snapshot (``git worktree add``) when you go on
changing the code, and point ``--dir`` at the checkout you commit from.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path

try:  # imported as benchmarks.learning (the tests) or run as a script (benchmarks/ on path)
    from benchmarks import learning_arms as arms
    from benchmarks import learning_projection as projection
    from benchmarks import learning_render as render
    from benchmarks import learning_report as report
    from benchmarks.learning_plan import HELD_OUT, plan_arms
except ModuleNotFoundError:
    import learning_arms as arms
    import learning_projection as projection
    import learning_render as render
    import learning_report as report
    from learning_plan import HELD_OUT, plan_arms

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "docs" / "learning"
ARMS = "arms"  # the records' subfolder
GRID = "grid.json"  # the distilled grid, beside the report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", help="run the named plans' arms that have no record yet")
    ap.add_argument("--dir", type=Path, default=FOLDER, help="the report's folder (arms/ in it)")
    ap.add_argument("--out", type=Path, default=Path("reports/learning"), help="run folders")
    ap.add_argument("--arm-timeout", type=float, default=3600.0, help="seconds per arm")
    ap.add_argument("--max-arms", type=int, help="stop after running this many arms")
    ap.add_argument(
        "--rerun-busy",
        action="store_true",
        help="run again the arms whose record is marked busy (their seconds left out)",
    )
    ap.add_argument(
        "--report-only",
        type=Path,
        nargs="?",
        const=FOLDER,
        metavar="DIR",
        help="rebuild the report in DIR from DIR/arms (default docs/learning)",
    )
    ap.add_argument("--grid-from", type=Path, metavar="GRID_JSON", help="distill a sim grid")
    args = ap.parse_args(argv)
    try:
        if args.grid_from:
            print(f"wrote {distill_grid(args.grid_from, args.dir)}", file=sys.stderr)
        elif args.plan:
            # `kill PID` stops the plan and the arm it is running (run_arm kills its run)
            signal.signal(signal.SIGTERM, lambda *_: sys.exit("learning.py: stopped (SIGTERM)"))
            run_plan(args)
        else:
            folder = args.report_only or args.dir
            print(write_report(folder), end="")
            print(f"wrote {folder / 'learning.md'} and {folder / 'learning.json'}", file=sys.stderr)
    except (ValueError, arms.BadRecord, report.BadInput) as exc:
        raise SystemExit(f"learning.py: {exc}") from None


def parse_list(text: str, what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise ValueError(f"--{what}: empty")
    return items


def run_plan(args) -> None:
    """Run the planned arms that have no record in ``--records``, one at a time, each
    record written as its arm ends (commit it: a later session goes on from there)."""
    if args.max_arms is not None and args.max_arms < 1:
        raise ValueError("--max-arms: must be at least 1")
    records = (args.dir / ARMS).resolve()
    planned = plan_arms(parse_list(args.plan, "plan"))
    todo = [a for a in planned if not recorded(a, records, rerun_busy=args.rerun_busy)]
    if args.max_arms is not None:
        todo = todo[: args.max_arms]
    print(f"{len(todo)} arm(s) to run: {', '.join(a.name for a in todo)}", file=sys.stderr)
    out = args.out.resolve()
    for i, arm in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {arm.name} ...", file=sys.stderr, flush=True)
        rec = arms.run_arm(
            arm,
            repo=REPO,
            runs=out,
            records=records,
            timeout_s=args.arm_timeout,
            held_out=HELD_OUT.get(arm.recipe, "eval_reward"),
        )
        evals = rec["evals"]
        end = f"final {evals[-1]['reward']:.3f}" if evals else "no eval"
        print(
            f"    {rec['machine']['seconds']:.0f} s, {end}, problem: {rec['problem']}, "
            f"busy: {rec['machine']['busy']}",
            file=sys.stderr,
            flush=True,
        )


def recorded(arm: arms.ArmSpec, records: Path, *, rerun_busy: bool = False) -> bool:
    """Whether ``arm`` has a usable record already (a failed run's record counts as none:
    the arm runs again and its new record replaces it; with ``rerun_busy`` a busy one
    too, so that a quiet machine can measure its seconds)."""
    path = records / f"{arm.name}.json"
    if not path.exists():
        return False
    rec = arms.read_record(path)
    busy = rerun_busy and bool((rec.get("machine") or {}).get("busy"))
    return rec["spec"] == arm and rec["problem"] is None and not busy


def write_report(folder: Path) -> str:
    """The report from ``folder``'s records (``arms/``; and its grid.json, when there is
    one), written in it as learning.md, learning.json and the plots; returns the Markdown."""
    grid_path = folder / GRID
    grid = projection.read_grid(grid_path) if grid_path.exists() else None
    rep = report.build(folder / ARMS, grid)
    plot_note = render.plots(rep, folder)
    md = render.render(rep, plot_note=plot_note)
    (folder / "learning.md").write_text(md)
    (folder / "learning.json").write_text(json.dumps(rep, indent=1, default=str) + "\n")
    return md


def distill_grid(grid_json: Path, folder: Path) -> Path:
    rows = arms.read_json(grid_json)
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{grid_json}: not a sim_grid.py grid.json (a list of rows)")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    try:
        grid = projection.distill(rows, source=str(grid_json), commit=head.stdout.strip())
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{grid_json}: a row without workload, model, gpus, protocol") from None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / GRID
    path.write_text(json.dumps(grid, indent=1) + "\n")
    return path


if __name__ == "__main__":
    main()
