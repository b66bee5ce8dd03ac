"""Fingerprint simulated runs of every execution mode, to show a restructuring changed no
behaviour: each run's metrics lines, summary, placements and totals, hashed.

    .venv/bin/python scripts/sim_fingerprint.py --out before.json   # on the old code
    .venv/bin/python scripts/sim_fingerprint.py --compare before.json

The simulator is deterministic for a seed (runtime/sim/), and it drives the real control
plane (coordinator, data plane, buffer, schedulers, allocator, the batch messages), so an
identical hash means the same decisions at the same simulated times. Wall-clock fields
(``real_*``) are left out. About 2 minutes for the 30 runs on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.config.recipe import RecipeError, load_recipe  # noqa: E402
from runtime.config.schema import MODES  # noqa: E402
from runtime.sim.parameters import DEFAULT_PROFILES, load_profiles  # noqa: E402
from runtime.sim.run import plan, simulate  # noqa: E402

# (recipe, GPUs, about how many steps, settings): the three workloads, small and larger
# clusters, a LoRA run, replay tuned and a non-default sampler; every mode runs each.
CASES = [
    ("recipes/dapo_math.yaml", 16, 40, []),
    ("recipes/apps_coding.yaml", 8, 40, []),
    ("recipes/retool.yaml", 32, 32, ["reflow.sigma=0.25"]),
    ("recipes/dapo_math.yaml", 64, 48, ["model.lora.rank=32"]),
    ("recipes/apps_coding.yaml", 16, 200, []),
    ("recipes/retool.yaml", 16, 160, ["reflow.sampler=medium_reward"]),
]
WALL_CLOCK = re.compile(r'"real[_a-z]*": [0-9.e+-]+,?')
# Output keys renamed since (old: new), so that a tree from before the rename hashes the
# same when only the name changed: a status/summary key is a name, not a decision.
RENAMED_KEYS = {"partial_rollouts": "parked_rollouts"}  # 2026-12-04, "parked" rollouts


def accepts(recipe: str, overrides: list[str]) -> bool:
    try:
        load_recipe(REPO / recipe, overrides, on_note=lambda _: None)
    except RecipeError:
        return False
    return True


def fingerprints(seed: int = 1) -> dict[str, str]:
    profiles = load_profiles(DEFAULT_PROFILES)
    out = {}
    for recipe, gpus, steps, sets in CASES:
        for mode in MODES:
            # settings a mode refuses (a baseline's sigma > 0) are left out for it
            given = sets if accepts(recipe, [f"reflow.mode={mode}", *sets]) else []
            every = load_recipe(REPO / recipe, given, on_note=lambda _: None).train.sync_every
            overrides = [f"train.steps={max(steps // every, 2) * every}", *given]
            cfg = load_recipe(REPO / recipe, overrides, on_note=lambda _: None)
            start = time.time()
            r = simulate(plan(cfg, gpus, mode=mode, profiles=profiles, sets=overrides), seed=seed)
            record = {
                "summary": r.summary,
                "metrics": r.metrics,
                "sim_s": r.sim_s,
                "placements": r.placements,
                "totals": [
                    r.rollout_tokens,
                    r.trained_tokens,
                    r.rollout_gpu_busy_s,
                    r.trainer_gpu_busy_s,
                    r.weight_syncs,
                ],
            }
            text = WALL_CLOCK.sub("", json.dumps(record, sort_keys=True, default=str))
            for old, new in RENAMED_KEYS.items():
                text = text.replace(f'"{old}":', f'"{new}":')
            key = f"{recipe}:{gpus}:{mode}:{','.join(given)}"
            out[key] = hashlib.sha256(text.encode()).hexdigest()[:16]
            print(f"{key} {out[key]} ({time.time() - start:.1f} s)", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="write the fingerprints here (JSON)")
    ap.add_argument("--compare", type=Path, help="fingerprints to compare with (JSON)")
    args = ap.parse_args()
    got = fingerprints()
    if args.out:
        args.out.write_text(json.dumps(got, indent=1) + "\n")
    if args.compare:
        want = json.loads(args.compare.read_text())
        differ = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
        print(f"{len(got) - len(differ)} of {len(got)} runs identical; differ: {differ or 'none'}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
