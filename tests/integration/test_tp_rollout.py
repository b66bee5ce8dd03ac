"""Tensor-parallel rollout replicas in real processes: synthetic-engine runs with
``rollout_gpus_per_replica: 2`` (one engine per replica, on its driver; a rebalance moves
whole replicas), and a real vLLM engine (CPU build) with ``tensor_parallel_size=2`` that
generates the model's log-probs and reloads its weights in every shard."""

import asyncio
import json
import os
import threading

import pytest

from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import BOS, build_model, build_tokenizer, save_pretrained
from runtime.entry import cpu_threads_bind
from tests.helpers import REPO, launch_recipe_text, reflow, running, status_json, switched_to
from tests.helpers import wait_for_status as wait_for
from tests.integration.test_vllm_engine import hf_logprobs

pytestmark = pytest.mark.integration

RECIPE = """
name: tp
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 64}
algorithm: {group_size: 4}
train: {steps: STEPS, batch_size: 16, lr: 0.001}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 1}
resources: {nodes: 1, gpus_per_node: WORLD, initial_ratio: "RATIO", device: cpu,
            rollout_gpus_per_replica: 2}
engine: {rollout: synthetic, trainer: synthetic, synthetic_train_token_s: TRAIN_S}
control: {heartbeat_interval_s: 0.5, heartbeat_timeout_s: 30}
"""


def recipe(world: int, ratio: str, steps: int, train_token_s: float = 0.0) -> str:
    """``train_token_s``: the synthetic trainer's seconds per token (a run long enough for
    a rebalance: without it 60 steps take about 3 s here)."""
    text = RECIPE.replace("STEPS", str(steps)).replace("WORLD", str(world))
    return text.replace("RATIO", ratio).replace("TRAIN_S", str(train_token_s))


def check_ledger(final: dict, drivers: set[str]) -> dict[str, int]:
    """The run's samples all accounted for, and all of them from ``drivers``."""
    ledger = final["buffer"]["ledger"]
    assert ledger["lost"] == 0 and ledger["duplicated"] == 0
    by_rank = final["buffer"]["delivered_by_rank"]
    assert set(by_rank) <= drivers, by_rank  # members run no engine
    assert sum(by_rank.values()) == ledger["delivered"]
    # members never asked for work: nothing for rank 0 to refuse
    assert final["control"]["rejected_by_reason"].get("work_from_tp_member", 0) == 0
    return by_rank


