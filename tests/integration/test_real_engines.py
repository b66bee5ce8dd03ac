"""The main job on real engines: vLLM (CPU build) rollout + the FSDP2 torch trainer, 4
local ranks, process groups over gloo, in one run (each start of four engines costs CI
about two minutes):

1. Role switches 2:2 -> 3:1 -> 2:2 in the middle of training: the state machine of a hybrid
   worker (trainer offloaded / engine asleep, regroup, trainer state rank to rank, weights
   streamed into the engines), each phase timed.
2. Then kill -9 of rank 1, one of the two trainer replicas: the leader's next step meets
   the dead rank in its gradient all-reduce and is aborted, rank 0 declares the rank lost
   by its silence, the live ranks regroup without it, and the batch, split over the leader
   alone, is trained again. Before this, the run failed (rank 0 did not absorb a lost
   trainer rank).
3. Then kill -9 of rank 3, one of the two rollout ranks: the leader drops it at the next
   weight sync, rank 0 declares it lost at once, and the live ranks regroup again. Before
   this, the first broadcast after the kill failed the run ("Connection reset by peer").

The run trains on with one trainer and one rollout rank, nothing lost or duplicated, until
the test stops it: it has no step budget to race (at 36 steps, a loaded machine once
reached the last step before the test looked). A run that completes on real engines, its
end-of-run eval and final policy, is tests/integration/test_fsdp_demo.py's.

A hung rollout rank (SIGSTOP) with real engines is in
tests/faults/test_rank_rejoins_real_engines.py (after a trainer rank's rejoin, in make test)
and tests/faults/test_lost_rollout_rank_real_engines.py (make test-slow); over real gloo in
tests/integration/test_lost_peers.py."""

import json
import os
import signal
import time

from tests.helpers import launch_demo, reflow, running, status_json, switched_to
from tests.helpers import wait_for_status as wait_for
from tests.integration.test_spine import pid_alive

# The test acts at steps the run reaches (each wait is on a condition, bounded) and then
# stops the run: the budget is one it never reaches.
STEPS = 100_000
# steps the run trains with one trainer and one rollout rank before the test stops it
STEPS_AFTER_LOSSES = 5


