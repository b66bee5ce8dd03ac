"""The paper's grid in simulation: every mode on every (model, workload, GPUs) cell, plus
ablations of ReFlow's parts, with the ideal-throughput bound per run.

    .venv/bin/python benchmarks/sim_grid.py [--syncs 10] [--out reports/sim] [--quick]
        [--jobs N] [--set reflow.delta=2 ...]

Each cell simulates the shipped cluster recipe (recipes/dapo_math.yaml for math,
recipes/apps_coding.yaml for the APPS agent, recipes/retool.yaml for ReTool's tool-calling
math) resized to the cell's GPUs, with the model's profile from
runtime/sim/profiles.yaml, for ``--syncs`` weight syncs (the recipe's
``sync_every`` steps each). ``reflow`` runs with adaptive caps on; the ablations turn
replay (sigma = 0), the allocator, or adaptive caps off. Output: a Markdown report (and
``grid.json``) in --out, with every idle second by cause for async and reflow, plus PNG
plots when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from runtime.config.recipe import load_recipe
from runtime.sim.run import figures, plan, simulate

REPO = Path(__file__).resolve().parents[1]
MODES = ("sync", "one_step_off", "async", "reflow")
GRID = [
    *[("math", m, g) for m in ("qwen3-8b", "qwen3-14b", "qwen3-32b") for g in (16, 32, 64, 128)],
    *[("apps_agent", m, g) for m in ("qwen3-4b", "qwen3-8b", "qwen3-14b") for g in (8, 16, 32, 64)],
    # tool-interactive math (ReTool): sandbox calls mid-generation (profiles.yaml retool)
    *[("retool", "qwen3-8b", g) for g in (16, 32)],
]
QUICK = [("math", "qwen3-8b", 32), ("apps_agent", "qwen3-8b", 16)]
RECIPES = {"math": "dapo_math.yaml", "apps_agent": "apps_coding.yaml", "retool": "retool.yaml"}
ABLATIONS = {
    "replay off": ["reflow.sigma=0"],
    "allocator off": ["scheduler.auto_rebalance=false"],
    "adaptive caps off": ["scheduler.adaptive_caps=false"],
}


def run_cell(workload: str, model: str, gpus: int, syncs: int, mode: str, sets: list[str]):
    recipe = REPO / "recipes" / RECIPES[workload]
    sync_every = load_recipe(recipe, sets).train.sync_every
    sets = [f"train.steps={syncs * sync_every}", *sets]
    if mode == "reflow" and "scheduler.adaptive_caps=false" not in sets:
        sets.append("scheduler.adaptive_caps=true")  # ReFlow with every part on
    if mode != "reflow":  # the baselines keep their initial placement and fixed caps
        sets += ["scheduler.auto_rebalance=false", "scheduler.adaptive_caps=false"]
    cfg = load_recipe(recipe, sets)
    row = figures(simulate(plan(cfg, gpus, mode=mode, model=model, workload=workload)), gpus)
    row.update(workload=workload, model=model, gpus=gpus, overrides=sets)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--syncs", type=int, default=10, help="weight syncs per run")
    ap.add_argument("--out", type=Path, default=REPO / "reports" / "sim")
    ap.add_argument("--quick", action="store_true", help="two cells only")
    ap.add_argument(
        "--cells",
        default="",
        help="only these cells, e.g. math:qwen3-8b:128,apps_agent:qwen3-8b:64",
    )
    ap.add_argument("--no-ablations", action="store_true", help="the four modes only")
    ap.add_argument("--part", default="1/1", help="K/N: every N-th cell from the K-th")
    ap.add_argument("--merge", nargs="*", type=Path, help="grid.json files to report on")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a recipe field in every run, e.g. --set reflow.delta=2",
    )
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cells = QUICK if args.quick else GRID
    if args.cells:
        wanted = [tuple(c.split(":")) for c in args.cells.split(",")]
        cells = [(w, m, int(g)) for w, m, g in wanted]
    k, n = (int(x) for x in args.part.split("/"))
    cells = cells[k - 1 :: n]
    rows = []
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(f.read_text())]
        cells = []
    runs = []  # (label, workload, model, gpus, mode, sets)
    for workload, model, gpus in cells:
        runs += [(mode, workload, model, gpus, mode, args.set) for mode in MODES]
        runs += [
            (f"reflow, {name}", workload, model, gpus, "reflow", [*args.set, *sets])
            for name, sets in ABLATIONS.items()
            if not args.no_ablations
        ]
    with ProcessPoolExecutor(args.jobs) as pool:  # each run is single-threaded Python
        futures = [
            pool.submit(run_cell, w, m, g, args.syncs, mode, sets)
            for _, w, m, g, mode, sets in runs
        ]
        for (label, *_), future in zip(runs, futures, strict=True):
            row = future.result()
            row["mode"] = label
            rows.append(row)
            print(json.dumps(row), flush=True)
    (args.out / "grid.json").write_text(json.dumps(rows, indent=1))
    report = render(rows, args.syncs)
    (args.out / "report.md").write_text(report)
    plots(rows, args.out)
    print(report)


def in_grid_order(rows: list[dict]) -> list[dict]:
    order = {cell: i for i, cell in enumerate(GRID)}
    return sorted(rows, key=lambda r: order.get((r["workload"], r["model"], r["gpus"]), -1))


def causes(shares: dict[str, float], top: int = 3) -> str:
    """The largest idle causes, e.g. ``fresh_short 12%, weight_sync 3%``."""
    best = sorted(shares.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v:.1%}" for k, v in best if v >= 0.0005) or "none"


def render(rows: list[dict], syncs: int) -> str:
    cells: dict[tuple, dict[str, dict]] = {}
    for r in in_grid_order(rows):
        cells.setdefault((r["workload"], r["model"], r["gpus"]), {})[r["mode"]] = r
    common = sorted(set.intersection(*(set(r.get("overrides", [])) for r in rows)))
    lines = [
        f"Simulated {syncs} weight syncs per run ({len(rows)} runs); profiles: "
        "runtime/sim/profiles.yaml; overrides in every run: "
        f"{', '.join(common) or 'none'}. Speed-ups of reflow in trained tokens/s, and in "
        "steps per hour in brackets (replayed samples are older, so often shorter: fewer "
        "tokens per step).",
        "",
        "| workload | model | GPUs | reflow tokens/s | vs sync | vs one-step-off | vs async "
        "| trainer idle sync / async / reflow | X/X* reflow | final placement |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    wins = step_wins = idle_wins = 0
    for (workload, model, gpus), by in cells.items():
        rf = by["reflow"]
        x = rf["trainer_tokens_per_s"]
        ratios = [x / max(by[m]["trainer_tokens_per_s"], 1e-9) for m in MODES[:3]]
        per_step = [by[m]["sim_hours"] / max(rf["sim_hours"], 1e-9) for m in MODES[:3]]
        wins += all(q > 1 for q in ratios)
        step_wins += all(q > 1 for q in per_step)
        idle_wins += rf["trainer_idle_ratio"] < by["async"]["trainer_idle_ratio"]
        idle = " / ".join(f"{by[m]['trainer_idle_ratio']:.0%}" for m in ("sync", "async", "reflow"))
        lines.append(
            f"| {workload} | {model} | {gpus} | {x:.0f} | "
            + " | ".join(f"{q:.2f}x ({h:.2f}x)" for q, h in zip(ratios, per_step, strict=True))
            + f" | {idle} | {rf['efficiency']:.2f} | {rf['placements'][-1]} |"
        )
    lines += [
        "",
        f"reflow fastest in {wins} of {len(cells)} cells by tokens/s, in {step_wins} by steps "
        f"per hour; its trainer idle ratio is below async's in {idle_wins}.",
        "",
        "Idle by cause (share of trainer time since the first step, of rollout active time; "
        "the three largest causes; runtime/control/idle.py), replay share of trained "
        "samples, and the mean tokens of samples evicted unused against those trained fresh:",
        "",
        "| workload | model | GPUs | mode | trainer idle | by cause | rollout idle | by cause "
        "| replay share | evicted / trained tokens |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (workload, model, gpus), by in cells.items():
        for mode in ("async", "reflow"):
            r = by[mode]
            bias = r.get("length_bias", {})
            ev, co = bias.get("evicted_mean_tokens"), bias.get("consumed_mean_tokens")
            lines.append(
                f"| {workload} | {model} | {gpus} | {mode} | {r['trainer_idle_ratio']:.1%} | "
                f"{causes(r.get('trainer_idle_by_cause', {}))} | "
                f"{r['rollout_idle_ratio']:.1%} | {causes(r.get('rollout_idle_by_cause', {}))} "
                f"| {r.get('replay_share', 0.0):.1%} | "
                f"{'-' if ev is None else f'{ev:.0f}'} / {'-' if co is None else f'{co:.0f}'} |"
            )
    lines += [
        "",
        "Ablations (tokens/s relative to reflow with every part on):",
        "",
        "| workload | model | GPUs | " + " | ".join(ABLATIONS) + " |",
        "|---|---|---|" + "---|" * len(ABLATIONS),
    ]
    for (workload, model, gpus), by in cells.items():
        x = by["reflow"]["trainer_tokens_per_s"]
        if not all(f"reflow, {a}" in by for a in ABLATIONS):
            continue  # run with --no-ablations
        lines.append(
            f"| {workload} | {model} | {gpus} | "
            + " | ".join(
                f"{by[f'reflow, {a}']['trainer_tokens_per_s'] / max(x, 1e-9):.2f}x"
                for a in ABLATIONS
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def plots(rows: list[dict], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (make bench installs it)")
        return
    cells: dict[tuple, dict[str, dict]] = {}
    for r in in_grid_order(rows):
        cells.setdefault((r["workload"], r["model"], r["gpus"]), {})[r["mode"]] = r
    labels = [f"{w}\n{m}\n{g}" for (w, m, g) in cells]
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(cells) * 0.9), 8))
    width = 0.2
    for i, mode in enumerate(MODES):
        xs = [j + (i - 1.5) * width for j in range(len(cells))]
        axes[0].bar(
            xs, [by[mode]["trainer_tokens_per_s"] for by in cells.values()], width, label=mode
        )
        axes[1].bar(
            xs, [by[mode]["trainer_idle_ratio"] for by in cells.values()], width, label=mode
        )
    for ax, title in zip(axes, ("trainer tokens/s", "trainer idle ratio"), strict=True):
        ax.set_title(title)
        ax.set_xticks(range(len(cells)))
        ax.set_xticklabels(labels, fontsize=6)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "throughput_idle.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
