"""The learning report, built from arm records alone (benchmarks/learning_arms.py).

Arms group by what they ran (recipe, mode, overrides, steps); a group's figures are over
its seeds: the mean and the min-max, never more than the seeds support. Per group: final
held-out reward, the area under the reward-step curve (the mean held-out reward over the
run, trapezoids between evals), steps and seconds to two common levels, the fresh share of
the trained samples. Seconds are the **training clock**: wall seconds since the first
training step minus the seconds the trainer leader spent in held-out evals up to then
(``eval_s``), the same rule for every mode; an arm marked busy is left out of every
seconds figure (its count says so). A planned arm without a record is listed as missing
and is in no figure.

Sections: the four modes at the demo's length; the equivalence check (reflow with
``sigma = 0, delta = 0`` against ``disaggregated_sync``); the setting variants against the
default (choosing seeds, confirming seeds); the multi-turn variants; the projection to
cluster scale (learning_projection.py).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass
from pathlib import Path

try:
    from benchmarks import learning_arms as arms
    from benchmarks import learning_plan as plan
except ModuleNotFoundError:
    import learning_arms as arms
    import learning_plan as plan


class BadInput(ValueError):
    """Records the report cannot use; the message names the file or field."""


@dataclass
class Arm:
    spec: arms.ArmSpec
    name: str
    commit: str
    evals: list[tuple[int, float, float]]  # (step, training-clock seconds, held-out reward)
    fresh: int  # fresh samples trained over the run
    replayed: int
    max_age: int  # the oldest sample any batch took, in versions
    train_s: float  # training clock of the whole run (first to last step, evals out)
    stale_tokens: int | None  # generated tokens evicted as stale, never trained
    # the reward of the generated samples (every group delivered, before a sampler drops
    # any) over the last tenth of the steps: the policy's own reward on the training
    # distribution, averaged over thousands of samples (a held-out eval is one point)
    late_rollout_reward: float | None
    busy: str | None
    problem: str | None

    @property
    def group(self) -> tuple[str, str, str, int]:
        return (self.spec.recipe, self.spec.mode, self.spec.variant, self.spec.steps)

    @property
    def trained(self) -> list[tuple[int, float, float]]:
        """The evals after training began: only these count as reaching a level."""
        return [e for e in self.evals if e[0] >= 1]

    @property
    def final(self) -> float:
        return self.evals[-1][2]

    @property
    def area(self) -> float:
        """Mean held-out reward over steps 0..last (trapezoids between evals)."""
        pts = self.evals
        if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
            return pts[-1][2]
        total = sum((b[0] - a[0]) * (a[2] + b[2]) / 2 for a, b in itertools.pairwise(pts))
        return total / (pts[-1][0] - pts[0][0])


def arm_from_record(rec: dict) -> Arm:
    steps = rec.get("steps") or {}
    evals = []
    for e in rec.get("evals", []):
        if e.get("reward") is None:
            continue
        evals.append((int(e["step"]), float(e["wall_s"]) - float(e["eval_s"]), float(e["reward"])))
    wall = steps.get("wall_s") or [0.0]
    rollout = [x for x in steps.get("rollout_reward", []) if x is not None]
    late = rollout[-max(1, len(rollout) // 10) :]
    eval_total = rec["evals"][-1]["eval_s"] if rec.get("evals") else 0.0
    summary = rec.get("summary") or {}
    wasted = summary.get("wasted_tokens") or {}
    return Arm(
        spec=rec["spec"],
        name=rec["name"],
        commit=rec.get("commit", "unknown"),
        evals=evals,
        fresh=sum(x or 0 for x in steps.get("fresh", [])),
        replayed=sum(x or 0 for x in steps.get("replayed", [])),
        max_age=max((x or 0 for x in steps.get("max_age", [])), default=0),
        train_s=wall[-1] - eval_total,
        stale_tokens=wasted.get("stale_unused"),
        late_rollout_reward=statistics.fmean(late) if late else None,
        busy=(rec.get("machine") or {}).get("busy"),
        problem=rec.get("problem") or (None if evals else "no held-out eval"),
    )


def load_arms(records: Path) -> list[Arm]:
    if not records.is_dir():
        raise BadInput(f"{records}: not a folder")
    paths = sorted(records.glob("*.json"))
    out = []
    for path in paths:
        try:
            out.append(arm_from_record(arms.read_record(path)))
        except arms.BadRecord as exc:
            raise BadInput(str(exc)) from None
    return out


# ---- figures over seeds -----------------------------------------------------------------


def spread(values: list[float]) -> dict | None:
    """Mean, min and max over seeds (what the seeds support, no more)."""
    if not values:
        return None
    return {
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def ranges_overlap(a: dict, b: dict) -> bool:
    return a["min"] <= b["max"] and b["min"] <= a["max"]


def first_reach(arm: Arm, level: float) -> tuple[int, float] | None:
    """(step, training-clock seconds) of the arm's first eval after training began at or
    above ``level``."""
    return next(((s, t) for s, t, v in arm.trained if v >= level), None)


def levels(arms_: list[Arm]) -> tuple[float, float]:
    """The lowest level every arm reached (the lowest of their best held-out rewards after
    training began) and a higher one: the median of those bests (half the arms reach it)."""
    bests = [max(v for _, _, v in a.trained) for a in arms_]
    return min(bests), statistics.median(bests)


def group_figures(members: list[Arm], lv: tuple[float, float]) -> dict:
    """A group's figures at two levels; wall-clock ones from the arms not marked busy."""
    quiet = [a for a in members if not a.busy]
    out: dict = {
        "arms": len(members),
        "seeds": sorted(a.spec.seed for a in members),
        "busy": sorted(a.spec.seed for a in members if a.busy),
        "final": spread([a.final for a in members]),
        "area": spread([a.area for a in members]),
        "late_rollout_reward": spread(
            [a.late_rollout_reward for a in members if a.late_rollout_reward is not None]
        ),
        "train_s": spread([a.train_s for a in quiet]),
        "fresh_share": spread([a.fresh / max(a.fresh + a.replayed, 1) for a in members]),
        "max_age": max(a.max_age for a in members),
        "replayed": sum(a.replayed for a in members),
        "stale_tokens": spread([a.stale_tokens for a in members if a.stale_tokens is not None]),
    }
    for i, level in enumerate(lv, 1):
        reach = [first_reach(a, level) for a in members]
        quiet_reach = [first_reach(a, level) for a in quiet]
        out[f"level{i}"] = {
            "level": level,
            "reached": sum(x is not None for x in reach),
            "steps": spread([x[0] for x in reach if x is not None]),
            "seconds": spread([x[1] for x in quiet_reach if x is not None]),
            "seconds_complete": all(x is not None for x in quiet_reach) and bool(quiet),
        }
    return out


