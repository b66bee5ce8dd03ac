"""One measurement protocol for every simulated mode (runtime/sim/run.py ``figures``), the
grid's reflow-against-baselines arithmetic (benchmarks/sim_grid.py), and each mode's
definition as ``plan()`` applies it."""

import pytest

from benchmarks.sim_grid import render, speedups, train_steps
from runtime.config.recipe import RecipeError, load_recipe
from runtime.sim.cluster import SimResult
from runtime.sim.run import ProtocolError, figures, plan, protocol_steps
from tests.helpers import REPO

pytestmark = pytest.mark.unit

BLOCK = 16


def result(
    step_s: list[float], blocks: list[int], idle_s: list[float] | None = None, sync_every: int = 1
) -> SimResult:
    """A run whose step k took step_s[k-1] seconds and trained blocks[k-1] blocks, with the
    trainer's cumulative idle seconds idle_s[k-1] at each report (the metrics lines carry
    cumulative wall_s and the version each step published, as the coordinator writes
    them)."""
    idle_s = idle_s or [0.0] * len(step_s)
    lines, wall = [], 0.0
    for k, (dt, b, idle) in enumerate(zip(step_s, blocks, idle_s, strict=True), start=1):
        wall += dt
        lines.append(
            {
                "step": k,
                "policy_version": k // sync_every,
                "wall_s": wall,
                "tokens": b,
                "batch_unused": 4,
                "batch_replay": 0,
                "trainer_idle_by_cause_s": {"fresh_short": idle} if idle else {},
            }
        )
    summary = {
        "mode": "async",
        "steps": len(step_s),
        "trainer_idle_ratio": 0.25,
        "rollout_idle_ratio": 0.5,
        "samples": {"lost": 0, "evicted": 0},
    }
    return SimResult(
        summary=summary,
        metrics=lines,
        sim_s=wall,
        real_s=0.1,
        block=BLOCK,
        rollout_tokens=float(sum(blocks) * BLOCK),
        trained_tokens=float(sum(blocks) * BLOCK),
        rollout_gpu_busy_s=wall,
        trainer_gpu_busy_s=wall,
    )


def test_the_protocol_measures_the_steps_after_the_warm_up_only():
    # a slow start (the pools fill) then a steady 10 s per step of 1,000 blocks
    steps = [100.0, 50.0, 30.0, 10.0, 10.0, 10.0, 10.0, 10.0]
    blocks = [1000, 1000, 1000, 1000, 1000, 2000, 2000, 3000]
    row = figures(result(steps, blocks), 8, warmup_steps=3, measure_steps=4)
    # steps 4..7: (1000 + 1000 + 2000 + 2000) blocks over 40 s; step 8 is after the window
    assert row["trainer_tokens_per_s"] == pytest.approx(6000 * BLOCK / 40, abs=0.05)
    # counting the warm-up (steps 1..7) would give a third of that
    assert row["trainer_tokens_per_s"] > 2 * (9000 * BLOCK / 220)
    assert row["protocol"]["step_s_mean"] == pytest.approx(10.0)
    assert row["protocol"]["steps_per_hour"] == pytest.approx(360.0)
    # the old figure stays, named for what it is: every token over the whole run
    assert row["whole_run_tokens_per_s"] == pytest.approx(12000 * BLOCK / 230, abs=0.05)


def test_the_workload_sets_the_default_protocol():
    assert protocol_steps("math") == (5, 5)
    assert protocol_steps("apps_agent") == protocol_steps("retool") == (10, 10)
    assert protocol_steps("apps_agent", 2, 3) == (2, 3)
    steps = [50.0] * 10 + [5.0] * 10  # slow for 10 steps, then 5 s each
    res = result(steps, [100] * 20)
    agent = figures(res, 8, workload="apps_agent")
    math = figures(res, 8, workload="math")  # steps 6..10: the slow ones
    assert agent["trainer_tokens_per_s"] == pytest.approx(100 * BLOCK / 5.0, abs=0.05)
    assert math["trainer_tokens_per_s"] == pytest.approx(100 * BLOCK / 50.0, abs=0.05)


