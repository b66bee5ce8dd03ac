"""The simulator against a real run: the same recipe on the synthetic CPU engines (real
processes, ZeroMQ, the real coordinator) and simulated with the parameters those engines
are built on (runtime/sim/fit.py). Trainer throughput over the training window must agree
within 40%; what differs is what the simulator leaves out (messaging, polling, the
trainer's own compute), and that part is wall-clock on a shared CPU, which grows with the
machine's load while the engines' modeled time does not. With 0.004 s per generated token
the ratio measured 1.09 alone here, 1.26 in the full suite and 1.50 in CI (2026-12-03).
The engines' times are now three times longer (0.012 s per token, 0.0012 s per trained
token; fewer steps keep the wall time), so the same overhead weighs a third as much:
0.96 alone (fitted: 1.00) and 1.02 (1.08) beside two busy loops, where the old setting
gave 1.15 (1.07), on 2026-12-03. A simulator that is wrong is off by far more."""

import json
import string

import pytest

from runtime.config.recipe import load_recipe
from runtime.sim.cluster import SimCluster
from runtime.sim.fit import (
    SYNTHETIC_SLOTS,
    fit_run,
    simulate_fit,
    synthetic_profiles,
    window_throughput,
)
from tests.helpers import launch_recipe_text
from tests.helpers import wait_for_status as wait_for

STEPS, TOKEN_S, TRAIN_TOKEN_S = 16, 0.012, 0.0012
RECIPE = string.Template("""
name: simcheck
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 256}
algorithm: {group_size: 4}
train: {steps: $steps, batch_size: 32, lr: 0.001, sync_every: 1}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 2}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: $token_s,
         synthetic_train_token_s: $train_token_s}
control: {heartbeat_interval_s: 0.25}
""").substitute(steps=STEPS, token_s=TOKEN_S, train_token_s=TRAIN_TOKEN_S)


def test_a_simulation_matches_a_real_cpu_run_within_40_percent(tmp_path, runs_dir):
    run_dir, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)
    final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 600)
    assert final["state"] == "COMPLETED", final.get("reason")
    real = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]

    recipe = tmp_path / "recipe.yaml"
    cfg = load_recipe(recipe)
    model, workload = synthetic_profiles(cfg)
    sim = SimCluster(cfg, model, workload, block=1, heartbeat_s=1.0, max_seqs=SYNTHETIC_SLOTS)
    simulated = sim.run()
    assert simulated.summary["steps"] == STEPS

    x_real, x_sim = window_throughput(real), window_throughput(simulated.metrics)
    print(f"trainer tokens/s: real {x_real:.0f}, simulated {x_sim:.0f}, ratio {x_sim / x_real:.3f}")
    assert abs(x_sim / x_real - 1) < 0.40, (x_real, x_sim)

    # The same run fitted from its folder alone, as benchmarks/modes.py does for the vLLM
    # and torch engines: the measured rates must recover the engines' known ones (the
    # trainer sleeps TRAIN_TOKEN_S per token split over its ranks: 1 / TRAIN_TOKEN_S
    # tokens/s per rank, less its own compute) and the fitted simulation must still agree.
    fit = fit_run(run_dir)
    assert fit.tokens_per_s == pytest.approx(x_real)
    assert 0.6 < fit.model.train_tok_s * TRAIN_TOKEN_S <= 1.05, fit.model.train_tok_s
    assert fit.model.step_per_seq_s > 0 and fit.workload.median_end > 1
    x_fit = simulate_fit(fit)
    print(f"fitted from the run's folder: simulated {x_fit:.0f}, ratio {x_fit / x_real:.3f}")
    assert abs(x_fit / x_real - 1) < 0.40, (x_real, x_fit)
