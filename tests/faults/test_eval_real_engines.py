"""Held-out evals on real engines (vLLM CPU build + torch, 4 ranks): training steps go on
while a pinned rollout rank plays an eval round, and kill -9 of that rank mid-round ends
the round incomplete, said so, while the run trains on with nothing lost.

examples/arith_retry's two sets at 64 prompts and k=4 (640 episodes a round), every 4
steps. The run has no step budget to race: the test stops it."""

from __future__ import annotations

import json
import os
import signal

from tests.helpers import REPO, reflow, running, status_json
from tests.helpers import wait_for_status as wait_for

SETS = (
    "train.steps=100000",
    "train.eval_every=4",
    "eval.max_prompts=64",
    "eval.k=4",
    "control.heartbeat_timeout_s=10",  # how long a killed rank goes unnoticed
)


def in_flight(s: dict) -> dict | None:
    rounds = s.get("eval_rounds") or {}
    r = rounds.get("in_flight")
    return r if r and r["done"] < r["total"] else None


def test_steps_go_on_during_an_eval_and_a_killed_pinned_rank_ends_it_incomplete(runs_dir):
    flags = [x for s in SETS for x in ("--set", s)]
    recipe = str(REPO / "examples/arith_retry/recipe.yaml")
    reflow("launch", recipe, "--local", *flags, check=True)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name
    stopped = lambda s: s["state"] != "RUNNING"  # noqa: E731

    # 1. Steps advance while a round is in flight (a round may end between two looks:
    # then the next round is watched; one comes every 4 steps).
    seen = None
    for _ in range(5):
        s = running(wait_for(run, lambda s: in_flight(s) or stopped(s), 600))
        r, at = in_flight(s), s["step"]
        s = running(wait_for(run, lambda s, at=at: s["step"] > at or stopped(s), 600))
        now = in_flight(s)
        if now is not None and now["version"] == r["version"]:
            seen = (r["version"], at, s["step"])
            break
    assert seen is not None, "no step was trained while an eval round ran"

    # 2. kill -9 of the pinned rank mid-round: its round ends incomplete, the run goes on
    s = running(wait_for(run, lambda s: in_flight(s) or stopped(s), 600))
    victim = in_flight(s)
    pid = {w["rank"]: w["pid"] for w in s["workers"]}[victim["rank"]]
    os.kill(pid, signal.SIGKILL)
    lost = lambda s: s["lost_ranks"] or stopped(s)  # noqa: E731
    at = running(wait_for(run, lost, 300))["step"]
    s = running(wait_for(run, lambda s: s["step"] >= at + 3 or stopped(s), 600))
    reflow("stop", run, check=True)
    final = status_json(run)
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rounds = {line["eval_version"]: line for line in lines if "eval_version" in line}
    cut = rounds[victim["version"]]
    if cut["eval_complete"]:  # it ended between the look and the kill: said as such
        assert cut["eval_missing"] == 0
    else:
        assert cut["eval_reason"] == f"rank {victim['rank']} lost" and cut["eval_missing"] > 0
    # every other round that ended is complete, each under the step that published it,
    # but for the one the stop found running (ended then: "the run stopped")
    for version, line in rounds.items():
        assert line["step"] >= version  # sync_every 1: version v is published at step v
        if version != victim["version"]:
            stopped_last = version == max(rounds) and line.get("eval_reason") == "the run stopped"
            assert line["eval_complete"] or stopped_last, line