def test_real_engines_train_through_role_switches_and_two_lost_ranks(runs_dir):
    run_dir, run = launch_demo(
        "real",
        (
            f"train.steps={STEPS}",
            "control.heartbeat_timeout_s=20",  # how long a killed trainer rank goes unnoticed
            "train.strategy=fsdp2",  # the demo's tiny model defaults to replicate
        ),
        runs_dir,
    )

    running(wait_for(run, lambda s: s["step"] >= 3 or s["state"] != "RUNNING", 600))
    reflow("rebalance", "--ratio", "3:1", run, check=True)
    at = running(wait_for(run, switched_to(3), 600))["step"]
    running(wait_for(run, lambda s: s["step"] >= at + 3 or s["state"] != "RUNNING", 600))
    reflow("rebalance", "--ratio", "2:2", run, check=True)
    at = running(wait_for(run, switched_to(2), 600))["step"]
    s = running(wait_for(run, lambda s: s["step"] >= at + 2 or s["state"] != "RUNNING", 600))
    pids = {w["rank"]: w["pid"] for w in s["workers"]}
    os.kill(pids[1], signal.SIGKILL)
    lost_one = lambda s: len(s["lost_ranks"]) >= 1 or s["state"] != "RUNNING"  # noqa: E731
    at = running(wait_for(run, lost_one, 300))["step"]
    running(wait_for(run, lambda s: s["step"] >= at + 1 or s["state"] != "RUNNING", 300))
    os.kill(pids[3], signal.SIGKILL)
    lost_two = lambda s: len(s["lost_ranks"]) >= 2 or s["state"] != "RUNNING"  # noqa: E731
    at = running(wait_for(run, lost_two, 300))["step"]
    more = lambda s: s["step"] >= at + STEPS_AFTER_LOSSES or s["state"] != "RUNNING"  # noqa: E731
    running(wait_for(run, more, 600))
    assert "STOPPED" in reflow("stop", run, check=True, timeout=300).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED", final.get("reason")

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = final["step"]
    assert steps >= at + STEPS_AFTER_LOSSES
    assert [x["step"] for x in lines] == list(range(1, steps + 1))  # none lost or doubled
    trainer_lost, rollout_lost = final["lost_ranks"]
    before = [x for x in lines if x["step"] <= trainer_lost["at_step"]]
    after = [x for x in lines if x["step"] > trainer_lost["at_step"] + 1]

    # 1. The switches. Data parallelism: every trainer rank trained its shard; the replicas
    # stayed identical (rank 1 left the trainer pool and came back initialised from rank
    # 0's state).
    assert before[-1]["layout"] == "2:2" and "3:1" in {x["layout"] for x in before}
    assert all(x["trainer_replicas"] == int(x["layout"][-1]) for x in before)
    assert all(x["replica_spread"] == 0.0 for x in before[:-1])
    # the step the trainer rank died in may have trained and then lost its replica check
    # (a lost peer costs the check only); every step that has one agrees
    assert all(x.get("replica_spread", 0.0) == 0.0 for x in lines)
    # Weights were streamed at every sync point after the first (bytes, seconds, GB/s).
    assert all(x["weight_sync_s"] > 0 and x["weight_sync_bytes"] > 0 for x in lines[1:])
    assert all(x["weight_sync_gbps"] > 0 for x in lines[1:])
    assert len({x["weight_sync_bytes"] for x in lines[1:]}) == 1  # the whole model each time
    # Rollout and trainer agree on the policy: the importance ratio stays near 1 for fresh
    # samples (behaviour log-probs from vLLM vs the trainer's teacher forcing), also after
    # broadcasts, switches and losses.
    assert all(0.8 < x["mean_ratio"] < 1.25 for x in lines)
    assert final["buffer"]["delivered_by_rank"].get("1", 0) > 0  # rank 1 generated as rollout
    manual = [x for x in final["switches"] if x["applied"] and x["source"] != "lost_rank"]
    assert len(manual) == 2 and all(x["duration_s"] is not None for x in manual)
    # every phase of the switch was timed by the ranks; state and weights moved
    for x in manual:
        phases = x["phases_max_s"]
        assert set(phases) == {"offload", "wake", "regroup", "state_transfer", "weight_load"}
        assert phases["regroup"] > 0 and phases["state_transfer"] > 0
    transitions = [t for x in lines for t in x.get("transitions", [])]
    assert [t["source"] == "lost_rank" for t in transitions].count(False) == 2
    assert all(t["phases_max_s"] for t in transitions)
    # rank 1 came back as a trainer replica and got the state from rank 0, shard to shard
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "trainer state v" in rank0 and "sent from rank 0 to [1]" in rank0
    assert "received from rank 0" in (run_dir / "logs" / "rank1.log").read_text()
    assert not (run_dir / "handoff").exists()  # nothing went through the disk
    # leaving rollout at 3:1 -> 2:2, rank 1's engine parked what it generated and handed
    # it over (its requests went back to the queue on its report, not on the bound)
    assert "leaving the rollout pool: handed over" in (run_dir / "logs" / "rank1.log").read_text()
    requeued = final["buffer"]["requeued_by_reason"]
    assert "hand_over_timeout" not in requeued, requeued

    # 2. and 3. The losses, each a regroup of the live ranks (a forced epoch, completed).
    assert trainer_lost["rank"] == 1 and trainer_lost["role"] == "trainer", trainer_lost
    assert "sent no heartbeat" in trainer_lost["reason"], trainer_lost
    assert "aborted" in rank0  # the leader's step met the dead rank (not a clean gap)
    assert after and all(x["trainer_replicas"] == 1 for x in after)
    assert rollout_lost["rank"] == 3 and rollout_lost["role"] == "rollout", rollout_lost
    # dropped by the leader at the next sync, or, killed while the leader still waited on
    # the regroup, declared lost by its silence first: either way lost, not a failure
    why = rollout_lost["reason"]
    assert "dropped from a weight sync by rank 0" in why or "sent no heartbeat" in why, why
    workers = {w["rank"]: w["state"] for w in final["workers"]}
    assert workers[1] == "dead" and workers[3] == "dead"
    regroups = [x for x in final["switches"] if x["source"] == "lost_rank"]
    assert len(regroups) == 2 and all(x["duration_s"] is not None for x in regroups)

    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"]["lost"] == 0 and summary["steps"] == steps
    assert summary["eval_reward_start"] is not None
    # syncs do not go through the folder: nothing is written there before the end
    assert not list((run_dir / "weights").glob("v*"))
    deadline = time.monotonic() + 60  # and no rank is left behind
    while any(pid_alive(x) for x in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(pid_alive(x) for x in pids.values())