def test_a_tp2_replica_on_four_ranks_generates_on_its_driver_only(tmp_path, runs_dir):
    path = tmp_path / "tp4.yaml"
    path.write_text(recipe(4, "2:2", 20))
    done = reflow("launch", str(path), "--local", "--wait", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next(runs_dir.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "COMPLETED" and summary["steps"] == 20
    assert summary["samples"]["lost"] == 0
    assert 0.0 <= summary["rollout_idle_ratio"] < 1.0  # the member's idle beats left out
    final = json.loads((run_dir / "status.json").read_text())
    by_rank = check_ledger(final, {"2"})
    assert by_rank["2"] > 0
    assert final["rollout_replicas"] == [
        {"driver": 2, "ranks": [2, 3], "state": final["workers"][2]["state"]}
    ]
    assert [w["rollout_driver"] for w in final["workers"]] == [None, None, 2, 2]


@pytest.mark.slow  # ~2 minutes; the unit tier moves members with their group at a switch
def test_a_rebalance_moves_whole_tp2_replicas(tmp_path, runs_dir):
    """No step budget to race: the run trains until the test has seen the switch and ten
    steps after it, then the test stops it."""
    text = recipe(6, "4:2", 100_000, train_token_s=0.001)
    run_dir, run = launch_recipe_text(tmp_path, text, runs_dir)
    s = running(wait_for(run, lambda s: s["step"] >= 10 or s["state"] != "RUNNING", 240))
    assert [g["ranks"] for g in s["rollout_replicas"]] == [[2, 3], [4, 5]]
    bad = reflow("rebalance", "--ratio", "3:3", run)
    assert bad.returncode != 0 and "multiples of the rollout replica size 2" in bad.stderr
    reflow("rebalance", "--ratio", "2:4", run, check=True)
    s = running(wait_for(run, switched_to(2), 240))
    assert [g["ranks"] for g in s["rollout_replicas"]] == [[4, 5]]
    delivered_by_2 = s["buffer"]["delivered_by_rank"].get("2", 0)
    at = s["step"]
    running(wait_for(run, lambda s: s["step"] >= at + 10 or s["state"] != "RUNNING", 240))
    assert "STOPPED" in reflow("stop", run, check=True, timeout=120).stdout
    final = status_json(run)
    assert final["state"] == "STOPPED", final.get("reason")
    by_rank = check_ledger(final, {"2", "4"})
    assert by_rank["2"] > 0 and by_rank["4"] > 0
    # rank 2 left rollout with its member: it made nothing after the switch
    assert by_rank["2"] == delivered_by_2
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == final["step"] and summary["samples"]["lost"] == 0
    switch = summary["switches"][-1]
    assert switch["ratio"] == "2:4" and switch["duration_s"] is not None
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert {x["layout"] for x in lines} == {"4:2", "2:4"}


# --- a real engine ------------------------------------------------------------------------

PROMPT = [BOS, 7, 14, 9, 17]


@pytest.mark.slow  # ~1 min, `make test-slow`: CI time went to the colocated and lost-rank runs
def test_a_tp2_vllm_engine_generates_and_reloads_every_shard(tmp_path, monkeypatch):
    """The CPU build runs two tensor-parallel workers when each gets its own core list (it
    cannot bind them itself on one NUMA node); the driver's binding comes from
    :func:`runtime.entry.cpu_threads_bind`. Log-probs match the Hugging Face model only if
    both shards hold that model's weights, before and after a reload."""
    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    monkeypatch.setenv(
        "VLLM_CPU_OMP_THREADS_BIND", cpu_threads_bind(0, 2, sorted(os.sched_getaffinity(0)))
    )
    first = save_pretrained(build_model(seed=0), build_tokenizer(), tmp_path / "a")
    second = save_pretrained(build_model(seed=1), build_tokenizer(), tmp_path / "b")
    cfg = build_config(
        {
            "model": {"path": str(first), "max_seq_len": 512},
            "engine": {"kv_cache_memory_bytes": 64 << 20},
            "workload": {"max_response_tokens": 64},
            "resources": {
                "gpus_per_node": 4,
                "initial_ratio": "2:2",
                "rollout_gpus_per_replica": 2,
                "device": "cpu",
            },
        }
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    eng = VLLMEngine(str(first), VLLMEngineConfig.from_config(cfg))
    assert eng._args.tensor_parallel_size == 2

    def run(coro, timeout=120):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    try:
        run(eng.start(0), timeout=400)
        tokens, logprobs, spans, _ = run(eng.generate("a", PROMPT, 24, ignore_eos=True))
        assert len(tokens) == 24 and spans == [(0, 0, 24)]
        ref = hf_logprobs(first, PROMPT, tokens)
        assert max(abs(a - b) for a, b in zip(logprobs, ref, strict=True)) < 1e-3
        run(eng.update_weights(str(second), 1))
        tokens, logprobs, spans, _ = run(eng.generate("b", PROMPT, 24, ignore_eos=True))
        assert spans == [(1, 0, 24)]
        new = hf_logprobs(second, PROMPT, tokens)
        old = hf_logprobs(first, PROMPT, tokens)
        assert max(abs(a - b) for a, b in zip(logprobs, new, strict=True)) < 1e-3
        assert max(abs(a - b) for a, b in zip(logprobs, old, strict=True)) > 1e-2
    finally:
        eng.shutdown()
        loop.call_soon_threadsafe(loop.stop)


@pytest.mark.slow  # about 4 minutes: `make test-slow`
def test_the_demo_trains_with_a_tp2_vllm_replica(runs_dir):
    """The demo on real engines with ``rollout_gpus_per_replica: 2``: ranks 0 and 2 drive
    a TP=2 engine each (rank 0's sleeps: it always trains), ranks 1 and 3 are members; the
    trainer's broadcast reaches rank 2's engine at every sync and rollout and trainer agree
    on the policy (the importance ratio stays near 1). Six small steps barely move the
    weights: that every shard reloads is what the engine test above shows."""
    args = [
        "launch",
        str(REPO / "recipes" / "demo.yaml"),
        "--local",
        "--wait",
        "--set",
        "resources.rollout_gpus_per_replica=2",
        "--set",
        "train.steps=6",
        "--set",
        "control.heartbeat_timeout_s=120",
    ]
    done = reflow(*args, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = next(runs_dir.iterdir())
    final = json.loads((run_dir / "status.json").read_text())
    assert final["state"] == "COMPLETED", final.get("reason")
    assert check_ledger(final, {"2"})["2"] > 0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 7))
    assert all(x["weight_sync_s"] > 0 for x in lines[1:])
    assert all(0.8 < x["mean_ratio"] < 1.25 for x in lines)
