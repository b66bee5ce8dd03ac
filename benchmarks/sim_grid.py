"""The paper's grid in simulation: every mode on every (model, workload, GPUs) cell, plus
ablations of ReFlow's parts, with the ideal-throughput bound per run.

    .venv/bin/python benchmarks/sim_grid.py [--syncs 10] [--out reports/sim] [--quick]
        [--jobs N] [--modes M,...] [--warmup-steps W] [--measure-steps K]
        [--set reflow.delta=2 ...] [--best-placement [--search-budget 8]]

Each cell simulates the shipped cluster recipe (recipes/dapo_math.yaml for math,
recipes/apps_coding.yaml for the APPS agent, recipes/retool.yaml for ReTool's tool-calling
math) resized to the cell's GPUs, with the model's profile from
runtime/sim/profiles.yaml, for ``--syncs`` weight syncs (the recipe's ``sync_every``
steps each), or more if the measurement protocol needs more steps. Every mode runs by its
definition (runtime/sim/run.py ``mode_definition``: the baselines with their initial
placement and fixed caps, ``reflow`` with replay, the allocator and adaptive caps); the
ablations turn replay (sigma = 0), the allocator, or adaptive caps off. Every mode is
measured the same way (``figures``: warm-up steps left out, then the measured steps; per
workload by default). Output: a Markdown report (and ``grid.json``) in --out, with the
speed-up of reflow over each baseline and over the strongest one per cell, every idle
second by cause for async and reflow, plus PNG plots when matplotlib is installed.

``--best-placement`` also searches each split baseline's placement per cell
(runtime/sim/search.py; at most ``--search-budget`` + 2 runs per baseline and cell) and
reports it beside the default, with reflow's speed-up over each at its best.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runtime.config.modes import policy
from runtime.config.recipe import RecipeError, load_recipe
from runtime.config.schema import BASELINES, MODES, Config
from runtime.sim.cluster import SimStalled
from runtime.sim.parameters import ProfileError
from runtime.sim.run import (
    Engines,
    figures,
    given_fields,
    plan,
    protocol_steps,
    simulate,
    steps_needed,
)
from runtime.sim.search import DEFAULT_BUDGET, search

REPO = Path(__file__).resolve().parents[1]
GRID = [
    *[("math", m, g) for m in ("qwen3-8b", "qwen3-14b", "qwen3-32b") for g in (16, 32, 64, 128)],
    # a mixture of experts (profiles.yaml qwen3-30b-a3b: total parameters in memory and
    # syncs, active ones in FLOPs)
    *[("math", "qwen3-30b-a3b", g) for g in (16, 32, 64, 128)],
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
# What each mode is, for the report's header (runtime/config/schema.py MODES).
MODE_DEFINITIONS = {
    "colocated_sync": "every rank generates the next sync_every batches, then every rank "
    "trains them; each phase change pays a role switch, and the way back an in-place weight "
    "sync (verl's default)",
    "disaggregated_sync": "a rollout:trainer split with a barrier: rollout generates one "
    "weight publication's batches (sync_every trainer steps), then waits while the trainer "
    "trains them",
    "one_step_off": "the same split, rollout one publication ahead: it generates the next "
    "publication's batches while the trainer trains this one's",
    "async": "verl's fully-async policy: streaming, partial rollout across weight syncs, "
    "staleness bound delta in versions; no replay, no allocator, fixed caps",
    "reflow": "async plus replay (sigma, tau), the producer/consumer allocator and "
    "adaptive concurrency caps",
}


def train_steps(syncs: int, sync_every: int, warmup: int, measure: int) -> int:
    """Steps of a grid run: ``syncs`` weight syncs, or the protocol's warm-up + measured
    steps if those are more (each rounded up to whole syncs, as the protocol measures)."""
    return max(syncs * sync_every, steps_needed(warmup, measure, sync_every))


# The split baselines: the ones a placement search applies to (a colocated mode has none).
SPLIT_BASELINES = tuple(m for m in BASELINES if not policy(m).colocated)
BEST = ", best placement"  # the label suffix of a baseline's row at its best placement


def cell_config(
    workload: str, syncs: int, sets: list[str], warmup: int | None, measure: int | None
) -> tuple[Config, list[str], tuple[int, int], int]:
    """A cell's recipe with its run length: the config, the --set items it was loaded
    with, the protocol (warm-up, measured steps) and train.steps."""
    recipe = REPO / "recipes" / RECIPES[workload]
    sync_every = load_recipe(recipe, sets).train.sync_every
    warmup, measure = protocol_steps(workload, warmup, measure, sync_every)
    steps = train_steps(syncs, sync_every, warmup, measure)
    # The grid compares training throughput, as the grids before the recipes had eval
    # sets did: the sets are left out (`reflow simulate` and benchmarks/sim_evals.py show
    # their cost), unless a --set names them.
    no_evals = [] if "data.eval" in given_fields(sets) else ["data.eval={}", "train.eval_every=0"]
    sets = [f"train.steps={steps}", *no_evals, *sets]
    return load_recipe(recipe, sets), sets, (warmup, measure), steps


def run_cell(
    workload: str,
    model: str,
    gpus: int,
    syncs: int,
    mode: str,
    sets: list[str],
    warmup_steps: int | None = None,
    measure_steps: int | None = None,
    seed: int = 0,
) -> dict:
    cfg, sets, (warmup, measure), _ = cell_config(
        workload, syncs, sets, warmup_steps, measure_steps
    )
    # the mode's definition (placement, caps, replay) is plan()'s, as in `reflow simulate`
    sim_plan = plan(cfg, gpus, mode=mode, model=model, workload=workload, sets=sets)
    result = simulate(sim_plan, seed=seed)
    row = figures(
        result,
        gpus,
        workload=workload,
        warmup_steps=warmup,
        measure_steps=measure,
        sync_every=cfg.train.sync_every,
    )
    row.update(workload=workload, model=model, gpus=gpus, overrides=sets, seed=seed)
    return row


def best_cell(
    workload: str,
    model: str,
    gpus: int,
    syncs: int,
    mode: str,
    sets: list[str],
    warmup_steps: int | None = None,
    measure_steps: int | None = None,
    budget: int = DEFAULT_BUDGET,
    seed: int = 0,
) -> dict:
    """A baseline at its best placement in a cell (runtime/sim/search.py), measured as
    :func:`run_cell` measures it: the full run's figures, and the search in
    ``placement_search``."""
    cfg, sets, protocol, steps = cell_config(workload, syncs, sets, warmup_steps, measure_steps)
    found = search(
        cfg,
        gpus,
        mode,
        engines=Engines.from_file(),
        model=model,
        workload=workload,
        sets=sets,
        budget=budget,
        protocol=protocol,
        steps=steps,
        seed=seed,
    )
    row = dict(found.figures)
    row.update(workload=workload, model=model, gpus=gpus, overrides=sets, seed=seed)
    row["placement_search"] = {
        "best": found.best.placement,
        "default": found.default.placement,
        "default_tokens_per_s": found.default.tokens_per_s,
        "evaluated": [(e.placement, e.tokens_per_s) for e in found.evaluated],
        "strategy": found.strategy,
        "simulations": found.simulations,
    }
    return row


@dataclass(frozen=True)
class Speedups:
    over: dict[str, float]  # reflow's throughput over each baseline's
    strongest: str  # the baseline with the highest throughput in the cell
    over_strongest: float


def speedups(tokens_per_s: Mapping[str, float]) -> Speedups | None:
    """reflow against the baselines of one cell (mode -> protocol tokens/s; other keys,
    such as ablations, are ignored); None without reflow or without a baseline. A tie for
    the strongest goes to the mode listed first in MODES."""
    if "reflow" not in tokens_per_s:
        return None
    base = {m: tokens_per_s[m] for m in BASELINES if m in tokens_per_s}
    if not base:
        return None
    x = tokens_per_s["reflow"]
    over = {m: x / max(v, 1e-9) for m, v in base.items()}
    strongest = max(base, key=lambda m: base[m])  # the first of equals: dicts keep order
    return Speedups(over, strongest, over[strongest])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--syncs", type=int, default=10, help="weight syncs per run (at least)")
    ap.add_argument("--out", type=Path, default=REPO / "reports" / "sim")
    ap.add_argument("--quick", action="store_true", help="two cells only")
    ap.add_argument(
        "--cells",
        default="",
        help="only these cells, e.g. math:qwen3-8b:128,apps_agent:qwen3-8b:64",
    )
    ap.add_argument("--modes", default=",".join(MODES), help="a comma list of modes to run")
    ap.add_argument("--no-ablations", action="store_true", help="the modes only")
    ap.add_argument(
        "--best-placement",
        action="store_true",
        help="also run each split baseline at its best placement (a search per cell)",
    )
    ap.add_argument(
        "--search-budget",
        type=int,
        default=DEFAULT_BUDGET,
        help="search runs per baseline and cell with --best-placement (shorter protocol)",
    )
    ap.add_argument(
        "--warmup-steps", type=int, help="steps left out before measuring (default per workload)"
    )
    ap.add_argument("--measure-steps", type=int, help="steps measured (default per workload)")
    ap.add_argument("--part", default="1/1", help="K/N: every N-th cell from the K-th")
    ap.add_argument("--merge", nargs="*", type=Path, help="grid.json files to report on")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="runs in parallel")
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="the workload's draws (response lengths, rewards) in every run; a setting "
        "chosen by looking at one seed's grid is checked at another",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a recipe field in every run, e.g. --set reflow.delta=2",
    )
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes {args.modes}: expected a comma list of {', '.join(MODES)}")
    if args.search_budget < 1:
        ap.error(f"--search-budget {args.search_budget}: expected >= 1")
    try:
        protocol_steps(None, args.warmup_steps, args.measure_steps)
    except RecipeError as exc:
        ap.error(str(exc))
    args.out.mkdir(parents=True, exist_ok=True)
    cells = QUICK if args.quick else GRID
    if args.cells:
        wanted = [tuple(c.split(":")) for c in args.cells.split(",")]
        if any(len(c) != 3 or c[0] not in RECIPES or not c[2].isdigit() for c in wanted):
            ap.error(f"--cells {args.cells}: expected WORKLOAD:MODEL:GPUS,...")
        cells = [(w, m, int(g)) for w, m, g in wanted]
    k, n = (int(x) for x in args.part.split("/"))
    cells = cells[k - 1 :: n]
    rows = []
    if args.merge:
        rows = [r for f in args.merge for r in json.loads(f.read_text())]
        if any("protocol" not in r for r in rows):
            ap.error("--merge: rows without 'protocol' (a grid.json from before it): run again")
        cells = []
    runs = []  # (label, workload, model, gpus, mode, sets)
    for workload, model, gpus in cells:
        runs += [(mode, workload, model, gpus, mode, args.set) for mode in modes]
        runs += [
            (f"{mode}{BEST}", workload, model, gpus, mode, args.set)
            for mode in modes
            if args.best_placement and mode in SPLIT_BASELINES
        ]
        runs += [
            (f"reflow, {name}", workload, model, gpus, "reflow", [*args.set, *sets])
            for name, sets in ABLATIONS.items()
            if not args.no_ablations and "reflow" in modes
        ]
    protocol = (args.warmup_steps, args.measure_steps)
    with ProcessPoolExecutor(args.jobs) as pool:  # each run is single-threaded Python
        futures = [
            pool.submit(
                best_cell, w, m, g, args.syncs, mode, sets, *protocol, args.search_budget, args.seed
            )
            if label.endswith(BEST)
            else pool.submit(run_cell, w, m, g, args.syncs, mode, sets, *protocol, args.seed)
            for label, w, m, g, mode, sets in runs
        ]
        for (label, w, m, g, *_), future in zip(runs, futures, strict=True):
            try:
                row = future.result()
            except (RecipeError, ProfileError, SimStalled) as exc:
                raise SystemExit(f"sim_grid: {w}:{m}:{g} {label}: {exc}") from None
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


def by_cell(rows: list[dict]) -> dict[tuple, dict[str, dict]]:
    cells: dict[tuple, dict[str, dict]] = {}
    for r in in_grid_order(rows):
        cells.setdefault((r["workload"], r["model"], r["gpus"]), {})[r["mode"]] = r
    return cells


def cell_speedups(by: Mapping[str, dict]) -> Speedups | None:
    return speedups({m: r["trainer_tokens_per_s"] for m, r in by.items()})


def causes(shares: dict[str, float], top: int = 3) -> str:
    """The largest idle causes, e.g. ``fresh_short 12%, weight_sync 3%``."""
    best = sorted(shares.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {v:.1%}" for k, v in best if v >= 0.0005) or "none"


def header(rows: list[dict], syncs: int, modes: list[str]) -> list[str]:
    """What was run and how it was measured: the protocol and each mode's definition."""
    common = sorted(set.intersection(*(set(r.get("overrides", [])) for r in rows)))
    protocols: dict[str, set[tuple[int, int, int]]] = {}
    for r in rows:
        p = r["protocol"]
        seen = (p["warmup_steps"], p["measure_steps"], p.get("sync_every", 1))
        protocols.setdefault(r["workload"], set()).add(seen)
    used = "; ".join(
        f"{w}: "
        + ", ".join(f"{a} warm-up + {b} measured steps, syncs of {e}" for a, b, e in sorted(ps))
        for w, ps in protocols.items()
    )
    defs = "; ".join(
        f"**{m}**: {MODE_DEFINITIONS.get(m, 'see runtime/config/schema.py')}" for m in modes
    )
    seeds = ", ".join(str(s) for s in sorted({r.get("seed", 0) for r in rows}))
    return [
        f"Simulated, not measured: the runtime's control plane against modelled engines "
        f"(docs/simulator.md). {len(rows)} runs of at least {syncs} weight syncs each, "
        f"workload seed {seeds}; "
        "profiles: runtime/sim/profiles.yaml; overrides in every run: "
        f"{', '.join(common) or 'none'}.",
        "",
        "Protocol, the same for every mode: throughput is the trainer tokens of the measured "
        "steps over the seconds they took (mean tokens per step over mean step time), the "
        "warm-up steps before them left out, both in whole weight-sync intervals so that "
        "each window holds as many generation phases and syncs in every mode "
        f"({used}). Idle ratios count from the "
        "first step to the end of the run; X/X* is the whole run's throughput over its "
        "ideal-throughput bound. The strongest baseline of a cell is the one with the "
        "highest protocol throughput there.",
        "",
        f"Modes: {defs}. Baselines keep their initial placement and fixed concurrency caps.",
        "",
    ]


