"""The main job on real engines: vLLM (CPU build) rollout + the FSDP2 torch trainer, 4
local ranks, with role switches 2:2 -> 3:1 -> 2:2 in the middle of training: the state
machine of a hybrid worker (trainer offloaded / engine asleep, regroup, trainer state rank
to rank, weights streamed into the engines), each phase timed."""

import json

from tests.helpers import REPO, reflow
from tests.helpers import wait_for_status as wait_for


def test_real_engines_train_through_role_switches(runs_dir):
    args = [
        "launch",
        str(REPO / "recipes" / "demo.yaml"),
        "--local",
        "--name",
        "real",
        "--set",
        "train.steps=40",
        "--set",
        "control.heartbeat_timeout_s=120",
        "--set",
        "train.strategy=fsdp2",  # the demo's tiny model defaults to replicate
    ]
    reflow(*args, check=True, timeout=900)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name
    wait_for(run, lambda s: s["step"] >= 3 or s["state"] != "RUNNING", 600)
    reflow("rebalance", "--ratio", "3:1", run, check=True)
    s = wait_for(
        run,
        lambda s: (
            s["state"] != "RUNNING"
            or (s["layout"]["rollout_gpus"] == 3 and not s["layout"]["switching"])
        ),
        600,
    )
    step_at_switch = s["step"]
    wait_for(run, lambda s: s["step"] >= step_at_switch + 3 or s["state"] != "RUNNING", 600)
    reflow("rebalance", "--ratio", "2:2", run, check=True)
    final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 900)
    assert final["state"] == "COMPLETED", final.get("reason")

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 41))
    assert [x["layout"] for x in lines][-1] == "2:2" and "3:1" in {x["layout"] for x in lines}
    # Data parallelism: every trainer rank trained its shard; the replicas stayed identical
    # (rank 1 left the trainer pool and came back initialised from rank 0's state).
    assert all(x["trainer_replicas"] == int(x["layout"][-1]) for x in lines)
    assert all(x["replica_spread"] == 0.0 for x in lines)
    # Weights were streamed at every sync point after the first (bytes, seconds, GB/s).
    assert all(x["weight_sync_s"] > 0 and x["weight_sync_bytes"] > 0 for x in lines[1:])
    assert all(x["weight_sync_gbps"] > 0 for x in lines[1:])
    assert len({x["weight_sync_bytes"] for x in lines[1:]}) == 1  # the whole model each time
    # Rollout and trainer agree on the policy: the importance ratio stays near 1 for fresh
    # samples (behaviour log-probs from vLLM vs the trainer's teacher forcing).
    assert 0.8 < lines[0]["mean_ratio"] < 1.25
    assert all(0.8 < x["mean_ratio"] < 1.25 for x in lines)  # also after broadcasts
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    assert final["buffer"]["delivered_by_rank"].get("1", 0) > 0  # rank 1 generated as rollout
    switches = [x for x in final["switches"] if x["applied"]]
    assert len(switches) == 2 and all(x["duration_s"] is not None for x in switches)
    # every phase of the switch was timed by the ranks; state and weights moved
    for x in switches:
        phases = x["phases_max_s"]
        assert set(phases) == {"offload", "wake", "regroup", "state_transfer", "weight_load"}
        assert phases["regroup"] > 0 and phases["state_transfer"] > 0
    transitions = [t for x in lines for t in x.get("transitions", [])]
    assert len(transitions) == 2 and all(t["phases_max_s"] for t in transitions)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["samples"]["lost"] == 0
    assert summary["eval_reward_start"] is not None and summary["eval_reward_end"] is not None
    weights = sorted(p.name for p in (run_dir / "weights").glob("v*"))
    assert weights == ["v40"]  # the final policy; syncs no longer go through the folder
    # rank 1 came back as a trainer replica and got the state from rank 0, shard to shard
    rank0 = (run_dir / "logs" / "rank0.log").read_text()
    assert "trainer state v" in rank0 and "sent from rank 0 to [1]" in rank0
    assert "received from rank 0" in (run_dir / "logs" / "rank1.log").read_text()
    assert not (run_dir / "handoff").exists()  # nothing went through the disk
