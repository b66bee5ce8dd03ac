"""The generation scheduler on real vLLM engines (CPU build): with a KV cache of 7 blocks
(896 tokens) the engines preempt, their stat loggers report it in heartbeats, and rank 0's
AIMD caps and token admission hold the rollout ranks back; nothing is lost."""

import json

import pytest

from tests.helpers import REPO, reflow


# ~3 minutes of real engines for a rule that is off by default: make test-slow (CI's
# budget); the AIMD logic itself is unit-tested (tests/unit/test_scheduling.py)
@pytest.mark.slow
def test_aimd_caps_follow_real_engine_preemptions(runs_dir):
    done = reflow(
        "launch",
        str(REPO / "recipes" / "demo.yaml"),
        "--local",
        "--wait",
        "--set",
        "train.steps=15",
        "--set",
        "engine.kv_cache_memory_bytes=1048576",
        "--set",
        "scheduler.cap_interval_s=1.0",
        "--set",
        "scheduler.adaptive_caps=true",
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run_dir = next(runs_dir.iterdir())
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "COMPLETED"
    gen = status["generation"]
    assert set(gen["caps"]) == {"2", "3"}  # both rollout ranks reported engine stats
    changes = gen["recent_changes"]
    decreases = [c for c in changes if c["action"] == "decrease"]
    assert decreases and max(c["preemptions"] for c in changes) > 0
    assert all(1 <= c["cap"] <= 32 for c in changes)
    blocked = status["buffer"]["blocked"]
    assert blocked.get("concurrency_cap", 0) + blocked.get("token_budget", 0) > 0
    ledger = status["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