def render(rows: list[dict], syncs: int) -> str:
    cells = by_cell(rows)
    present = {r["mode"] for r in rows}
    modes = [m for m in MODES if m in present]
    baselines = [m for m in BASELINES if m in present]
    slash = " / ".join(modes)
    lines = header(rows, syncs, modes)
    lines += [
        "Speed-ups of reflow in protocol tokens/s; in brackets, over the strongest baseline, "
        "in measured steps per hour (replayed samples are older, so often shorter: fewer "
        "tokens per step).",
        "",
        "| workload | model | GPUs | reflow tokens/s | reflow whole-run tokens/s | "
        + "".join(f"vs {m} | " for m in baselines)
        + f"strongest baseline | vs strongest | trainer idle {slash} | rollout idle {slash} "
        "| X/X* reflow | final placement |",
        "|---|---|---|---|---|" + "---|" * len(baselines) + "---|---|---|---|---|---|",
    ]
    for (workload, model, gpus), by in cells.items():
        sp = cell_speedups(by)
        rf = by.get("reflow")
        if rf is None or sp is None:
            continue  # run without reflow or without a baseline: nothing to compare
        strong = by[sp.strongest]
        per_hour = rf["protocol"]["steps_per_hour"] / max(
            strong["protocol"]["steps_per_hour"], 1e-9
        )
        vs = "".join(f"{sp.over[m]:.2f}x | " if m in sp.over else "- | " for m in baselines)
        t_idle = " / ".join(f"{by[m]['trainer_idle_ratio']:.0%}" if m in by else "-" for m in modes)
        r_idle = " / ".join(f"{by[m]['rollout_idle_ratio']:.0%}" if m in by else "-" for m in modes)
        eff = "-" if rf["efficiency"] is None else f"{rf['efficiency']:.2f}"
        placement = rf["placements"][-1] if rf["placements"] else "-"
        lines.append(
            f"| {workload} | {model} | {gpus} | {rf['trainer_tokens_per_s']:.0f} | "
            f"{rf['whole_run_tokens_per_s']:.0f} | {vs}{sp.strongest} | "
            f"{sp.over_strongest:.2f}x ({per_hour:.2f}x) | {t_idle} | {r_idle} | {eff} | "
            f"{placement} |"
        )
    lines += summary(cells)
    lines += best_placement_table(cells)
    lines += idle_table(cells)
    lines += ablation_table(cells)
    return "\n".join(lines) + "\n"


