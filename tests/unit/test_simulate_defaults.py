"""``reflow simulate``'s defaults: the run is as long as the measurement protocol (not the
recipe's whole train.steps), a ``--set resources.initial_ratio`` is the placement
simulated, and the figures report fresh tokens/s beside trained tokens/s."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from reflow_cli.main import app
from runtime.config.recipe import RecipeError, load_recipe
from runtime.sim.run import FRESH_EXACT, FRESH_SHARE, figures, fresh_blocks, plan, simulate
from tests.helpers import REPO

RECIPE = REPO / "recipes" / "dapo_math.yaml"
# a small batch and a sync every 2 steps: the protocol's 5 + 5 syncs are 20 short steps
SMALL = ["--set", "train.batch_prompts=4", "--set", "train.sync_every=2"]


def simulate_json(*args: str) -> dict:
    done = CliRunner().invoke(app, ["simulate", *args, "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout.splitlines()[-1])


def test_without_steps_the_run_is_the_protocols_length(tmp_path):
    # a recipe of 16 steps: today's code refuses it as shorter than the protocol (20
    # steps); simulate runs the protocol's length whatever the recipe's train.steps
    recipe = tmp_path / "short.yaml"
    recipe.write_text(RECIPE.read_text().replace("steps: 4800", "steps: 16"))
    assert load_recipe(recipe).train.steps == 16
    row = simulate_json(str(recipe), "--gpus", "8", "--mode", "async", *SMALL)
    assert row["steps"] == 20
    assert row["protocol"]["warmup_steps"] == 10 and row["protocol"]["measure_steps"] == 10
    # the shipped recipe (4,800 steps) too, with a shorter protocol: 2 + 2 syncs
    row = simulate_json(
        str(RECIPE), "--gpus", "8", "--mode", "async", *SMALL,
        "--warmup-steps", "3", "--measure-steps", "4",
    )  # fmt: skip
    assert row["steps"] == 8  # 3 and 4 steps rounded up to whole syncs of 2


@pytest.mark.parametrize("given", [["--steps", "24"], ["--set", "train.steps=24"]])
def test_a_length_given_on_the_command_line_is_simulated(given):
    row = simulate_json(str(RECIPE), "--gpus", "8", "--mode", "async", *SMALL, *given)
    assert row["steps"] == 24


def test_a_set_initial_ratio_is_the_placement_simulated():
    sets = ["resources.initial_ratio=16:16"]
    cfg = load_recipe(RECIPE, sets)
    for mode in ("async", "reflow", None):
        assert plan(cfg, 32, mode=mode, sets=sets).cfg.resources.initial_ratio == "16:16"
    assert plan(load_recipe(RECIPE), 32, mode="async").cfg.resources.initial_ratio == "24:8"
    # one that the resized groups cannot hold is refused, not replaced
    with pytest.raises(RecipeError, match=r"resources\.initial_ratio: 16:16 adds up to 32, not 16"):
        plan(cfg, 16, mode="async", sets=sets)
    row = simulate_json(
        str(RECIPE), "--gpus", "32", "--mode", "async", *SMALL, "--set", sets[0],
        "--warmup-steps", "2", "--measure-steps", "2",
    )  # fmt: skip
    assert row["placements"] == ["16:16"]


def test_fresh_tokens_are_counted_exactly_when_the_lines_carry_them():
    lines = [
        {"tokens": 100, "batch_unused": 3, "batch_replay": 1, "fresh_tokens": 90},
        {"tokens": 60, "batch_unused": 2, "batch_replay": 2, "fresh_tokens": 40},
    ]
    assert fresh_blocks(lines) == (130.0, FRESH_EXACT)
    # without them: each step's tokens times its fresh share of samples
    bare = [{k: v for k, v in m.items() if k != "fresh_tokens"} for m in lines]
    assert fresh_blocks(bare) == (100 * 3 / 4 + 60 * 2 / 4, FRESH_SHARE)


def small_run(mode: str) -> dict:
    sets = ["train.steps=8", "train.sync_every=2", "train.batch_prompts=4"]
    result = simulate(plan(load_recipe(RECIPE, sets), 8, mode=mode))
    return figures(result, 8, warmup_steps=4, measure_steps=4)


def test_replay_is_left_out_of_the_fresh_tokens():
    replayed = small_run("reflow")
    assert replayed["replay_share"] > 0
    assert 0 < replayed["fresh_tokens_per_s"] < replayed["trainer_tokens_per_s"]
    assert (
        replayed["protocol"]["fresh_tokens_basis"] == FRESH_EXACT
    )  # the metrics lines carry fresh_tokens
    fresh = small_run("async")  # no replay: every trained token is fresh
    assert fresh["fresh_tokens_per_s"] == fresh["trainer_tokens_per_s"]
