"""The placement search (runtime/sim/search.py): its strategy on known curves, the
feasible placements, and simulated searches on a tiny cluster whose profile makes the
answer known (a trainer far slower than rollout: the most trainer groups win; far
faster: the most rollout replicas)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from runtime.config.recipe import load_recipe
from runtime.sim.parameters import DEFAULT_PROFILES
from runtime.sim.run import Engines, plan
from runtime.sim.search import candidates, choose, coarse_points, search
from tests.helpers import REPO

# A small batch and a sync every 2 steps keep every simulated run well under a second.
SETS = ["train.batch_prompts=4", "train.sync_every=2", "reflow.B_max=64"]


def profiles_with(tmp_path: Path, **rates: float) -> Path:
    """The shipped profiles with qwen3-8b changed: trainer groups of one GPU (an 8-GPU
    cluster then has 7 placements) and the given rates; math responses a tenth as long
    (a step on one slow trainer GPU stays within the coordinator's step timeout, and
    the runs are short)."""
    raw = yaml.safe_load(DEFAULT_PROFILES.read_text())
    raw["models"]["qwen3-8b"].update(trainer_gpus_per_replica=1, **rates)
    raw["workloads"]["math"].update(median_start=250, median_end=700, max_tokens=2048)
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def recipe():
    return load_recipe(REPO / "recipes" / "dapo_math.yaml", SETS)


def best_of(scores: dict[int, float]) -> int:
    return max(scores, key=lambda i: (scores[i], -i))


def test_every_placement_runs_when_the_budget_allows_and_the_default_first():
    calls: list[int] = []
    scores = choose(5, 8, 3, lambda i: calls.append(i) or float(i))
    assert calls == [3, 0, 1, 2, 4]
    assert best_of(scores) == 4


@pytest.mark.parametrize("peak", range(31))
def test_coarse_and_refine_land_on_a_unimodal_peak_within_the_budget(peak):
    calls: list[int] = []

    def score(i: int) -> float:
        calls.append(i)
        return -abs(i - peak)

    scores = choose(31, 8, 15, score)
    assert len(calls) <= 8 and len(set(calls)) == len(calls)  # no run twice, none over
    assert abs(best_of(scores) - peak) <= 1


def test_a_monotone_curve_is_followed_to_its_edge_and_the_search_stops_early():
    scores = choose(31, 8, 15, float)
    assert best_of(scores) == 30
    assert len(scores) < 8  # both neighbours of 30 known: nothing left to refine


def test_the_coarse_pass_is_evenly_spaced_and_holds_the_default():
    assert coarse_points(31, 4, 3) == [3, 11, 19, 27]
    assert coarse_points(31, 4, 14) == [14, 3, 19, 27]  # 11 swapped for the default


def test_bad_budgets_and_starts_are_refused():
    with pytest.raises(ValueError, match="budget 0"):
        choose(5, 0, 0, float)
    with pytest.raises(ValueError, match="start 5"):
        choose(5, 3, 5, float)


def test_the_candidates_are_whole_replica_groups_of_the_model():
    cfg = recipe()
    assert candidates(plan(cfg, 32, model="qwen3-8b").cfg) == [
        f"{32 - t}:{t}" for t in range(4, 32, 4)
    ]
    # TP-2 rollout replicas and trainer groups of 4: both sides multiples of 2 and 4
    assert candidates(plan(cfg, 16, model="qwen3-14b").cfg) == ["12:4", "8:8", "4:12"]


@pytest.mark.parametrize("budget", [4, 8])
def test_a_trainer_far_slower_than_rollout_gets_the_most_trainer_groups(tmp_path, budget):
    # 50 tokens/s per trainer GPU against thousands generated per rollout GPU: every
    # trainer group added is worth more than any rollout replica kept. (The reverse is no
    # known answer here: with a fast trainer a batch waits for its longest responses,
    # which more rollout replicas do not shorten, so the curve is flat and noisy.)
    expected = "1:7"
    engines = Engines.from_file(profiles_with(tmp_path, train_tok_s=50.0))
    result = search(recipe(), 8, "async", engines=engines, sets=SETS, budget=budget)
    assert len(result.candidates) == 7
    assert result.default.placement == "6:2"  # rollout_fraction 0.75
    assert result.best.placement == expected
    assert result.figures["placements"] == [expected]  # the full run ran there
    assert result.best.tokens_per_s == result.figures["trainer_tokens_per_s"]
    assert result.best.tokens_per_s > result.default.tokens_per_s
    assert result.search_simulations == len(result.evaluated) <= budget
    # the winner and the default again, with the full protocol
    assert result.simulations == result.search_simulations + 2
    assert result.strategy == ("exhaustive" if budget >= 7 else "coarse+refine")
    assert result.config.resources.initial_ratio == expected


def test_a_search_is_deterministic(tmp_path):
    engines = Engines.from_file(profiles_with(tmp_path, train_tok_s=50.0))
    runs = [search(recipe(), 8, "reflow", engines=engines, sets=SETS, budget=4) for _ in (0, 1)]
    a, b = ({k: v for k, v in r.figures.items() if k != "real_s"} for r in runs)
    assert runs[0].evaluated == runs[1].evaluated and a == b  # all but the real seconds


def test_colocated_sync_has_no_placement_to_search(tmp_path):
    engines = Engines.from_file(profiles_with(tmp_path))
    result = search(recipe(), 8, "colocated_sync", engines=engines, sets=SETS)
    assert result.strategy == "single" and result.simulations == 1 and not result.evaluated
    assert result.best == result.default and result.best.placement == "8:0"


def test_b_max_candidates_run_at_the_best_placement_inside_the_budget(tmp_path):
    engines = Engines.from_file(profiles_with(tmp_path, train_tok_s=50.0))
    result = search(
        recipe(), 8, "async", engines=engines, sets=SETS, budget=6, b_max_factors=(0.5, 2.0)
    )
    tried = [(e.placement, e.b_max) for e in result.evaluated]
    assert len(tried) <= 6
    top = tried[-1][0]
    assert tried[-2:] == [(top, 32), (top, 128)]  # after the placements, at the best one
    assert result.best.b_max in (32, 64, 128)
    with pytest.raises(Exception, match="--budget 2: the B_max candidates take 2 runs"):
        search(recipe(), 8, "async", engines=engines, sets=SETS, budget=2, b_max_factors=(0.5, 2))


def test_the_grid_reports_reflow_against_each_baseline_at_its_best_placement():
    from benchmarks.sim_grid import BEST, best_placement_table, by_cell

    def row(mode: str, tokens: float, search: tuple[str, str, float] | None = None) -> dict:
        r = {"workload": "math", "model": "qwen3-8b", "gpus": 32, "mode": mode}
        r["trainer_tokens_per_s"] = tokens
        if search is not None:
            best, default, default_tokens = search
            r["placement_search"] = {
                "best": best,
                "default": default,
                "default_tokens_per_s": default_tokens,
                "simulations": 10,
            }
        return r

    rows = [
        row("colocated_sync", 800.0),
        row("async", 1000.0),
        row(f"async{BEST}", 1250.0, ("20:12", "24:8", 1000.0)),
        row(f"one_step_off{BEST}", 900.0, ("24:8", "24:8", 900.0)),
        row("reflow", 1200.0),
    ]
    table = best_placement_table(by_cell(rows))
    assert "20 search and full runs in all" in table[1]
    line = next(x for x in table if x.startswith("| math | qwen3-8b | 32 |"))
    # in BASELINES order: one_step_off, then async
    assert "| 24:8 900 -> 24:8 900 | 24:8 1000 -> 20:12 1250 |" in line
    # 1200 / 900 over one_step_off, 1200 / 1250 over async at its best, the strongest
    assert line.endswith("| 1.33x | 0.96x | async | 0.96x |")
    assert table[-1] == (
        "\nmath: reflow beats the strongest baseline at its best placement in 0 of 1 cells, "
        "geometric mean 0.96x (0.96x-0.96x)."
    )
    assert best_placement_table(by_cell(rows[:2])) == []  # run without --best-placement