def summary(cells: dict[tuple, dict[str, dict]]) -> list[str]:
    """Per workload: in how many cells reflow beat its strongest baseline, by how much, and
    which baseline was the strongest."""
    per: dict[str, list[tuple[Speedups, dict[str, dict]]]] = {}
    for (workload, *_), by in cells.items():
        sp = cell_speedups(by)
        if sp is not None:
            per.setdefault(workload, []).append((sp, by))
    if not per:
        return []
    lines = [
        "",
        "Per workload: cells where reflow beats the strongest baseline, its speed-up over "
        "that baseline (geometric mean, range), which baseline was the strongest (cells), "
        "and cells where reflow's trainer idle ratio is below async's:",
        "",
        "| workload | cells | reflow > strongest | vs strongest: geo-mean (min-max) "
        "| strongest baseline | trainer idle below async |",
        "|---|---|---|---|---|---|",
    ]
    for workload, items in per.items():
        q = [sp.over_strongest for sp, _ in items]
        geo = math.exp(sum(math.log(max(v, 1e-9)) for v in q) / len(q))
        strongest: dict[str, int] = {}
        for sp, _ in items:
            strongest[sp.strongest] = strongest.get(sp.strongest, 0) + 1
        names = ", ".join(f"{m} ({k})" for m, k in sorted(strongest.items(), key=lambda kv: -kv[1]))
        with_async = [by for _, by in items if "async" in by]
        below = sum(
            by["reflow"]["trainer_idle_ratio"] < by["async"]["trainer_idle_ratio"]
            for by in with_async
        )
        lines.append(
            f"| {workload} | {len(items)} | {sum(v > 1 for v in q)} | "
            f"{geo:.2f}x ({min(q):.2f}x-{max(q):.2f}x) | {names} | "
            f"{f'{below} of {len(with_async)}' if with_async else '-'} |"
        )
    return lines


