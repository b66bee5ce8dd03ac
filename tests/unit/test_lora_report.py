"""benchmarks/lora.py's report: read off run folders, one row per arm, the gain as a share
of full's, and a run that did not complete is an error naming it."""

import json

import pytest

from benchmarks import lora as bench


def run_folder(root, arm: str, start: float, end: float, sync_bytes: float, state="COMPLETED"):
    d = root / f"lora-{arm}-20261204-000000"
    d.mkdir()
    lines = [
        {"step": s, "wall_s": 10.0 * s, "weight_sync_bytes": sync_bytes, "weight_sync_s": 0.01}
        for s in range(1, 5)
    ]
    (d / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in lines))
    summary = {
        "state": state,
        "reason": None if state == "COMPLETED" else "rank 2 left",
        "steps": 4,
        "eval_reward_start": start,
        "eval_reward_end": end,
        "wall_s": 50.0,
        "trainer_tokens_per_s": 100.0,
        "samples": {"lost": 0},
        # 10% of 2 rollout ranks x 30 s of training window, over 4 syncs
        "rollout_idle_by_cause": {"weight_sync": 0.1},
    }
    (d / "summary.json").write_text(json.dumps(summary))
    return d


def test_the_report_gives_each_arm_its_share_of_full_gain(tmp_path, capsys):
    run_folder(tmp_path, "full", 0.2, 0.4, 1000)
    run_folder(tmp_path, "lora_adapter", 0.2, 0.35, 100)
    assert bench.main(["--report-only", str(tmp_path)]) == 0
    table = (tmp_path / "lora.md").read_text()
    assert "| full | 0.200 -> 0.400 | +0.200 | 1.00 |" in table
    assert "| lora_adapter | 0.200 -> 0.350 | +0.150 | 0.75 |" in table
    assert "| 100 | 10.0 ms | 750.0 ms | 0 |" in table  # 0.1 x 30 s x 2 / 4 syncs / 2 ranks
    rows = json.loads((tmp_path / "lora.json").read_text())
    assert [r["arm"] for r in rows] == ["full", "lora_adapter"]


def test_a_run_that_did_not_complete_is_named(tmp_path):
    run_folder(tmp_path, "full", 0.2, 0.4, 1000, state="FAILED")
    with pytest.raises(SystemExit, match=r"lora-full-.*FAILED"):
        bench.main(["--report-only", str(tmp_path)])
