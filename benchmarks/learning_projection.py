"""Time to reward projected to cluster scale: the learning report's steps to a level times
the simulator's seconds per step, cell by cell.

For a cell of the simulated grid (benchmarks/sim_grid.py) and a mode m:

    projected seconds to the level = steps m needs to the level (the demo's learning arms)
                                     x m's simulated seconds per step at that cell

with every split baseline at its best placement and colocated sync at its one placement.
Reflow's ratio is its projected seconds over the best baseline's (< 1: reflow gets there
sooner). The bracket is the widest the seeds allow: reflow's fewest steps over the
baseline's most, and the reverse.

What it assumes, and the report says so: that steps to a level carry over from the demo's
tiny model and task (400 steps, one sync a step) to the cell's model and recipe, the same
for every mode (so a mode's *relative* sample efficiency, replay's and staleness's effect
on learning per step, transfers); and that the simulator's step times hold (they are the
grid's, with its own stated assumptions, docs/simulator.md).

The grid's step times are kept as ``docs/learning/grid.json`` (distilled by
``learning.py --grid-from reports/sim/grid.json``), so that the projection, like the
rest of the report, rebuilds from committed files alone.
"""

from __future__ import annotations

import json
from pathlib import Path

BEST = ", best placement"  # benchmarks/sim_grid.py's label suffix of a baseline at its best
MODES = ("colocated_sync", "one_step_off", "async", "reflow")
BASELINES = MODES[:-1]


def distill(rows: list[dict], *, source: str, commit: str) -> dict:
    """The grid's seconds per step per cell and mode (each split baseline's best placement
    where the grid searched it), from sim_grid.py's grid.json rows."""
    cells: dict[str, dict] = {}
    for r in rows:
        label = str(r["mode"])
        mode = label.removesuffix(BEST)
        if mode not in MODES or ("," in label and not label.endswith(BEST)):
            continue  # an ablation, or a mode outside the report
        key = f"{r['workload']}:{r['model']}:{r['gpus']}"
        cell = cells.setdefault(key, {})
        have = cell.get(mode)
        if have is not None and have["best_placement"] and not label.endswith(BEST):
            continue  # the best placement's row wins over the default's
        cell[mode] = {
            "step_s": float(r["protocol"]["step_s_mean"]),
            "best_placement": label.endswith(BEST),
            "placement": (r.get("placement_search") or {}).get("best"),
        }
    return {"source": source, "commit": commit, "cells": cells}


def read_grid(path: Path) -> dict:
    """A distilled grid (:func:`distill`'s), checked; one line naming the file if not."""
    try:
        grid = json.loads(path.read_text())
        for cell in grid["cells"].values():
            for x in cell.values():
                float(x["step_s"])
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, AttributeError, KeyError, TypeError, ValueError):
        raise ValueError(f"{path}: not a distilled grid (cells -> mode -> step_s)") from None
    return grid


def project(modes_section: dict, grid: dict) -> dict:
    """Per cell: each mode's projected seconds to the common level, and reflow's ratio to
    the best baseline's (with the seeds' bracket)."""
    groups = modes_section.get("groups", {})
    steps = {}
    for m in MODES:
        g = groups.get(m)
        if g and g["level1"]["reached"] == g["arms"] and g["level1"]["steps"]:
            steps[m] = g["level1"]["steps"]
    out: dict = {
        "level": modes_section.get("levels", [None])[0],
        "steps": steps,
        "source": grid.get("source"),
        "commit": grid.get("commit"),
        "cells": [],
    }
    for key, cell in grid["cells"].items():
        row: dict = {"cell": key, "modes": {}}
        for m in MODES:
            if m in steps and m in cell:
                row["modes"][m] = {
                    "step_s": cell[m]["step_s"],
                    "seconds": steps[m]["mean"] * cell[m]["step_s"],
                    "fewest": steps[m]["min"] * cell[m]["step_s"],
                    "most": steps[m]["max"] * cell[m]["step_s"],
                }
        base = {m: x for m, x in row["modes"].items() if m in BASELINES}
        if "reflow" in row["modes"] and base:
            best = min(base, key=lambda m: base[m]["seconds"])
            r, b = row["modes"]["reflow"], base[best]
            row["best_baseline"] = best
            row["ratio"] = r["seconds"] / b["seconds"]
            row["bracket"] = (r["fewest"] / b["most"], r["most"] / b["fewest"])
            row["step_time_ratio"] = r["step_s"] / b["step_s"]
            row["steps_ratio"] = steps["reflow"]["mean"] / steps[best]["mean"]
        out["cells"].append(row)
    return out


def render_projection(p: dict) -> list[str]:
    out = [
        "",
        "## Time to reward projected to cluster scale",
        "",
        "**A projection, not a measurement**: the steps each mode needed to reach "
        f"{p['level']:.3f} on the demo (its tiny model, 400 steps, one sync a step) times "
        f"the mode's simulated seconds per step at the cell (grid: {p['source']}, commit "
        f"{str(p['commit'])[:12]}; split baselines at their best placement). It assumes "
        "that a mode's steps to a level, relative to another's, carry over from the demo "
        "to the cell's model and recipe, and that the simulator's step times hold.",
        "",
    ]
    if not p["cells"] or not any("ratio" in c for c in p["cells"]):
        missing = [m for m in MODES if m not in p["steps"]]
        out.append(
            "Not built: "
            + (f"no steps to the level for {', '.join(missing)}." if missing else "no grid cell.")
        )
        return out
    steps = ", ".join(
        f"{m} {s['mean']:.0f} [{s['min']:.0f}-{s['max']:.0f}]" for m, s in p["steps"].items()
    )
    out += [
        f"Steps to {p['level']:.3f} (mean [min-max] over seeds): {steps}.",
        "",
        "| cell | best baseline | reflow's steps / its | reflow's step time / its | "
        "reflow's time to reward / its | bracket over seeds |",
        "|---|---|---|---|---|---|",
    ]
    for c in p["cells"]:
        if "ratio" not in c:
            out.append(f"| {c['cell']} | - | - | - | - | - |")
            continue
        lo, hi = c["bracket"]
        out.append(
            f"| {c['cell']} | {c['best_baseline']} | {c['steps_ratio']:.2f}x | "
            f"{c['step_time_ratio']:.2f}x | **{c['ratio']:.2f}x** | {lo:.2f}x-{hi:.2f}x |"
        )
    ahead = sum(1 for c in p["cells"] if c.get("ratio", 9) < 1)
    out += ["", f"Reflow sooner (ratio < 1) in {ahead} of {len(p['cells'])} cells."]
    return out
