"""Held-out evals in the simulator: rank 0's eval rounds (runtime/control/evals.py) run in
simulated runs on a pinned replica's modelled engine, and their cost is reported."""

import pytest

from runtime.config.recipe import load_recipe
from runtime.sim import cluster as sim_cluster
from runtime.sim.parameters import load_profiles
from runtime.sim.run import eval_figures, figures, plan, simulate
from tests.helpers import REPO

PROFILES = load_profiles()


def recipe(name: str, steps: int, *sets: str, eval_every: int = 4):
    """A shipped recipe cut short, with a weight sync every 2 steps and an eval every 4."""
    base = (f"train.steps={steps}", "train.sync_every=2", f"train.eval_every={eval_every}")
    return load_recipe(REPO / "recipes" / name, [*base, *sets])


@pytest.mark.parametrize(
    ("name", "workload"), [("dapo_math.yaml", "math"), ("apps_coding.yaml", "apps_agent")]
)
def test_eval_rounds_run_at_the_start_every_n_steps_and_at_the_end(name, workload):
    cfg = recipe(name, 8, "eval.max_prompts=6", "eval.k=2")
    sim = sim_cluster.SimCluster(
        plan(cfg, 32).cfg, PROFILES.model("qwen3-8b"), PROFILES.workload(workload)
    )
    res = sim.run()
    s = res.summary
    assert s["state"] == "COMPLETED" and s["steps"] == 8
    assert s["samples"]["lost"] == 0 and s["samples"]["duplicated"] == 0
    rounds = s["eval_rounds"]
    # (a round due while another runs is skipped: one at a time)
    assert [(r["when"], r["step"]) for r in rounds] in (
        [("start", 0), ("step", 4), ("end", 8)],
        [("start", 0), ("end", 8)],
    )
    assert all(r["complete"] and r["missing"] == 0 for r in rounds)
    # every set's prompts, once greedily and k times sampled, played to their end
    assert res.eval_episodes_per_round == 6 * (1 + 2)
    assert sim.pool.evals.done == len(rounds) * 6 * 3
    for r in rounds:
        assert r["figures"]["eval/" + next(iter(cfg.data.eval)) + "/prompts"] == 6
    # the pinned replica's busy time is booked as the eval's
    assert s["rollout_busy_by_cause"]["eval"] > 0
    e = eval_figures(res)
    assert e is not None and e["rounds"] == len(rounds) and e["incomplete"] == 0
    assert 0 < e["share_of_rollout"] < 1 and e["end_round_s"] > 0


def test_a_run_without_eval_sets_has_no_rounds_and_the_same_training():
    """Evals cost the training something, but never its samples: both runs train every
    step with nothing lost; without sets there is no round and no eval figure."""
    with_evals = simulate(plan(recipe("dapo_math.yaml", 6, "eval.max_prompts=4"), 32))
    without = simulate(plan(recipe("dapo_math.yaml", 6, "data.eval={}", eval_every=0), 32))
    assert without.summary.get("eval_rounds") is None and eval_figures(without) is None
    assert "eval" not in without.summary.get("rollout_busy_by_cause", {})
    assert figures(without, 32, warmup_steps=2, measure_steps=4)["evals"] is None
    for r in (with_evals, without):
        assert r.summary["steps"] == 6 and r.summary["samples"]["lost"] == 0
    # the end's round runs after the last step: the run with evals ends later
    assert with_evals.sim_s > without.sim_s


def test_colocated_sync_plays_its_rounds_inside_rollout_phases_that_wait_for_them():
    """Every engine takes a share of the round; the end's round gets a rollout phase of
    its own after the last step."""
    sim = sim_cluster.SimCluster(
        plan(recipe("dapo_math.yaml", 8, "eval.max_prompts=8"), 32, mode="colocated_sync").cfg,
        PROFILES.model("qwen3-8b"),
        PROFILES.workload("math"),
    )
    res = sim.run()
    rounds = res.summary["eval_rounds"]
    assert [(r["when"], r["step"], r["rank"]) for r in rounds] == [
        ("start", 0, None),
        ("step", 4, None),
        ("end", 8, None),
    ]
    assert all(r["complete"] for r in rounds)
    assert sim.pool.evals.done == 3 * 8 * 5
    # 4 train phases, each followed by a rollout phase: the last one plays the end's round
    assert [s["ratio"] for s in res.summary["switches"]] == ["trainer", "rollout"] * 4
    e = eval_figures(res)
    assert e["shared"] and e["share_of_rollout"] is None and e["end_round_s"] > 0
    assert res.summary["samples"]["lost"] == 0 and res.summary["steps"] == 8


def test_a_round_longer_than_its_timeout_ends_incomplete_and_says_so():
    cfg = recipe("dapo_math.yaml", 4, "eval.max_prompts=8", "eval.timeout_s=30")
    res = simulate(plan(cfg, 32))
    rounds = res.summary["eval_rounds"]
    assert rounds and all(not r["complete"] and r["missing"] > 0 for r in rounds)
    assert all(r["reason"] == "timed out after 30 s" for r in rounds)
    assert res.summary["state"] == "COMPLETED" and res.summary["samples"]["lost"] == 0
    assert eval_figures(res)["incomplete"] == len(rounds)


def test_reflow_simulate_prints_the_eval_line(tmp_path):
    from typer.testing import CliRunner

    from reflow_cli.main import app

    out = CliRunner().invoke(
        app,
        [
            "simulate",
            str(REPO / "recipes" / "dapo_math.yaml"),
            "--gpus",
            "32",
            "--steps",
            "160",
            "--set",
            "eval.max_prompts=4",
        ],
    )
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())  # (rich wraps lines at the terminal's width)
    line = text[text.index("reflow: ") :]
    assert "of 20 episodes" in line and "of rollout GPU time" in line and "(simulated)" in line
