"""``reflow tune``: each mode at its best placement on a simulated cluster, and the
``--set`` lines that make a recipe run there.

Every mode's placement is searched (runtime/sim/search.py) with the measurement protocol
of docs/simulator.md, so reflow is compared with each baseline at the baseline's best
split, not at the recipe's default: a baseline tuned by hand may beat reflow, and this
says so. Rates come from runtime/sim/profiles.yaml (or ``--profiles``), or are fitted from
a finished run's folder with ``--from`` (runtime/sim/fit.py ``fit_run``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.table import Table

from jobs.errors import UserError
from reflow_cli import numbers
from reflow_cli.sim_options import ModelOption, ProfilesOption, SetOption, WorkloadOption
from runtime.config.modes import policy
from runtime.config.recipe import RecipeError, config_to_dict, load_recipe
from runtime.config.schema import BASELINES, MODES, Config
from runtime.sim.parameters import DEFAULT_PROFILES, Profiles, load_profiles
from runtime.sim.run import WORKLOAD_OF_KIND, Engines, protocol_steps
from runtime.sim.search import B_MAX_FACTORS, DEFAULT_BUDGET, SearchResult, search

out = Console()
err = Console(stderr=True)

FITTED = "cpu-fitted"  # the model and workload names runtime/sim/fit.py gives its profiles
# Fields a simulated config differs from the recipe in that are the simulation's own
# business, not a setting to launch with: its length.
NOT_SETTINGS = {"train.steps"}


def fitted_engines(run_dir: Path) -> Engines:
    """Engines with the rates :func:`runtime.sim.fit.fit_run` measures in a finished run's
    folder, simulated as ``fit.simulate_fit`` simulates them (blocks of 1 token, the
    run's heartbeat interval and sequence limit)."""
    from runtime.sim.fit import fit_run

    if not run_dir.is_dir():
        raise UserError(f"--from {run_dir}: not a run folder")
    for name in ("config.yaml", "summary.json", "metrics.jsonl"):  # what fit_run reads
        if not (run_dir / name).is_file():
            raise UserError(f"--from {run_dir}: no {name} (not a finished run?)")
    try:
        fit = fit_run(run_dir)
    except RecipeError:
        raise  # the run's config.yaml: printed as one line naming the field
    except (ValueError, KeyError) as exc:
        raise UserError(f"--from {run_dir}: cannot fit rates ({exc})") from None
    profiles = Profiles({FITTED: fit.model}, {FITTED: fit.workload}, source=run_dir)
    return Engines(
        profiles,
        block=1,
        heartbeat_s=fit.cfg.control.heartbeat_interval_s,
        max_seqs=fit.max_seqs,
    )


def set_lines(recipe: Config, tuned: Config) -> list[str]:
    """``--set FIELD=VALUE`` for every field the tuned config differs from the recipe in
    (placement, replica sizes, mode and its definition, B_max), the simulation's own
    length left out: launched with these, the recipe is the configuration simulated."""
    lines: list[str] = []
    # a B_max derived from B_max_per_gpu follows the size: no line of its own
    derived = {"reflow.B_max"} if tuned.reflow.B_max_per_gpu is not None else set()

    def walk(a: Any, b: Any, prefix: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for key in b:
                walk(a.get(key), b[key], f"{prefix}{key}.")
        elif a != b and prefix[:-1] not in NOT_SETTINGS and prefix[:-1] not in derived:
            value = "null" if b is None else str(b).lower() if isinstance(b, bool) else b
            lines.append(f"--set {prefix[:-1]}={value}")

    walk(config_to_dict(recipe), config_to_dict(tuned), "")
    return lines


def mode_row(result: SearchResult, recipe: Config) -> dict[str, Any]:
    """What ``--json`` prints for one mode (and what the table shows)."""
    f = result.figures
    return {
        "mode": result.mode,
        "placement": result.best.placement,
        "b_max": result.best.b_max,
        "default_b_max": result.default.b_max,
        "trainer_tokens_per_s": result.best.tokens_per_s,
        "fresh_tokens_per_s": f["fresh_tokens_per_s"],
        "default_placement": result.default.placement,
        "default_tokens_per_s": result.default.tokens_per_s,
        "gain_over_default": round(result.gain_over_default, 4),
        "trainer_idle_ratio": f["trainer_idle_ratio"],
        "rollout_idle_ratio": f["rollout_idle_ratio"],
        "trainer_idle_by_cause": f["trainer_idle_by_cause"],
        "rollout_idle_by_cause": f["rollout_idle_by_cause"],
        "placements": f["placements"],
        "strategy": result.strategy,
        "simulations": result.simulations,
        "evaluated": [
            {"placement": e.placement, "b_max": e.b_max, "tokens_per_s": e.tokens_per_s}
            for e in result.evaluated
        ],
        "protocol": {"search": list(result.search_protocol), "full": list(result.protocol)},
        "set": set_lines(recipe, result.config),
    }


def faster_baselines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per baseline predicted faster than reflow, each at its best placement."""
    by = {r["mode"]: r for r in rows}
    ours = [m for m in by if not policy(m).baseline]  # reflow: the one mode not a baseline
    if not ours:
        return []
    x = by[ours[0]]["trainer_tokens_per_s"]
    return [
        f"{m} at {by[m]['placement']} is predicted faster than {ours[0]} "
        f"({by[m]['trainer_tokens_per_s']:.0f} vs {x:.0f} tokens/s, "
        f"{by[m]['trainer_tokens_per_s'] / max(x, 1e-9):.2f}x)"
        for m in BASELINES
        if m in by and by[m]["trainer_tokens_per_s"] > x
    ]


def causes(shares: dict[str, float]) -> str:
    """Idle shares by cause, largest first, e.g. ``fresh_short 12.0%, weight_sync 3.1%``."""
    ranked = sorted(shares.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v:.1%}" for k, v in ranked if v >= 0.0005) or "none"


def tune(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML file")],
    gpus: Annotated[
        int, typer.Option(help="GPUs of the cluster (whole nodes)", parser=numbers.GPUS)
    ],
    from_: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Option("--from", help="fit the rates from this finished run's folder"),
    ] = None,
    budget: Annotated[
        int,
        typer.Option(
            help="search runs per mode (shorter protocol), besides the full runs",
            parser=numbers.STEPS,
        ),
    ] = DEFAULT_BUDGET,
    modes: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--modes", help="modes to tune, repeated or a comma list (default all five)"),
    ] = None,
    b_max: Annotated[
        bool,
        typer.Option(
            "--b-max", help="also try reflow.B_max at half and double at the best placement"
        ),
    ] = False,
    model: ModelOption = None,
    workload: WorkloadOption = None,
    profiles: ProfilesOption = None,
    set_: SetOption = None,
    seed: Annotated[
        int, typer.Option(help="workload seed (every run uses it)", parser=numbers.SEED)
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Predict every mode's protocol throughput at its best rollout:trainer placement
    (a placement search in simulation, docs/tune.md) and print the --set lines that
    make RECIPE run there; says when a baseline at its best beats reflow."""
    if from_ is not None and (profiles or model or workload):
        raise UserError("--from fits the model and workload: give no --profiles/--model/--workload")
    # repeated or comma-separated: --modes async --modes reflow, --modes async,reflow
    wanted = list(dict.fromkeys(m.strip() for item in modes or MODES for m in item.split(",")))
    unknown = [m for m in wanted if m not in MODES]
    if unknown:
        raise UserError(f"--modes {unknown[0]}: not one of {', '.join(MODES)}")
    if budget < 1:
        raise UserError(f"--budget {budget}: expected >= 1")
    overrides = list(set_ or [])
    cfg = load_recipe(recipe, overrides)
    protocol: tuple[int | None, int | None] = (None, None)
    if from_ is not None:
        engines, model, workload = fitted_engines(from_), FITTED, FITTED
        # measured as the recipe's workload is (a fitted profile has no protocol of its
        # own: the agents' 10 + 10 syncs, not the default 5 + 5)
        protocol = protocol_steps(
            WORKLOAD_OF_KIND.get(cfg.workload.kind), None, None, cfg.train.sync_every
        )
    else:
        engines = Engines(load_profiles(profiles or DEFAULT_PROFILES))
    factors = B_MAX_FACTORS if b_max else ()

    def progress(mode: str, placement: str, b: int, tokens: float, kind: str) -> None:
        if not as_json:
            err.print(f"  {mode} {placement} B_max={b}: {tokens:.0f} tokens/s ({kind} protocol)")

    started = time.perf_counter()
    rows = []
    for mode in wanted:
        result = search(
            cfg,
            gpus,
            mode,
            engines=engines,
            model=model,
            workload=workload,
            sets=overrides,
            budget=budget,
            b_max_factors=factors,
            seed=seed,
            protocol=protocol,
            on_run=progress,
        )
        rows.append(mode_row(result, cfg))
    flags = faster_baselines(rows)
    best = max(rows, key=lambda r: r["trainer_tokens_per_s"])
    elapsed = time.perf_counter() - started
    if as_json:
        summary = {
            "recipe": str(recipe),
            "gpus": gpus,
            "rates": str(from_) if from_ is not None else str(engines.profiles.source),
            "modes": rows,
            "fastest": best["mode"],
            "faster_than_reflow": flags,
            "simulations": sum(r["simulations"] for r in rows),
            "real_s": round(elapsed, 1),
        }
        typer.echo(json.dumps(summary))
        return
    print_table(rows, cfg, gpus)
    for r in rows:
        out.print(f"[bold]{r['mode']}[/] at {r['placement']}:", highlight=False)
        for line in r["set"] or ["(the recipe as it is)"]:
            typer.echo(f"  {line}")
    for line in flags:
        out.print(f"[bold yellow]note:[/] {line}", highlight=False)
    n = sum(r["simulations"] for r in rows)
    typer.echo(
        f"fastest: {best['mode']} at {best['placement']}; {n} simulations in {elapsed:.0f} s "
        f"(rates: {from_ if from_ is not None else engines.profiles.source})"
    )


def print_table(rows: list[dict[str, Any]], cfg: Config, gpus: int) -> None:
    table = Table(title=f"{cfg.name} on {gpus} GPUs: each mode at its best placement")
    for col in (
        "mode",
        "placement",
        "tokens/s",
        "fresh tokens/s",
        "default",
        "vs default",
        "trainer idle by cause",
        "rollout idle by cause",
        "runs",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["mode"],
            r["placement"] + (f" B_max={r['b_max']}" if r["b_max"] != r["default_b_max"] else ""),
            f"{r['trainer_tokens_per_s']:.0f}",
            f"{r['fresh_tokens_per_s']:.0f}",
            f"{r['default_placement']}: {r['default_tokens_per_s']:.0f}",
            f"{r['gain_over_default']:.2f}x",
            f"{r['trainer_idle_ratio']:.1%}: {causes(r['trainer_idle_by_cause'])}",
            f"{r['rollout_idle_ratio']:.1%}: {causes(r['rollout_idle_by_cause'])}",
            str(r["simulations"]),
        )
    out.print(table)
