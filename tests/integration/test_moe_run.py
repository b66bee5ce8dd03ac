"""The MoE demo on real engines (recipes/demo_moe.yaml: vLLM's CPU build for rollout, the
torch trainer under FSDP2 over 2 ranks, routing replay on) on the MoE with its own SFT
(``embedded:tiny-qwen3-moe``, not the demo's upcycled one, whose experts begin as copies,
so that replaying a route or not would be expected to change little at step 6) with the old
log-probs recomputed, a few steps: nothing lost, every weight sync carries every
expert (the model's whole parameter count, one matrix per expert), and the engines generate
with the trainer's policy: at the first step, where every sample is version 0's and fresh,
the trainer's recomputed log-probs are the engine's (mismatch_k3 ~ 0), and no later step
drifts. Every sample arrives with its routes (rank 0 checked them against the model), the
trainer's routers replay them, and the mismatch with the replayed routes is no larger than
with the trainer's own on the same samples."""

import json

import pytest

from runtime.embedded.tiny_qwen3 import build_moe_model
from tests.helpers import REPO, reflow, status_json

pytestmark = pytest.mark.integration


def test_the_moe_demo_trains_on_real_engines_with_every_expert_synced(runs_dir):
    args = ["launch", str(REPO / "recipes" / "demo_moe.yaml"), "--local", "--wait"]
    # the old log-probs recomputed (the demo takes the rollout's): the mismatch metrics need them
    sets = ["--set", "train.steps=6", "--set", "algorithm.recompute_old_logprobs=true"]
    sets += ["--set", "model.path=embedded:tiny-qwen3-moe"]  # experts that differ
    reflow(*args, "--name", "moe", *sets, check=True, timeout=900)
    run_dir = next(runs_dir.iterdir())
    final = status_json(run_dir.name)
    assert final["state"] == "COMPLETED", final.get("reason")
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3, 4, 5, 6]
    params = sum(p.numel() for p in build_moe_model().parameters())  # tied head: once
    assert {x["weight_sync_bytes"] for x in lines[1:]} == {params * 4}  # float32
    assert lines[0]["mismatch_k3"] < 1e-4
    assert all(x["mismatch_k3"] < 0.02 for x in lines)
    # routing replay: every sample carried routes; replayed, they leave no more mismatch
    # than the trainer's own routes on the same samples (per step the two can tie within
    # rounding where the routers agree, hence the tolerance)
    assert all(x["routed_rows_share"] == 1.0 for x in lines)
    assert all(0.0 <= x["router_disagreement"] < 0.2 for x in lines)
    replayed = sum(x["mismatch_k3"] for x in lines)
    own = sum(x["mismatch_k3_own_routes"] for x in lines)
    assert replayed <= own + 1e-5, (replayed, own)