def verdict(a: str, fa: dict | None, b: str, fb: dict | None, better: str) -> str:
    """Two groups' ranges in a few words: ``not compared`` (a figure missing, or a group
    of one arm: one run has no spread), ``indistinguishable`` (the ranges overlap), or
    which is ahead (``better``: "higher" for rewards, "faster" for steps and seconds,
    where the lower range is ahead)."""
    if fa is None or fb is None or min(fa["n"], fb["n"]) < 2:
        return "not compared"
    if ranges_overlap(fa, fb):
        return "indistinguishable"
    lead = a if fa["min"] > fb["max"] else b
    if better == "faster":
        lead = b if lead == a else a
    return f"{lead} {better}"


def compare(
    a: str, fa: dict | None, b: str, fb: dict | None, what: str, fmt: str, better: str
) -> str:
    """:func:`verdict` as a sentence, both ranges quoted."""
    v = verdict(a, fa, b, fb, better)
    if fa is None or fb is None:
        return f"{a} and {b}: not compared on {what} (not every arm has the figure)."
    ra = f"{a} {fa['min']:{fmt}}-{fa['max']:{fmt}}"
    rb = f"{b} {fb['min']:{fmt}}-{fb['max']:{fmt}}"
    n = f"{fa['n']} and {fb['n']} arms"
    if v == "not compared":
        return f"{a} and {b}: not compared on {what}, one arm has no spread ({ra}, {rb}; {n})."
    if v == "indistinguishable":
        return f"{a} and {b}: indistinguishable on {what} ({ra}, {rb}; {n})."
    lead = v.rsplit(" ", 1)[0]
    other = b if lead == a else a
    return f"{lead} {better} than {other} on {what}: the ranges do not overlap ({ra}, {rb}; {n})."


def band(series: list[list[tuple[float, float]]]) -> dict:
    """Mean and min-max of step functions: each arm's value at x is its latest eval at or
    before x (after its last, its final one), on the union of the arms' xs."""
    xs = sorted({x for s in series for x, _ in s})
    mean, lo, hi = [], [], []
    for x in xs:
        ys = [next(y for xi, y in reversed(s) if xi <= x) for s in series if s[0][0] <= x]
        mean.append(statistics.fmean(ys))
        lo.append(min(ys))
        hi.append(max(ys))
    return {"x": xs, "mean": mean, "min": lo, "max": hi}


# ---- the plan's sections ----------------------------------------------------------------


