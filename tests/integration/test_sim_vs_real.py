"""The simulator against a real run: the same recipe on the synthetic CPU engines (real
processes, ZeroMQ, the real coordinator) and simulated with the parameters those engines
are built on (runtime/sim/fit.py). Trainer throughput over the training window must agree
within 25%; what differs is what the simulator leaves out (messaging, polling, the
trainer's own compute)."""

import json

from runtime.recipe import load_recipe
from runtime.sim.cluster import SimCluster
from runtime.sim.fit import SYNTHETIC_SLOTS, synthetic_profiles
from tests.conftest import launch_recipe_text
from tests.conftest import wait_for_status as wait_for

RECIPE = """
name: simcheck
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 256}
algorithm: {group_size: 4}
train: {steps: 40, batch_size: 32, lr: 0.001, sync_every: 1}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 2}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: 0.004,
         synthetic_train_token_s: 0.0004}
control: {heartbeat_interval_s: 0.25}
"""


def window_throughput(lines: list[dict]) -> float:
    """Trained tokens per second between the first and the last step."""
    steps = [m for m in lines if "tokens" in m]
    tokens = sum(m["tokens"] for m in steps[1:])
    return tokens / (steps[-1]["wall_s"] - steps[0]["wall_s"])


def test_a_simulation_matches_a_real_cpu_run_within_25_percent(tmp_path, runs_dir):
    run_dir, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)
    final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 600)
    assert final["state"] == "COMPLETED", final.get("reason")
    real = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]

    recipe = tmp_path / "recipe.yaml"
    cfg = load_recipe(recipe)
    model, workload = synthetic_profiles(cfg)
    sim = SimCluster(cfg, model, workload, block=1, heartbeat_s=1.0, max_seqs=SYNTHETIC_SLOTS)
    simulated = sim.run()
    assert simulated.summary["steps"] == 40

    x_real, x_sim = window_throughput(real), window_throughput(simulated.metrics)
    print(f"trainer tokens/s: real {x_real:.0f}, simulated {x_sim:.0f}, ratio {x_sim / x_real:.3f}")
    assert abs(x_sim / x_real - 1) < 0.25, (x_real, x_sim)
