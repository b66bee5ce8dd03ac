"""Lending the waiting trainer in simulation: reflow with and without
``scheduler.lend_trainer`` against the strongest baseline of each grid cell.

The inputs are ``benchmarks/sim_grid.py`` outputs (``grid.json``): the baselines' grid
(``--best-placement``: each split baseline at its best placement too), and two reflow-only
grids of the same cells, without and with lending:

    .venv/bin/python benchmarks/sim_grid.py --modes reflow --no-ablations --out reports/lend-off
    .venv/bin/python benchmarks/sim_grid.py --modes reflow --no-ablations \\
        --set scheduler.lend_trainer=true --out reports/lend-on
    .venv/bin/python benchmarks/lending.py --baselines reports/sim/grid.json \\
        --off reports/lend-off/grid.json --on reports/lend-on/grid.json --out reports/lending.md

Rows of a later ``--baselines`` file replace those of an earlier one for the same mode and
cell (a baseline re-run at newer code). Per cell: the strongest baseline by trained tokens
per second, reflow's ratios to it (trained and fresh tokens) without and with lending, the
trainer's idle share, its ``fresh_short`` part and its lent share, and the lends (paid of
done). The issue's targets are geo-means per workload: printed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Cell = tuple[str, str, int]  # (workload, model, GPUs)


def cell_of(row: dict[str, Any]) -> Cell:
    return (row["workload"], row["model"], int(row["gpus"]))


def load_rows(paths: Iterable[Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        rows += data if isinstance(data, list) else data["rows"]
    return rows


def baselines_by_cell(rows: list[dict[str, Any]]) -> dict[Cell, dict[str, dict[str, Any]]]:
    """Each cell's baseline rows by mode, a later row of a mode replacing an earlier one."""
    out: dict[Cell, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row["mode"].startswith("reflow"):
            continue
        out.setdefault(cell_of(row), {})[row["mode"]] = row
    return out


def by_cell(rows: list[dict[str, Any]]) -> dict[Cell, dict[str, Any]]:
    return {cell_of(r): r for r in rows if r["mode"] == "reflow"}


def geo_mean(xs: list[float]) -> float | None:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def compare(
    baselines: dict[Cell, dict[str, dict[str, Any]]],
    off: dict[Cell, dict[str, Any]],
    on: dict[Cell, dict[str, Any]],
) -> list[dict[str, Any]]:
    out = []
    for cell in sorted(set(off) & set(on) & set(baselines)):
        name, best = max(baselines[cell].items(), key=lambda kv: kv[1]["trainer_tokens_per_s"])
        row: dict[str, Any] = {"cell": cell, "baseline": name}
        for arm, r in (("off", off[cell]), ("on", on[cell])):
            idle = r.get("trainer_idle_by_cause", {})
            lends = r.get("lends") or {}
            row[arm] = {
                "trained": r["trainer_tokens_per_s"] / best["trainer_tokens_per_s"],
                "fresh": r["fresh_tokens_per_s"] / best["fresh_tokens_per_s"],
                "idle": r["protocol"]["trainer_idle_ratio"],
                "fresh_short": idle.get("fresh_short", 0.0),
                "lent": (r.get("trainer_busy_by_cause") or {}).get("lent", 0.0),
                "lends": lends.get("lends", 0),
                "paid": lends.get("paid", 0),
                "placements": len(r.get("placements", [])),
            }
        out.append(row)
    return out


def render(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| cell | strongest baseline | reflow trained (off -> on) | fresh (off -> on) "
        "| trainer idle | fresh_short | lent | lends paid/done | placements |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        w, m, g = row["cell"]
        a, b = row["off"], row["on"]
        lines.append(
            f"| {w} {m} {g} | {row['baseline']} | {a['trained']:.2f}x -> {b['trained']:.2f}x "
            f"| {a['fresh']:.2f}x -> {b['fresh']:.2f}x | {a['idle']:.1%} -> {b['idle']:.1%} "
            f"| {a['fresh_short']:.1%} -> {b['fresh_short']:.1%} | {b['lent']:.1%} "
            f"| {b['paid']}/{b['lends']} | {a['placements']} -> {b['placements']} |"
        )
    lines.append("")
    for workload in sorted({r["cell"][0] for r in rows}):
        mine = [r for r in rows if r["cell"][0] == workload]
        parts = []
        for arm in ("off", "on"):
            trained = geo_mean([r[arm]["trained"] for r in mine])
            fresh = geo_mean([r[arm]["fresh"] for r in mine])
            at_least = sum(r[arm]["trained"] >= 1.0 for r in mine)
            parts.append(
                f"{arm}: geo-mean {trained:.3f}x trained, {fresh:.3f}x fresh, "
                f">= 1.00x in {at_least} of {len(mine)}"
            )
        lines.append(f"- {workload}: " + "; ".join(parts))
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baselines", type=Path, nargs="+", required=True)
    ap.add_argument("--off", type=Path, nargs="+", required=True)
    ap.add_argument("--on", type=Path, nargs="+", required=True)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = compare(
        baselines_by_cell(load_rows(args.baselines)),
        by_cell(load_rows(args.off)),
        by_cell(load_rows(args.on)),
    )
    text = render(rows)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
