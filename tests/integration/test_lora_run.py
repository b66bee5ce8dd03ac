"""A LoRA run on real engines (recipes/demo_lora.yaml: vLLM CPU build serving the adapter,
the torch trainer under FSDP2), 4 local ranks, through two role switches: 2:2 -> 1:3 (a
rollout rank turns trainer and receives the adapters and their AdamW state) -> 3:1 (two
trainer ranks turn rollout and load the current adapter). Every sync sends the adapter
only; the engines and the trainer agree on the policy throughout (the importance ratio of
fresh samples stays near 1, which it would not if an engine served a stale or a missing
adapter); the replicas agree; the checkpoint of the stop exports as a peft adapter folder.

The run has no step budget to race (at 24 steps a loaded machine could reach the last
step before the second switch): once the test has seen the switches and three steps after
them, it stops the run."""

import json

from tests.helpers import REPO, reflow, running, status_json, switched_to
from tests.helpers import wait_for_status as wait_for

STEPS = 100_000  # never reached: the test stops the run


def test_a_lora_run_syncs_the_adapter_through_role_switches(runs_dir, tmp_path):
    args = ["launch", str(REPO / "recipes" / "demo_lora.yaml"), "--local", "--name", "lora"]
    for s in (f"train.steps={STEPS}", "train.strategy=fsdp2"):
        args += ["--set", s]
    reflow(*args, check=True, timeout=900)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name

    running(wait_for(run, lambda s: s["step"] >= 3 or s["state"] != "RUNNING", 600))
    reflow("rebalance", "--ratio", "1:3", run, check=True)
    at = running(wait_for(run, switched_to(1), 600))["step"]
    running(wait_for(run, lambda s: s["step"] >= at + 3 or s["state"] != "RUNNING", 600))
    reflow("rebalance", "--ratio", "3:1", run, check=True)
    at = running(wait_for(run, switched_to(3), 600))["step"]
    running(wait_for(run, lambda s: s["step"] >= at + 3 or s["state"] != "RUNNING", 600))
    assert "STOPPED" in reflow("stop", run, check=True, timeout=300).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED", final.get("reason")

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, final["step"] + 1))
    assert {"2:2", "1:3", "3:1"} <= {x["layout"] for x in lines}
    assert all(x.get("replica_spread", 0.0) == 0.0 for x in lines)
    # the adapter alone at every sync: 2 blocks x 7 layers x r (in + out) x 4 bytes
    # (rank 8; q, o: 128 + 128; k, v: 128 + 64; gate, up, down: 128 + 384)
    adapter = 2 * 8 * (2 * 256 + 2 * 192 + 3 * 512) * 4
    assert {x["weight_sync_bytes"] for x in lines[1:]} == {adapter}
    assert all(0.8 < x["mean_ratio"] < 1.25 for x in lines)
    assert final["buffer"]["ledger"]["lost"] == 0 and final["buffer"]["ledger"]["duplicated"] == 0
    switches = [x for x in final["switches"] if x["applied"]]
    assert len(switches) == 2 and switches[0]["phases_max_s"]["state_transfer"] > 0
    assert switches[1]["phases_max_s"]["weight_load"] > 0  # new rollout ranks loaded it
    # the stop's checkpoint holds the policy: it exports as the adapter alone
    (ckpt,) = (run_dir / "checkpoints").glob("step-*")
    out = tmp_path / "export"
    reflow("export", run, str(out), "--checkpoint", ckpt.name, check=True, timeout=300)
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names
    assert not names & {"config.json", "model.safetensors"}  # not a whole model
