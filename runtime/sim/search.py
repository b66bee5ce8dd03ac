"""The best fixed placement of a mode on a simulated cluster, within a budget of runs.

The baselines run at one rollout:trainer split for the whole run and ``reflow`` starts at
one (its allocator moves from there), so a comparison of modes is fair only at each
mode's best split: a user would tune it. :func:`search` finds it for any mode.

Candidates are the feasible splits in whole replica groups (as the allocator's
``placements()``: rollout ranks a multiple of ``rollout_gpus_per_replica``, trainer ranks
a multiple of ``trainer_gpus_per_replica``, at least one group each, and every split the
recipe's own check, :func:`runtime.config.layout.check_split`, accepts), ordered by
trainer ranks. Each candidate is scored by the protocol's trainer tokens/s
(:func:`runtime.sim.run.figures`) of a run with a shorter protocol than the report's
(:func:`search_protocol`: half the warm-up and half the measured sync intervals, rounded
up, so the window covers the same part of the run's length drift).

Strategy (:func:`choose`), at most ``budget`` search runs:

- as many candidates as the budget or fewer: every one is run (exhaustive);
- else a coarse pass over ``max(2, budget // 2)`` evenly spaced candidates, the default
  placement one of them (the one nearest it is swapped for it), then a refinement
  around the best so far: the candidate halfway between the best and its nearest
  evaluated neighbour on one side, again and again (a bracket that halves), until the
  budget is spent or both neighbours of the best are evaluated (a local optimum at the
  grid's resolution; the search then stops early, with fewer runs). The side is the
  one whose neighbour scored higher (the peak of a unimodal curve leans that way; an
  unexplored edge counts as highest), then the wider one.

It assumes tokens/s is unimodal in the split (too few trainers: the trainer is the
bottleneck; too few rollout ranks: generation is), which the coarse pass checks only at
its own resolution. With ``b_max_factors`` the best placement is then run with
``reflow.B_max`` times each factor (those runs come out of the same budget).

The winner is run again with the full protocol, and so is the default placement when
it lost: the full-protocol figures decide between the two, so the best placement
reported is never below the default's in the report's own measure. Every run uses the
same seed: candidates are compared on the same workload draws, and a search is
deterministic. ``colocated_sync`` has no split (every rank does both): one full run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.config.layout import LayoutError, check_split
from runtime.config.recipe import RecipeError, rebuild
from runtime.config.schema import Config
from runtime.sim.run import (
    Engines,
    SimPlan,
    figures,
    plan,
    protocol_steps,
    simulate,
    steps_needed,
)

DEFAULT_BUDGET = 8  # search runs per mode (each of the shorter search protocol)
B_MAX_FACTORS = (0.5, 2.0)  # B_max candidates beside the recipe's, when asked for


@dataclass(frozen=True)
class Evaluation:
    """One search run: a placement (``R:T`` ranks) and ``reflow.B_max``, scored by the
    search protocol's trainer tokens/s."""

    placement: str
    b_max: int
    tokens_per_s: float


@dataclass(frozen=True)
class SearchResult:
    """A mode's search. ``figures`` and ``default_figures`` are full-protocol figures
    (:func:`runtime.sim.run.figures`) of the chosen and of the default placement."""

    mode: str
    gpus: int
    strategy: str  # "exhaustive", "coarse+refine", or "single" (one placement, no search)
    budget: int
    search_protocol: tuple[int, int]  # (warm-up, measured) trainer steps of search runs
    protocol: tuple[int, int]  # the same for the full runs
    candidates: list[str]  # every feasible placement, by trainer ranks
    evaluated: list[Evaluation]  # search runs, in the order they ran
    default: Evaluation  # the default placement and B_max, with its full-protocol tokens/s
    best: Evaluation  # the chosen placement and B_max, with its full-protocol tokens/s
    figures: dict[str, Any]
    default_figures: dict[str, Any]
    config: Config  # the chosen run's, as simulated (its train.steps the full run's)
    simulations: int  # every run: search runs and full-protocol runs
    search_simulations: int  # the search protocol's runs among them

    @property
    def gain_over_default(self) -> float:
        return self.best.tokens_per_s / max(self.default.tokens_per_s, 1e-9)


