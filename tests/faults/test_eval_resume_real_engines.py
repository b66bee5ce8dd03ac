"""Held-out evals across a stop and a resume on real engines (vLLM CPU build + torch, 4
ranks): the evals finished before the stop are kept, and none is repeated: the resumed run
evaluates neither its start nor a version evaluated before, and completes after the last
step's eval (issue "Evaluation that never stops training")."""

from __future__ import annotations

import json

from tests.helpers import REPO, reflow, status_json
from tests.helpers import wait_for_status as wait_for

SETS = ("train.steps=100000", "train.eval_every=3", "eval.max_prompts=8", "eval.k=1")
TERMINAL = ("COMPLETED", "FAILED", "STOPPED")


def evals_of(run_dir) -> list[dict]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if "eval_version" in line]


def test_a_resumed_run_keeps_its_evals_and_repeats_none(runs_dir):
    flags = [x for s in SETS for x in ("--set", s)]
    reflow("launch", str(REPO / "examples/arith_retry/recipe.yaml"), "--local", *flags, check=True)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name

    def two_evals(s: dict) -> bool:
        last = (s.get("eval_rounds") or {}).get("last") or {}
        return last.get("version", -1) >= 3 or s["state"] in TERMINAL

    s = wait_for(run, two_evals, 600)
    assert s["state"] == "RUNNING", s.get("reason")
    assert "STOPPED" in reflow("stop", run, check=True, timeout=180).stdout
    before = evals_of(run_dir)
    versions_before = [e["eval_version"] for e in before]
    assert versions_before[:2] == [0, 3]
    # complete, but for a round the stop found running: ended then, said so, and kept
    cut = [e for e in before if not e["eval_complete"]]
    assert all(e["eval_reason"] == "the run stopped" for e in cut) and len(cut) <= 1
    assert not cut or cut[0] is before[-1]
    saved = json.loads((run_dir / "summary.json").read_text())["checkpoints"][-1]
    assert saved["ok"]

    target = saved["step"] + 4
    done = reflow(
        "launch", "--resume", run, "--local", "--set", f"train.steps={target}", timeout=300
    )
    assert done.returncode == 0, done.stderr
    final = wait_for(run, lambda s: s["state"] in TERMINAL, 600)
    assert final["state"] == "COMPLETED" and final["step"] == target, final.get("reason")
    after = evals_of(run_dir)[len(before) :]
    versions = [e["eval_version"] for e in evals_of(run_dir)]
    # none repeated: not the start, not a version evaluated before the stop
    assert len(versions) == len(set(versions)), versions
    assert 0 not in [e["eval_version"] for e in after]
    assert after and after[-1]["eval_version"] == target  # the end's
    assert all(e["eval_complete"] for e in after)
    # the finished evals before the stop are kept in the resumed run's summary
    summary = json.loads((run_dir / "summary.json").read_text())
    kept = [r["version"] for r in summary["eval_rounds"]]
    assert kept[: len(versions_before)] == versions_before, kept
    assert summary["evals"]["draws"]["start"]["prompts"] == 8.0  # the first attempt's start
    assert status_json(run)["eval_rounds"]["last"]["version"] == target
