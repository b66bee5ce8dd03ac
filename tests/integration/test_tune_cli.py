"""``reflow tune`` (reflow_cli/tune.py) as a user runs it: on a tiny cluster whose profile
makes the best placement known it prints that placement's ``--set`` lines, and those
lines make ``reflow simulate`` run exactly what tune predicted; rates fitted from a run
folder with ``--from``; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from reflow_cli.tune import faster_baselines, set_lines
from runtime.config.recipe import dump_config, load_recipe
from runtime.sim.parameters import DEFAULT_PROFILES
from tests.helpers import REPO, reflow

RECIPE = str(REPO / "recipes" / "dapo_math.yaml")
SETS = ["--set", "train.batch_prompts=4", "--set", "train.sync_every=2"]


@pytest.fixture
def slow_trainer(tmp_path: Path) -> str:
    """Profiles where qwen3-8b trains 50 tokens/s per GPU in groups of one GPU, with short
    math responses: on 8 GPUs the placement with the most trainer groups, 1:7, is best
    (tests/unit/test_placement_search.py checks the search itself)."""
    raw = yaml.safe_load(DEFAULT_PROFILES.read_text())
    raw["models"]["qwen3-8b"].update(trainer_gpus_per_replica=1, train_tok_s=50.0)
    raw["workloads"]["math"].update(median_start=250, median_end=700, max_tokens=2048)
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def tune(*args: str, check: bool = True):
    return reflow("tune", *args, check=check)


def test_tune_prints_the_set_line_of_the_known_best_placement(slow_trainer):
    args = [RECIPE, "--gpus", "8", "--profiles", slow_trainer, *SETS, "--budget", "4"]
    table = tune(*args, "--modes", "async").stdout
    assert "async at 1:7:" in table
    assert "  --set resources.initial_ratio=1:7" in table.splitlines()
    assert "fastest: async at 1:7" in table
    report = json.loads(tune(*args, "--modes", "async,colocated_sync", "--json").stdout)
    rows = {r["mode"]: r for r in report["modes"]}
    row = rows["async"]
    assert row["placement"] == "1:7" and row["default_placement"] == "6:2"
    assert row["trainer_tokens_per_s"] > row["default_tokens_per_s"]
    assert row["simulations"] <= 4 + 2 and len(row["evaluated"]) <= 4
    assert rows["colocated_sync"]["simulations"] == 1
    assert report["simulations"] == row["simulations"] + 1
    # the printed lines are the configuration simulated: reflow simulate with them (and
    # no --mode: the recipe as set) runs tune's best run again, to the token
    sets = [part for line in row["set"] for part in line.split(" ", 1)]
    again = reflow(
        "simulate", RECIPE, "--gpus", "8", "--profiles", slow_trainer, *SETS, *sets, "--json",
        check=True,
    )  # fmt: skip
    sim = json.loads(again.stdout)
    assert sim["mode"] == "async" and sim["placements"] == ["1:7"]
    assert sim["trainer_tokens_per_s"] == row["trainer_tokens_per_s"]


def fake_run(folder: Path, recipe: str = "demo.yaml") -> Path:
    """A finished run's folder as runtime/sim/fit.py reads it: the demo recipe at 2:2,
    eight steps of 1,280 tokens in one second on two trainer ranks, rollout at 2,000
    tokens/s with 20% idle."""
    folder.mkdir()
    dump_config(load_recipe(REPO / "recipes" / recipe), folder / "config.yaml")
    step = {"tokens": 1280, "step_time_s": 1.0, "layout": "2:2", "reward_mean": 0.5}
    lines = [{"step": k, "wall_s": 1.2 * k, "weight_sync_s": 0.1, **step} for k in range(1, 9)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    summary = {"rollout_idle_ratio": 0.2, "rollout_tokens_per_s": 2000.0}
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_tune_fits_the_rates_from_a_run_folder(tmp_path):
    run = fake_run(tmp_path / "run")
    demo = str(REPO / "recipes" / "demo.yaml")
    report = json.loads(
        tune(demo, "--gpus", "4", "--from", str(run), "--modes", "async", "--json").stdout
    )
    assert report["rates"] == str(run)
    (row,) = report["modes"]
    # groups of one rank on 4: three placements, every one tried within the budget
    assert sorted(e["placement"] for e in row["evaluated"]) == ["1:3", "2:2", "3:1"]
    assert row["placement"] in ("1:3", "2:2", "3:1") and row["trainer_tokens_per_s"] > 0
    assert row["protocol"]["full"] == [5, 5]  # the demo's kind measures as math: 5 + 5 syncs
    missing = tune(demo, "--gpus", "4", "--from", str(tmp_path), check=False)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"reflow: --from {tmp_path}: no config.yaml (not a finished run?)"
    ]


def test_a_fitted_agent_run_is_measured_by_the_agents_protocol(tmp_path):
    # the fitted profile is named cpu-fitted, which has no protocol: before, an agent
    # run's fit was measured over 5 + 5 syncs, not the agents' 10 + 10
    run = fake_run(tmp_path / "run", "apps_coding_cpu.yaml")
    recipe = str(REPO / "recipes" / "apps_coding_cpu.yaml")
    args = ("--gpus", "4", "--from", str(run), "--modes", "async", "--budget", "1", "--json")
    (row,) = json.loads(tune(recipe, *args).stdout)["modes"]
    every = load_recipe(REPO / "recipes" / "apps_coding_cpu.yaml").train.sync_every
    assert row["protocol"]["full"] == [10 * every, 10 * every]


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--modes", "bogus"], "reflow: --modes bogus: not one of colocated_sync, "),
        (["--budget", "0"], "reflow: --budget 0: expected >= 1"),
        (["--from", "/nonexistent"], "reflow: --from /nonexistent: not a run folder"),
        (["--from", ".", "--model", "qwen3-8b"], "reflow: --from fits the model and workload"),
        (["--b-max", "--budget", "2"], "reflow: --budget 2: the B_max candidates take 2 runs"),
    ],
)
def test_bad_input_is_one_line(args, line):
    done = tune(RECIPE, "--gpus", "8", *SETS, *args, check=False)
    assert done.returncode == 2 and done.stdout == ""
    (only,) = done.stderr.strip().splitlines()
    assert only.startswith(line)


def test_a_gpu_count_off_the_nodes_is_refused():
    done = tune(RECIPE, "--gpus", "20", check=False)
    assert done.returncode == 2 and "--gpus 20: not a multiple" in done.stderr


def test_the_set_lines_are_the_fields_the_tuned_config_changed():
    recipe = load_recipe(RECIPE)
    tuned = load_recipe(
        RECIPE, ["resources.initial_ratio=16:16", "reflow.B_max=4096", "train.steps=160"]
    )
    assert set_lines(recipe, tuned) == [
        "--set reflow.B_max=4096",
        "--set resources.initial_ratio=16:16",
    ]  # train.steps is the simulation's length, not a setting


def test_a_baseline_faster_than_reflow_is_flagged():
    rows = [
        {"mode": "async", "placement": "20:12", "trainer_tokens_per_s": 1100.0},
        {"mode": "one_step_off", "placement": "24:8", "trainer_tokens_per_s": 900.0},
        {"mode": "reflow", "placement": "24:8", "trainer_tokens_per_s": 1000.0},
    ]
    assert faster_baselines(rows) == [
        "async at 20:12 is predicted faster than reflow (1100 vs 1000 tokens/s, 1.10x)"
    ]
    assert faster_baselines(rows[:2]) == []  # no reflow: nothing to compare