def candidates(cfg: Config) -> list[str]:
    """The feasible fixed placements of ``cfg``'s world, ``R:T``, by trainer ranks."""
    res, world = cfg.resources, cfg.world_size
    out = []
    for trainer in range(res.trainer_gpus_per_replica, world, res.trainer_gpus_per_replica):
        try:
            check_split(
                world - trainer,
                trainer,
                world_size=world,
                trainer_group_size=res.trainer_gpus_per_replica,
                rollout_group_size=res.rollout_gpus_per_replica,
            )
        except LayoutError:
            continue
        out.append(f"{world - trainer}:{trainer}")
    return out


def coarse_points(n: int, k: int, start: int) -> list[int]:
    """``k`` evenly spaced indices of ``0..n-1`` (the middles of ``k`` equal parts), the
    one nearest ``start`` replaced by it; ``start`` first."""
    points = sorted({min(n - 1, max(0, round((i + 0.5) * n / k - 0.5))) for i in range(k)})
    nearest = min(points, key=lambda i: (abs(i - start), i))
    rest = [i for i in points if i != nearest and i != start]
    return [start, *rest]


def choose(n: int, budget: int, start: int, score: Callable[[int], float]) -> dict[int, float]:
    """Indices ``0..n-1`` scored by ``score`` (a simulation each) within ``budget`` calls,
    by the module doc's strategy; ``start`` (the default placement) is scored first.
    Returns every score, in the order they were taken."""
    if not 0 <= start < n:
        raise ValueError(f"start {start} outside 0..{n - 1}")
    if budget < 1:
        raise ValueError(f"budget {budget}: expected >= 1")
    scores: dict[int, float] = {}
    if n <= budget:
        for i in [start, *(j for j in range(n) if j != start)]:
            scores[i] = score(i)
        return scores
    for i in coarse_points(n, max(2, budget // 2), start):
        scores[i] = score(i)
    while len(scores) < budget:
        best = max(scores, key=lambda i: (scores[i], -i))  # ties: fewer trainer ranks
        left = max((i for i in scores if i < best), default=-1)
        right = min((i for i in scores if i > best), default=n)
        # (the neighbour's score, the gap to it, the midpoint): a side that runs to the
        # grid's edge unexplored has no neighbour, and counts as the best one
        sides = [
            (scores.get(left, math.inf), best - left, (left + best) // 2),
            (scores.get(right, math.inf), right - best, (best + right) // 2),
        ]
        open_sides = [side for side in sides if side[1] >= 2]
        if not open_sides:
            break  # both neighbours evaluated: a local optimum at the grid's resolution
        # Towards the better neighbour (if tokens/s is unimodal, the peak leans its way),
        # then the wider gap, then the left.
        mid = max(open_sides, key=lambda side: side[:2])[2]
        scores[mid] = score(mid)
    return scores


def search_protocol(protocol: tuple[int, int], sync_every: int) -> tuple[int, int]:
    """Search runs' (warm-up, measured) trainer steps: half the full protocol's sync
    intervals each, rounded up (at least one)."""
    warmup, measure = (
        max(1, math.ceil(math.ceil(steps / sync_every) / 2)) * sync_every for steps in protocol
    )
    return warmup, measure


def search(
    cfg: Config,
    gpus: int,
    mode: str,
    *,
    engines: Engines,
    model: str | None = None,
    workload: str | None = None,
    sets: Sequence[str] = (),
    budget: int = DEFAULT_BUDGET,
    b_max_factors: Sequence[float] = (),
    seed: int = 0,
    protocol: tuple[int | None, int | None] = (None, None),
    search_steps: tuple[int, int] | None = None,
    steps: int | None = None,
    on_run: Callable[[str, str, int, float, str], None] | None = None,
) -> SearchResult:
    """The best placement of ``mode`` for ``cfg`` on ``gpus`` GPUs (module doc).

    ``protocol``: the full runs' (warm-up, measured) trainer steps, None for the
    workload's default; ``search_steps``: the search runs', default
    :func:`search_protocol`; ``steps``: the full runs' ``train.steps``, default the
    fewest the protocol needs. ``sets`` are the ``--set`` items ``cfg`` was loaded with
    (``plan()`` leaves those fields alone). ``on_run(mode, placement, B_max,
    tokens/s, kind)`` is called after every run (progress for a caller)."""
    if budget < 1:
        raise RecipeError(f"--budget {budget}: expected >= 1")
    base = plan(
        cfg, gpus, mode=mode, model=model, workload=workload, profiles=engines.profiles, sets=sets
    )
    every = base.cfg.train.sync_every
    full = protocol_steps(base.workload, protocol[0], protocol[1], every)
    short = search_steps or search_protocol(full, every)
    needed = steps_needed(*full, every)
    full_steps = steps or needed
    if full_steps < needed:
        raise RecipeError(f"train.steps: {full_steps} is fewer than the protocol's {needed}")
    default = Evaluation(base.cfg.resources.initial_ratio or "", base.cfg.reflow.B_max or 0, 0.0)
    runs = {"search": 0, "full": 0}
    configs: dict[tuple[str, int], Config] = {}  # of the full runs

    def run(placement: str, b_max: int, protocol_: tuple[int, int], n: int, kind: str) -> dict:
        changes: dict[str, Any] = {"train.steps": n, "reflow.B_max": b_max}
        if not base.cfg.reflow.policy.colocated:  # no split to place
            changes["resources.initial_ratio"] = placement
        sim_cfg = rebuild(base.cfg, changes, source=f"placement search {placement}")
        if kind == "full":
            configs[placement, b_max] = sim_cfg
        result = simulate(SimPlan(sim_cfg, base.model, base.workload), seed=seed, engines=engines)
        row = figures(
            result,
            gpus,
            workload=base.workload,
            warmup_steps=protocol_[0],
            measure_steps=protocol_[1],
            sync_every=every,
        )
        runs[kind] += 1
        if on_run is not None:
            on_run(mode, placement, b_max, row["trainer_tokens_per_s"], kind)
        return row

    places = [default.placement] if base.cfg.reflow.policy.colocated else candidates(base.cfg)
    b_maxes = sorted({max(1, round(default.b_max * f)) for f in b_max_factors} - {default.b_max})
    if len(places) == 1 and not b_maxes:  # nothing to choose: the single run
        row = run(default.placement, default.b_max, full, full_steps, "full")
        only = Evaluation(default.placement, default.b_max, row["trainer_tokens_per_s"])
        return SearchResult(
            mode=mode,
            gpus=gpus,
            strategy="single",
            budget=budget,
            search_protocol=short,
            protocol=full,
            candidates=places,
            evaluated=[],
            default=only,
            best=only,
            figures=row,
            default_figures=row,
            config=configs[default.placement, default.b_max],
            simulations=1,
            search_simulations=0,
        )
    if budget <= len(b_maxes):
        raise RecipeError(
            f"--budget {budget}: the B_max candidates take {len(b_maxes)} runs, leaving "
            "none for placements"
        )
    evaluated: list[Evaluation] = []

    def score(i: int) -> float:
        x = run(places[i], default.b_max, short, steps_needed(*short, every), "search")
        evaluated.append(Evaluation(places[i], default.b_max, x["trainer_tokens_per_s"]))
        return x["trainer_tokens_per_s"]

    start = places.index(default.placement)
    placement_budget = budget - len(b_maxes)
    # one placement (colocated_sync, or a tiny cluster) with B_max candidates: it is run
    # too, at the recipe's B_max, for the candidates to be compared with
    scores = choose(len(places), placement_budget, start, score)
    top = places[max(scores, key=lambda i: (scores[i], -i))]
    for b in b_maxes:  # at the best placement
        x = run(top, b, short, steps_needed(*short, every), "search")
        evaluated.append(Evaluation(top, b, x["trainer_tokens_per_s"]))
    pick = max(
        (e for e in evaluated if e.placement == top),
        key=lambda e: (e.tokens_per_s, e.b_max == default.b_max),  # ties: the recipe's
    )
    best_row = run(pick.placement, pick.b_max, full, full_steps, "full")
    best = Evaluation(pick.placement, pick.b_max, best_row["trainer_tokens_per_s"])
    default_row = best_row
    if (pick.placement, pick.b_max) != (default.placement, default.b_max):
        default_row = run(default.placement, default.b_max, full, full_steps, "full")
    default_full = Evaluation(default.placement, default.b_max, default_row["trainer_tokens_per_s"])
    if default_full.tokens_per_s > best.tokens_per_s:  # the short runs ranked them wrongly
        best, best_row = default_full, default_row
    return SearchResult(
        mode=mode,
        gpus=gpus,
        strategy="exhaustive" if len(places) <= placement_budget else "coarse+refine",
        budget=budget,
        search_protocol=short,
        protocol=full,
        candidates=places,
        evaluated=evaluated,
        default=default_full,
        best=best,
        figures=best_row,
        default_figures=default_row,
        config=configs[best.placement, best.b_max],
        simulations=runs["search"] + runs["full"],
        search_simulations=runs["search"],
    )