def label(spec: arms.ArmSpec) -> str:
    """A group's name in the report: the mode, and the overrides when there are any."""
    return spec.mode if not spec.sets else f"{spec.mode} {spec.variant}"


def status(planned: list[arms.ArmSpec], by_name: dict[str, Arm]) -> dict[str, list[str]]:
    """Each planned arm as recorded, busy (seconds left out), failed or missing."""
    out: dict[str, list[str]] = {"recorded": [], "busy": [], "failed": [], "missing": []}
    for spec in planned:
        arm = by_name.get(spec.name)
        if arm is None:
            out["missing"].append(spec.name)
        elif arm.problem:
            out["failed"].append(f"{spec.name} ({arm.problem})")
        else:
            out["busy" if arm.busy else "recorded"].append(spec.name)
    return out


def usable(specs: list[arms.ArmSpec], by_name: dict[str, Arm]) -> list[Arm]:
    return [by_name[s.name] for s in specs if s.name in by_name and not by_name[s.name].problem]


def section_modes(by_name: dict[str, Arm]) -> dict:
    specs = plan.PLANS["modes"]
    members = usable(specs, by_name)
    out: dict = {"status": status(specs, by_name), "groups": {}, "comparisons": []}
    if not members:
        return out
    lv = levels(members)
    out["levels"] = lv
    groups = _grouped(members)
    for ms in groups.values():
        out["groups"][label(ms[0].spec)] = {
            **group_figures(ms, lv),
            "vs_step": band([[(s, v) for s, _, v in a.evals] for a in ms]),
            # seconds only from the arms not marked busy (None: every arm was)
            "vs_time": band([[(t, v) for _, t, v in a.evals] for a in ms if not a.busy])
            if any(not a.busy for a in ms)
            else None,
        }
    names = list(out["groups"])
    out["pairs"] = []
    for a, b in itertools.combinations(names, 2):
        ga, gb = out["groups"][a], out["groups"][b]
        out["comparisons"] += [
            compare(a, ga["final"], b, gb["final"], "final reward", ".3f", "higher"),
            compare(a, ga["area"], b, gb["area"], "area under reward-step", ".3f", "higher"),
            _level_compare(a, ga, b, gb, "steps", ".0f"),
            _level_compare(a, ga, b, gb, "seconds", ".0f"),
        ]
        out["pairs"].append(
            {
                "pair": (a, b),
                "final": verdict(a, ga["final"], b, gb["final"], "higher"),
                "area": verdict(a, ga["area"], b, gb["area"], "higher"),
                "steps": verdict(
                    a, level_range(ga, "steps"), b, level_range(gb, "steps"), "faster"
                ),
                "seconds": verdict(
                    a, level_range(ga, "seconds"), b, level_range(gb, "seconds"), "faster"
                ),
            }
        )
    return out


def level_range(g: dict, what: str) -> dict | None:
    """A group's steps or seconds to the first level, None unless every arm that counts
    for it (every arm for steps, every quiet arm for seconds) reached the level."""
    lv = g["level1"]
    complete = lv["reached"] == g["arms"] if what == "steps" else lv["seconds_complete"]
    return lv[what] if complete else None


def _level_compare(a: str, ga: dict, b: str, gb: dict, what: str, fmt: str) -> str:
    level = ga["level1"]["level"]
    ra, rb = level_range(ga, what), level_range(gb, what)
    if ra is None or rb is None:
        return f"{a} and {b}: not compared on {what} to {level:.3f} (not every arm has it)."
    return compare(a, ra, b, rb, f"{what} to {level:.3f}", fmt, "faster")


def _grouped(members: list[Arm]) -> dict[tuple, list[Arm]]:
    groups: dict[tuple, list[Arm]] = {}
    for a in members:
        groups.setdefault(a.group, []).append(a)
    return groups


