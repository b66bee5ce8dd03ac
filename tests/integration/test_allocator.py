"""The producer/consumer allocator driving real hybrid workers (synthetic engines, real
processes and sockets): a workload whose responses grow and then shrink moves ranks from
the trainer to the rollout pool and back, each decision visible in status and metrics."""

import itertools
import json

from tests.helpers import launch_recipe_text, reflow, running, switched_to
from tests.helpers import wait_for_status as wait_for

# Rollout: a KV budget of 1024 tokens, 4 ms per token; responses grow 8x by version 12,
# then shrink back by 24. Trainer: 0.5 ms per token, shared by the trainer ranks. Short
# responses make the trainer the bottleneck (1:3 fits), long ones the rollout (3:1).
# Admission is loose (B_max, delta) so a busy rollout rank runs as many generations as
# its KV budget allows: its rate is then the engine's capacity, not the dispatcher's.
RECIPE = """
name: alloc
model: {max_seq_len: 2048}
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 1024}
algorithm: {group_size: 4}
train: {steps: 36, batch_size: 16, lr: 0.001}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 4, B_max: 256}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "1:3", device: cpu}
scheduler: {auto_rebalance: true, cooldown_steps: 3, window_steps: 3}
engine:
  rollout: synthetic
  trainer: synthetic
  synthetic_token_s: 0.004
  synthetic_train_token_s: 0.0005
  synthetic_kv_tokens: 1024
  synthetic_length_schedule: {"0": 0.25, "12": 2.0, "24": 0.25}
control: {heartbeat_interval_s: 0.25, heartbeat_timeout_s: 30}
"""


def test_allocator_follows_the_bottleneck_both_ways(tmp_path, runs_dir):
    run_dir, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)
    seen = wait_for(run, lambda s: s["step"] >= 8 or s["state"] != "RUNNING", 300)
    shown = reflow("status", run).stdout
    assert "allocator: auto on" in shown
    final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 600)
    assert final["state"] == "COMPLETED", final.get("reason")
    assert seen["allocator"]["auto"] is True

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 37))
    decisions = [x["placement"] for x in lines if "placement" in x]
    applied = [d for d in decisions if d["applied"]]
    rollout_counts = [int(x["layout"].split(":")[0]) for x in lines]
    # trainer -> rollout while responses grow, rollout -> trainer when they shrink
    peak = max(range(len(rollout_counts)), key=lambda i: rollout_counts[i])
    assert rollout_counts[peak] > rollout_counts[0], rollout_counts
    assert min(rollout_counts[peak:]) < rollout_counts[peak], rollout_counts
    # every applied decision carries its inputs, respects the cooldown, and was carried out
    steps = [d["step"] for d in applied]
    assert all(b - a >= 3 for a, b in itertools.pairwise(steps))
    for d in applied:
        assert d["window"]["produced"] > 0 and d["rollout_rate"] > 0 and d["trainer_rate"] > 0
        assert d["best"] in d["predicted"] and d["best"] != d["current"]
    transitions = [t for x in lines for t in x.get("transitions", [])]
    assert len(transitions) >= len(applied) - 1  # the last one may finish after the last step
    assert all(t["source"] == "auto" and t["duration_s"] >= 0 for t in transitions)
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0


def test_manual_override_and_auto_toggle(tmp_path, runs_dir):
    """No step budget to race: the run trains until the test has done its part and stops
    it."""
    recipe = RECIPE.replace("steps: 36", "steps: 100000")
    _, run = launch_recipe_text(tmp_path, recipe, runs_dir)
    running(wait_for(run, lambda s: s["step"] >= 2 or s["state"] != "RUNNING", 300))
    assert (
        "automatic rebalancing off" in reflow("rebalance", "--auto", "off", run, check=True).stdout
    )
    assert running(wait_for(run, lambda s: True))["allocator"]["auto"] is False
    reflow("rebalance", "--ratio", "2:2", run, check=True)
    s = running(wait_for(run, switched_to(2), 300))
    assert s["switches"][-1]["source"] == "manual"
    bad = reflow("rebalance", "--auto", "maybe", run)
    assert bad.returncode == 2 and "not on or off" in bad.stderr
    assert reflow("rebalance", run).returncode == 2
    assert "STOPPED" in reflow("stop", run, check=True, timeout=120).stdout