def test_the_trainer_idle_of_the_window_is_its_own():
    # 20 s idle before the window (steps 1-2), 18 s during its 40 s (steps 3-6)
    res = result([10.0] * 6, [100] * 6, idle_s=[10.0, 20.0, 30.0, 34.0, 36.0, 38.0])
    row = figures(res, 8, warmup_steps=2, measure_steps=4)
    assert row["protocol"]["trainer_idle_ratio"] == pytest.approx(18.0 / 40.0)


def test_a_run_shorter_than_the_protocol_is_refused_in_one_line():
    with pytest.raises(ProtocolError) as info:
        figures(result([10.0] * 9, [100] * 9), 8, workload="math")
    assert str(info.value) == (
        "train.steps: the run has 9 steps, the protocol needs warm-up 5 + measured 5 = 10: "
        "more steps, or --warmup-steps/--measure-steps"
    )
    assert isinstance(info.value, RecipeError)  # the CLI prints it as one line
    with pytest.raises(ProtocolError, match="--measure-steps 0: expected >= 1"):
        protocol_steps("math", 1, 0)


def test_the_window_is_whole_sync_intervals():
    # colocated_sync-like: each 4-step interval generates its batches (40 s) in its first
    # step, then trains (5 s a step); a window that cut an interval would miss that
    steps = [45.0, 5.0, 5.0, 5.0] * 4
    res = result(steps, [100] * 16, sync_every=4)
    row = figures(res, 8, warmup_steps=3, measure_steps=5)  # -> 4 + 8 steps
    p = row["protocol"]
    assert (p["warmup_steps"], p["measure_steps"], p["sync_every"]) == (4, 8, 4)
    assert row["trainer_tokens_per_s"] == pytest.approx(800 * BLOCK / 120.0, abs=0.05)
    # steps 4..8 unrounded would hold one generation step in five: 500 blocks / 65 s
    assert figures(res, 8, warmup_steps=3, measure_steps=5, sync_every=1)[
        "trainer_tokens_per_s"
    ] == pytest.approx(500 * BLOCK / 65.0, abs=0.05)
    with pytest.raises(
        ProtocolError, match=r"= 20 \(3 and 13 rounded up to whole syncs of 4 steps\)"
    ):
        figures(res, 8, warmup_steps=3, measure_steps=13)
    with pytest.raises(ProtocolError, match="no weight sync"):
        figures(result([10.0] * 3, [100] * 3, sync_every=4), 8, warmup_steps=1, measure_steps=1)


def test_grid_runs_have_the_steps_the_protocol_needs_in_whole_syncs():
    assert train_steps(10, 16, 5, 5) == 160
    assert train_steps(1, 16, 5, 5) == 32  # one sync of warm-up, one measured
    assert train_steps(2, 4, 10, 10) == 24
    assert train_steps(2, 4, 8, 8) == 16


def test_reflow_is_compared_with_each_baseline_and_the_strongest():
    sp = speedups({"one_step_off": 100.0, "async": 150.0, "reflow": 180.0, "reflow, x": 1.0})
    assert sp is not None
    assert sp.over == pytest.approx({"one_step_off": 1.8, "async": 1.2})
    assert sp.strongest == "async" and sp.over_strongest == pytest.approx(1.2)
    # a baseline faster than reflow is the strongest, and the speed-up is below 1
    slow = speedups({"async": 150.0, "one_step_off": 300.0, "reflow": 240.0})
    assert slow is not None and slow.strongest == "one_step_off"
    assert slow.over_strongest == pytest.approx(0.8)
    assert speedups({"async": 1.0}) is None and speedups({"reflow": 1.0}) is None


