"""Samples flow rollout ranks -> rank-0 buffer -> trainer over ZeroMQ, in real processes."""

import json
import math

import pytest

from tests.helpers import launch_recipe_text, reflow, running, status_json, switched_to
from tests.helpers import wait_for_status as wait_for

# Rollout slower than the default synthetic engine (2 ms a token): replay fills a batch only
# when the trainer asks before b fresh samples are in. Since admission stopped letting
# rollout run a batch past delta while one trains (2026-12-05), the default speed kept
# every batch fresh on this machine and the replay assertion below never held.
RECIPE = """
name: flow
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 64}
algorithm: {group_size: 4}
train: {steps: 100000, batch_size: 16, lr: 0.001}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 1}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: 0.002}
control: {heartbeat_interval_s: 0.5, heartbeat_timeout_s: 20}
"""


def test_samples_flow_through_buffer_with_role_switches(tmp_path, runs_dir):
    """The run has no step budget to race (with 200 steps, a fast machine could finish
    before the second rebalance): it trains until the test has seen both switches and 20
    steps after the second, then the test stops it."""
    run_dir, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)

    running(wait_for(run, lambda s: s["step"] >= 20 or s["state"] != "RUNNING", 300))
    reflow("rebalance", "--ratio", "3:1", run, check=True)
    step_at_switch = running(wait_for(run, switched_to(3), 300))["step"]
    running(wait_for(run, lambda s: s["step"] >= step_at_switch + 20 or s["state"] != "RUNNING"))
    reflow("rebalance", "--ratio", "2:2", run, check=True)
    back_at = running(wait_for(run, switched_to(2), 300))["step"]
    running(wait_for(run, lambda s: s["step"] >= back_at + 20 or s["state"] != "RUNNING"))
    assert f"run {run}: STOPPED reflow stop" in reflow("stop", run, check=True).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED", final.get("reason")
    steps = final["step"]

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, steps + 1))
    for x in lines:
        assert x["batch_unused"] + x["batch_replay"] == 16
        assert x["batch_unused"] >= math.ceil(16 * (1 - 0.5))
        assert x["max_sample_age"] <= 1
    assert any(x["batch_replay"] > 0 for x in lines), "replay never used"
    assert {x["layout"] for x in lines} >= {"2:2", "3:1"}
    assert lines[-1]["layout"] == "2:2"  # and back

    buffer = final["buffer"]
    ledger = buffer["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    assert ledger["delivered"] == ledger["held_in_buffer"] + ledger["evicted"] + ledger["retired"]
    # Ranks 2 and 3 were rollout throughout; rank 1 produced only while it was rollout.
    by_rank = buffer["delivered_by_rank"]
    assert by_rank["2"] > 0 and by_rank["3"] > 0 and by_rank.get("1", 0) > 0
    assert sum(by_rank.values()) == ledger["delivered"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["samples"]["lost"] == 0
    assert summary["samples"]["consumed"] == steps * 16
    human = reflow("status", run, check=True).stdout
    assert "buffer: unused" in human and "replay fraction" in human


@pytest.mark.parametrize(
    "mode", ["colocated_sync", "disaggregated_sync", "one_step_off", "async", "reflow"]
)
def test_each_execution_mode_runs(tmp_path, runs_dir, mode):
    recipe = tmp_path / f"{mode}.yaml"
    sigma = 0.5 if mode == "reflow" else 0.0
    # generations of ~0.3 s: long enough to be in flight across a weight sync
    recipe.write_text(
        RECIPE.replace("train: {steps: 100000", "train: {steps: 12")
        .replace("mode: reflow, sigma: 0.5", f"mode: {mode}, sigma: {sigma}")
        .replace("trainer: synthetic}", "trainer: synthetic, synthetic_token_s: 0.005}")
        .replace(
            'initial_ratio: "2:2", ', "" if mode == "colocated_sync" else 'initial_ratio: "2:2", '
        )
    )
    done = reflow("launch", str(recipe), "--local", "--wait", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next(runs_dir.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["mode"] == mode and summary["steps"] == 12
    assert summary["samples"]["lost"] == 0
    assert 0.0 <= summary["rollout_idle_ratio"] <= 1.0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if mode != "reflow":
        assert all(x["batch_replay"] == 0 for x in lines)
    if mode in ("colocated_sync", "disaggregated_sync"):  # every batch is fully fresh
        assert all(x["max_sample_age"] == 0 for x in lines)
    held, by_rank = summary["held_across_sync"], summary["delivered_by_rank"]
    if mode == "colocated_sync":
        # every rank generates and every rank trains, in every step (sync_every 1): a
        # rollout phase then a train phase, both over all 4 ranks, with rank-seconds in
        # each; nothing is in flight across a weight sync
        for x in lines:
            assert x["ranks_by_role"] == {"rollout": [0, 1, 2, 3], "trainer": [0, 1, 2, 3]}
            assert x["rank_seconds"]["rollout"] > 0 and x["rank_seconds"]["trainer"] > 0
        assert sorted(by_rank) == ["0", "1", "2", "3"] and min(by_rank.values()) > 0
        assert held == 0
        phases = [t["ratio"] for x in lines for t in x.get("transitions", [])]
        assert phases.count("trainer") == 12 and phases.count("rollout") >= 11
    else:  # the split keeps its roles: rollout ranks 2 and 3, the trainer 0 and 1
        assert all(x["ranks_by_role"] == {"rollout": [2, 3], "trainer": [0, 1]} for x in lines)
    if mode in ("async", "reflow"):
        assert held > 0, "no generation was held across a weight sync (partial rollout)"