def section_equivalence(by_name: dict[str, Arm]) -> dict:
    """Reflow with sigma = 0 and delta = 0 against disaggregated_sync: synchronous in
    effect (every batch of age 0, nothing replayed: read off every step) and in learning
    (the ranges of the final held-out reward, the area and the late rollout reward
    overlap; the eval steps whose ranges overlap, counted)."""
    specs = plan.PLANS["equivalence"]
    members = usable(specs, by_name)
    sync = [a for a in members if a.spec.mode != "reflow"]
    flow = [a for a in members if a.spec.mode == "reflow"]
    out: dict = {"status": status(specs, by_name)}
    if not sync or not flow:
        out["verdict"] = "not run: both sides need at least one arm"
        return out
    lv = levels(members)
    gs, gf = group_figures(sync, lv), group_figures(flow, lv)
    out["disaggregated_sync"], out["reflow_sync_in_effect"] = gs, gf
    steps = sorted({s for a in members for s, _, _ in a.evals})
    overlap = 0
    for s in steps:
        ra = [v for a in sync for st, _, v in a.evals if st == s]
        rb = [v for a in flow for st, _, v in a.evals if st == s]
        if ra and rb and ranges_overlap(spread(ra), spread(rb)):
            overlap += 1
    out["eval_steps_overlapping"] = (overlap, len(steps))
    mechanics = gf["max_age"] == 0 and gf["replayed"] == 0
    figures = ("final", "area", "late_rollout_reward")
    apart = [k for k in figures if gs[k] and gf[k] and not ranges_overlap(gs[k], gf[k])]
    learning = not apart
    out["apart"] = apart
    enough = min(len(sync), len(flow)) >= 2
    out["mechanics_ok"], out["learning_ok"] = mechanics, learning
    if not mechanics:
        out["verdict"] = (
            f"FAILS in mechanics: reflow took samples up to {gf['max_age']} versions old and "
            f"replayed {gf['replayed']} with sigma = 0, delta = 0"
        )
    elif not enough:
        out["verdict"] = "synchronous in mechanics; learning not compared (one arm a side)"
    elif learning:
        out["verdict"] = "holds: synchronous in mechanics, and learns within the spread"
    else:
        out["verdict"] = f"FAILS in learning: the ranges of {', '.join(apart)} do not overlap"
    return out


def section_variants(by_name: dict[str, Arm], recipe: str, variants, seed_sets) -> dict:
    """Each variant against the default at equal steps, on each seed set: no worse when
    the variant's mean area under the reward-step curve is at least the default's on the
    same seeds (the area weighs every eval, the final one alone is one noisy point)."""
    out: dict = {}
    for v in variants:
        rows = []
        for seeds in seed_sets:
            base = [by_name.get(_spec(recipe, s, ()).name) for s in seeds]
            var = [by_name.get(_spec(recipe, s, v).name) for s in seeds]
            ok = [x for x in base + var if x is not None and not x.problem]
            if len(ok) < 2 * len(seeds):
                # confirming seeds are run only for a variant no worse on the choosing ones
                settled = any(r["verdict"] == "worse" for r in rows)
                verdict = "not run: worse on the choosing seeds" if settled else "missing arms"
                rows.append({"seeds": list(seeds), "verdict": verdict, "have": len(ok)})
                continue
            fb, fv = spread([a.area for a in base]), spread([a.area for a in var])
            rows.append(
                {
                    "seeds": list(seeds),
                    "default_area": fb,
                    "variant_area": fv,
                    "default_final": spread([a.final for a in base]),
                    "variant_final": spread([a.final for a in var]),
                    "default_stale_tokens": spread([a.stale_tokens or 0 for a in base]),
                    "variant_stale_tokens": spread([a.stale_tokens or 0 for a in var]),
                    "verdict": "no worse" if fv["mean"] >= fb["mean"] else "worse",
                }
            )
        changes = all(r["verdict"] == "no worse" for r in rows)
        out[",".join(v)] = {"rows": rows, "default_may_change": changes}
    return out


def _spec(recipe: str, seed: int, sets: tuple[str, ...]) -> arms.ArmSpec:
    return plan.demo("reflow", seed, sets) if recipe == plan.DEMO else plan.retry(seed, sets)


def build(records: Path, grid: dict | None = None) -> dict:
    """Everything the report says, from the records in ``records`` (and the projection
    from ``grid``, the simulated step times, when given)."""
    all_arms = load_arms(records)
    if not all_arms:
        raise BadInput(f"{records}: no arm records (*.json)")
    by_name = {a.name: a for a in all_arms}
    planned = {a.name for specs in plan.PLANS.values() for a in specs}
    report = {
        "commits": sorted({a.commit for a in all_arms}),
        "modes": section_modes(by_name),
        "equivalence": section_equivalence(by_name),
        "variants": section_variants(
            by_name, plan.DEMO, plan.VARIANTS, (plan.CHOOSE_SEEDS, plan.CONFIRM_SEEDS)
        ),
        "multiturn": section_variants(
            by_name, plan.RETRY, plan.MULTITURN_VARIANTS, (plan.CHOOSE_SEEDS, plan.CONFIRM_SEEDS)
        ),
        "unplanned": sorted(a.name for a in all_arms if a.name not in planned),
    }
    if grid is not None:
        try:
            from benchmarks.learning_projection import project
        except ModuleNotFoundError:
            from learning_projection import project
        report["projection"] = project(report["modes"], grid)
    return report