def row(mode: str, x: float, idle: float) -> dict:
    return {
        "workload": "math",
        "model": "qwen3-8b",
        "gpus": 32,
        "mode": mode,
        "trainer_tokens_per_s": x,
        "whole_run_tokens_per_s": x / 2,
        "trainer_idle_ratio": idle,
        "rollout_idle_ratio": 0.1,
        "efficiency": 0.5,
        "placements": ["24:8"],
        "protocol": {"warmup_steps": 5, "measure_steps": 5, "steps_per_hour": x / 10},
        "overrides": ["train.steps=160"],
    }


def test_the_report_names_the_strongest_baseline_and_the_protocol():
    rows = [row("one_step_off", 100.0, 0.6), row("async", 150.0, 0.4), row("reflow", 180.0, 0.3)]
    text = render(rows, 10)
    assert "5 warm-up + 5 measured steps, syncs of 1" in text
    cell = next(line for line in text.splitlines() if line.startswith("| math | qwen3-8b | 32 |"))
    cols = [c.strip() for c in cell.strip("|").split("|")]
    # reflow tokens/s, whole-run, vs one_step_off, vs async, strongest, vs strongest, idle
    assert cols[3:10] == [
        "180",
        "90",
        "1.80x",
        "1.20x",
        "async",
        "1.20x (1.20x)",
        "60% / 40% / 30%",
    ]
    per_workload = next(line for line in text.splitlines() if line.startswith("| math | 1 |"))
    assert "async (1)" in per_workload and "1.20x (1.20x-1.20x)" in per_workload


def recipe(*sets: str):
    return load_recipe(REPO / "recipes" / "dapo_math.yaml", ["train.steps=32", *sets])


@pytest.mark.parametrize("mode", ["one_step_off", "async"])
def test_a_baseline_mode_keeps_its_placement_and_fixed_caps(mode):
    cfg = recipe()
    assert cfg.scheduler.auto_rebalance  # the recipe turns the allocator on
    planned = plan(cfg, 32, mode=mode).cfg
    assert planned.reflow.mode == mode and planned.reflow.sigma == 0.0
    assert not planned.scheduler.auto_rebalance and not planned.scheduler.adaptive_caps


def test_reflow_runs_with_adaptive_caps_unless_an_ablation_turns_them_off():
    cfg = recipe()
    assert not cfg.scheduler.adaptive_caps  # the recipe leaves them at the default
    planned = plan(cfg, 32, mode="reflow").cfg
    assert planned.scheduler.adaptive_caps and planned.scheduler.auto_rebalance
    # without --mode the recipe runs as it is written
    assert plan(cfg, 32).cfg.scheduler.adaptive_caps == cfg.scheduler.adaptive_caps
    off = ["scheduler.adaptive_caps=false"]
    ablated = plan(recipe(*off), 32, mode="reflow", sets=off).cfg
    assert not ablated.scheduler.adaptive_caps and ablated.scheduler.auto_rebalance


def test_a_baseline_asked_for_with_the_allocator_is_refused_not_changed():
    on = ["scheduler.auto_rebalance=true"]
    with pytest.raises(RecipeError, match=r"^--mode async: scheduler.auto_rebalance: true is"):
        plan(recipe(*on), 32, mode="async", sets=on)


def test_a_grid_runs_every_cell_on_the_seed_it_is_given():
    # a setting chosen by looking at one seed's grid is checked on another (issue "Waiting
    # trainers generate"); before, every grid run drew seed 0
    from benchmarks.sim_grid import run_cell

    runs = {s: run_cell("apps_agent", "qwen3-8b", 8, 2, "reflow", [], 4, 4, seed=s) for s in (0, 1)}
    assert [runs[s]["seed"] for s in (0, 1)] == [0, 1]
    assert runs[0]["trainer_tokens_per_s"] != runs[1]["trainer_tokens_per_s"]
    assert "workload seed 0, 1;" in render([runs[0], runs[1]], 2)
