"""Held-out evals of the colocated baseline on real engines (vLLM CPU build + FSDP2 torch,
2 ranks that each generate then train): every engine plays a share of the round inside a
rollout phase, and the end's round gets a rollout phase after the last step. Before, the
trainer leader played the sets with Hugging Face generate while every rank waited."""

import json

from tests.helpers import REPO, reflow

SETS = (
    "reflow.mode=colocated_sync",
    "reflow.sigma=0",
    "resources.gpus_per_node=2",
    "resources.initial_ratio=null",  # no split: every rank plays both roles
    "resources.trainer_gpus_per_replica=2",
    "train.strategy=fsdp2",
    "train.steps=4",
    "train.eval_every=2",
    "eval.max_prompts=8",
    "eval.k=2",
    "control.heartbeat_timeout_s=120",
)


def test_colocated_rounds_run_in_rollout_phases_on_every_engine(runs_dir):
    flags = [x for s in SETS for x in ("--set", s)]
    recipe = str(REPO / "examples/arith_retry/recipe.yaml")
    done = reflow("launch", recipe, "--local", *flags, "--wait", timeout=900)
    run_dir = next(runs_dir.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert done.returncode == 0 and summary["state"] == "COMPLETED", summary["reason"]
    assert summary["samples"]["lost"] == 0

    rounds = summary["eval_rounds"]
    # the start's (v0), the one after the sync at step 2, the end's (after step 4)
    assert [(r["when"], r["step"], r["version"]) for r in rounds] == [
        ("start", 0, 0),
        ("step", 2, 2),
        ("end", 4, 4),
    ]
    assert all(r["complete"] and r["rank"] is None for r in rounds)
    for r in rounds:
        for name in ("draws", "unseen"):
            assert r["figures"][f"eval/{name}/prompts"] == 8.0
            assert r["figures"][f"eval/{name}/unscored"] == 0.0

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "eval_version" not in x]
    evals = [x for x in lines if "eval_version" in x]
    assert [x["step"] for x in steps] == [1, 2, 3, 4]
    assert [x["eval_version"] for x in evals] == [0, 2, 4]
    # the trainer leader evaluated nothing: no eval figure in a step's line
    assert not any(k.startswith(("eval/", "eval_start/")) for x in steps for k in x)
    # the end's rollout phase: the last layout change is to rollout, after step 4
    assert summary["switches"][-1]["ratio"] == "rollout"
