"""What the shipped GPU recipes' held-out evals cost, in simulation: each recipe at its own
size run twice with the same seed, with its ``data.eval`` sets and without them.

    .venv/bin/python benchmarks/sim_evals.py [--gpus 32] [--intervals 4] [--seeds 0,1,2]

A run lasts ``--intervals`` eval intervals (``train.eval_every`` steps each). Reported per
recipe: the eval rounds' share of rollout GPU time (runtime/sim/run.py ``eval_figures``),
the end's round (after the last step), and the trained tokens per second with evals over
without: in the measurement protocol's window and up to the last step (the end's round
left out: it delays the run's end, not its training), per seed and as a geometric mean:
a run's timing shifts with the rounds, so which request draws which length does too, and
one pair's ratio carries that noise. A simulated figure: the eval sets' own response
lengths are not modelled (each episode is drawn like a training one).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from runtime.config.recipe import load_recipe
from runtime.sim.run import figures, plan, simulate

REPO = Path(__file__).resolve().parents[1]
RECIPES = {"dapo_math.yaml": "math", "retool.yaml": "retool", "apps_coding.yaml": "apps_agent"}


def to_last_step(result: Any) -> float:
    """Trained tokens per second up to the last step's metrics line."""
    last = max(m["wall_s"] for m in result.metrics)
    return result.trained_tokens / last


def arm(recipe: str, gpus: int, steps: int, seed: int, evals: bool) -> dict[str, Any]:
    sets = [f"train.steps={steps}"] + ([] if evals else ["data.eval={}", "train.eval_every=0"])
    cfg = load_recipe(REPO / "recipes" / recipe, sets)
    result = simulate(plan(cfg, gpus, sets=sets), seed=seed)
    row = figures(result, gpus, workload=RECIPES[recipe])
    row["to_last_step_tokens_per_s"] = round(to_last_step(result), 1)
    return row


def geo_mean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=32)
    ap.add_argument("--intervals", type=int, default=4, help="eval intervals per run")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, a pair each")
    args = ap.parse_args()
    seeds = [int(x) for x in args.seeds.split(",")]
    rows = []
    for recipe in RECIPES:
        cfg = load_recipe(REPO / "recipes" / recipe)
        steps = args.intervals * cfg.train.eval_every
        pairs = []
        for seed in seeds:
            on = arm(recipe, args.gpus, steps, seed, evals=True)
            off = arm(recipe, args.gpus, steps, seed, evals=False)
            pairs.append(
                {
                    "seed": seed,
                    "evals": on["evals"],
                    "protocol_ratio": on["trainer_tokens_per_s"] / off["trainer_tokens_per_s"],
                    "to_last_step_ratio": on["to_last_step_tokens_per_s"]
                    / off["to_last_step_tokens_per_s"],
                }
            )
            print(json.dumps({"recipe": recipe, **pairs[-1]}), flush=True)
        rows.append(
            {"recipe": recipe, "steps": steps, "eval_every": cfg.train.eval_every, "pairs": pairs}
        )
    print()
    print(
        f"{args.gpus} GPUs, seeds {args.seeds}; ratios: trained tokens/s with evals over "
        "without, geometric mean (range) over the seeds"
    )
    print()
    print(
        "| recipe | steps | eval every | episodes/round | share of rollout GPU time | "
        "end's round | protocol window | to the last step |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ps = r["pairs"]
        shares = [x["evals"]["share_of_rollout"] for x in ps]
        ends = [x["evals"]["end_round_s"] for x in ps]

        def ratio(key: str, ps: list[dict[str, Any]] = ps) -> str:
            xs = [x[key] for x in ps]
            return f"{geo_mean(xs):.3f}x ({min(xs):.3f}-{max(xs):.3f})"

        print(
            f"| {r['recipe']} | {r['steps']} | {r['eval_every']} | "
            f"{ps[0]['evals']['episodes_per_round']} | {min(shares):.1%}-{max(shares):.1%} | "
            f"{min(ends):.0f}-{max(ends):.0f} s | {ratio('protocol_ratio')} | "
            f"{ratio('to_last_step_ratio')} |"
        )


if __name__ == "__main__":
    main()
