"""kill -9 of a rollout rank mid-run (synthetic engines, real processes): it is declared dead
within the heartbeat timeout, its in-flight requests go back to the queue and to the other
rollout rank, the run goes on with the other, and the sample ledger shows nothing lost or
duplicated (what the dead rank delivered is kept exactly once).

The run has no step budget to race: it trains until the test has seen what it needs and
stops it (with 60 steps, a loaded machine once reached the last step before rank 3 had
delivered anything)."""

import os
import signal
import time

from tests.helpers import launch_recipe_text, reflow, running, status_json
from tests.helpers import wait_for_status as wait_for
from tests.integration.test_spine import pid_alive

RECIPE = """
name: dead
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 256}
algorithm: {group_size: 4}
train: {steps: 100000, batch_size: 16, lr: 0.001}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 2}
resources: {nodes: 1, gpus_per_node: 4, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: 0.002}
control: {heartbeat_interval_s: 0.25, heartbeat_timeout_s: 3}
"""


def test_a_killed_rollout_rank_costs_nothing_but_time(tmp_path, runs_dir):
    _, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)
    # Rank 3 must have delivered before it dies, or "what it delivered is kept" is vacuous
    # (and the ledger's by-rank count has no entry for it): on a loaded machine step 10 can
    # come before rank 3's first group.
    s = wait_for(
        run,
        lambda s: (
            (s["step"] >= 10 and s["buffer"]["delivered_by_rank"].get("3", 0) > 0)
            or s["state"] != "RUNNING"
        ),
        300,
    )
    assert s["state"] == "RUNNING", s.get("reason")
    pids = [w["pid"] for w in s["workers"]]
    victim = next(w for w in s["workers"] if w["rank"] == 3)
    os.kill(victim["pid"], signal.SIGKILL)
    s = wait_for(run, lambda s: s["lost_ranks"] or s["state"] != "RUNNING", 60)
    assert s["state"] == "RUNNING", s.get("reason")
    (lost,) = s["lost_ranks"]
    assert lost["rank"] == 3 and "sent no heartbeat" in lost["reason"]
    at = s["step"]
    # rank 2 carries on alone
    running(wait_for(run, lambda s: s["step"] >= at + 20 or s["state"] != "RUNNING", 300))
    assert f"run {run}: STOPPED reflow stop" in reflow("stop", run, check=True).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED" and final["step"] >= at + 20
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0 and ledger["outstanding"] >= 0
    assert ledger["delivered"] == ledger["held_in_buffer"] + ledger["evicted"] + ledger["retired"]
    by_rank = final["buffer"]["delivered_by_rank"]
    assert by_rank["3"] > 0 and by_rank["2"] > by_rank["3"]  # rank 2 carried on alone
    assert {w["rank"]: w["state"] for w in final["workers"]}[3] == "dead"
    deadline = time.monotonic() + 30  # and the job ended: no rank left behind
    while any(pid_alive(x) for x in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(pid_alive(x) for x in pids)