def best_placement_table(cells: dict[tuple, dict[str, dict]]) -> list[str]:
    """Each split baseline at its default and at its best placement, and reflow over
    each at its best and over the strongest at its best (colocated_sync has one
    placement: its own run counts as its best); per workload, the geometric mean."""
    rows = []
    for cell, by in cells.items():
        best = {m: by[f"{m}{BEST}"] for m in SPLIT_BASELINES if f"{m}{BEST}" in by}
        # the modes with no placement to search (colocated, or the allocator's own): as run
        plain = {m: by[m] for m in MODES if m not in SPLIT_BASELINES and m in by}
        tokens = {m: r["trainer_tokens_per_s"] for m, r in {**plain, **best}.items()}
        if best:
            rows.append((cell, best, speedups(tokens)))
    if not rows:
        return []  # run without --best-placement
    shown = [m for m in SPLIT_BASELINES if any(m in best for _, best, _ in rows)]
    runs = sum(r["placement_search"]["simulations"] for _, best, _ in rows for r in best.values())
    lines = [
        "",
        "Split baselines at their best placement (runtime/sim/search.py; protocol tokens/s, "
        f"default placement -> best; {runs} search and full runs in all), and reflow's "
        "speed-up over each at its best and over the strongest at its best:",
        "",
        "| workload | model | GPUs | "
        + "".join(f"{m}: default -> best | " for m in shown)
        + "".join(f"reflow vs {m} at best | " for m in shown)
        + "strongest at best | reflow vs strongest at best |",
        "|---|---|---|" + "---|" * (2 * len(shown) + 2),
    ]

    def moved(r: dict | None) -> str:
        if r is None:
            return "- | "
        s = r["placement_search"]
        return (
            f"{s['default']} {s['default_tokens_per_s']:.0f} -> "
            f"{s['best']} {r['trainer_tokens_per_s']:.0f} | "
        )

    per: dict[str, list[float]] = {}
    for (workload, model, gpus), best, sp in rows:
        over = sp.over if sp is not None else {}
        vs = "".join(f"{over[m]:.2f}x | " if m in over else "- | " for m in shown)
        strong = f"{sp.strongest} | {sp.over_strongest:.2f}x |" if sp is not None else "- | - |"
        if sp is not None:
            per.setdefault(workload, []).append(sp.over_strongest)
        lines.append(
            f"| {workload} | {model} | {gpus} | "
            + "".join(moved(best.get(m)) for m in shown)
            + f"{vs}{strong}"
        )
    for workload, q in per.items():
        geo = math.exp(sum(math.log(max(v, 1e-9)) for v in q) / len(q))
        lines.append(
            f"\n{workload}: reflow beats the strongest baseline at its best placement in "
            f"{sum(v > 1 for v in q)} of {len(q)} cells, geometric mean {geo:.2f}x "
            f"({min(q):.2f}x-{max(q):.2f}x)."
        )
    return lines


def idle_table(cells: dict[tuple, dict[str, dict]]) -> list[str]:
    lines = [
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
            r = by.get(mode)
            if r is None:
                continue
            bias = r.get("length_bias", {})
            ev, co = bias.get("evicted_mean_tokens"), bias.get("consumed_mean_tokens")
            lines.append(
                f"| {workload} | {model} | {gpus} | {mode} | {r['trainer_idle_ratio']:.1%} | "
                f"{causes(r.get('trainer_idle_by_cause', {}))} | "
                f"{r['rollout_idle_ratio']:.1%} | {causes(r.get('rollout_idle_by_cause', {}))} "
                f"| {r.get('replay_share', 0.0):.1%} | "
                f"{'-' if ev is None else f'{ev:.0f}'} / {'-' if co is None else f'{co:.0f}'} |"
            )
    return lines


def ablation_table(cells: dict[tuple, dict[str, dict]]) -> list[str]:
    done = [
        (cell, by) for cell, by in cells.items() if all(f"reflow, {a}" in by for a in ABLATIONS)
    ]
    if not done:
        return []  # run with --no-ablations
    lines = [
        "",
        "Ablations (protocol tokens/s relative to reflow with every part on):",
        "",
        "| workload | model | GPUs | " + " | ".join(ABLATIONS) + " |",
        "|---|---|---|" + "---|" * len(ABLATIONS),
    ]
    for (workload, model, gpus), by in done:
        x = by["reflow"]["trainer_tokens_per_s"]
        lines.append(
            f"| {workload} | {model} | {gpus} | "
            + " | ".join(
                f"{by[f'reflow, {a}']['trainer_tokens_per_s'] / max(x, 1e-9):.2f}x"
                for a in ABLATIONS
            )
            + " |"
        )
    return lines


def plots(rows: list[dict], out: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (make bench installs it)")
        return
    cells = by_cell(rows)
    present = {r["mode"] for r in rows}
    modes = [m for m in MODES if m in present]
    labels = [f"{w}\n{m}\n{g}" for (w, m, g) in cells]
    fig, axes = plt.subplots(4, 1, figsize=(max(8, len(cells) * 0.9), 14))
    width = 0.8 / max(len(modes), 1)
    panels = (
        ("trainer_tokens_per_s", "trainer tokens/s (protocol)"),
        ("trainer_idle_ratio", "trainer idle ratio"),
        ("rollout_idle_ratio", "rollout idle ratio"),
    )
    for i, mode in enumerate(modes):
        xs = [j + (i - (len(modes) - 1) / 2) * width for j in range(len(cells))]
        for ax, (key, _) in zip(axes, panels, strict=False):
            ax.bar(
                xs,
                [by[mode][key] if mode in by else 0.0 for by in cells.values()],
                width,
                label=mode,
            )
    sps = [cell_speedups(by) for by in cells.values()]
    bars = axes[3].bar(range(len(cells)), [sp.over_strongest if sp else 0.0 for sp in sps])
    axes[3].axhline(1.0, color="black", linewidth=0.8)
    for bar, sp in zip(bars, sps, strict=True):
        if sp is not None:  # which baseline it was, on its bar
            axes[3].annotate(
                sp.strongest,
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=5,
                rotation=90,
            )
    titles = [t for _, t in panels] + ["reflow over the strongest baseline (protocol tokens/s)"]
    for ax, title in zip(axes, titles, strict=True):
        ax.set_title(title)
        ax.set_xticks(range(len(cells)))
        ax.set_xticklabels(labels, fontsize=6)
    for ax in axes[:3]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "throughput_idle.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
