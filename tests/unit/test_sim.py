"""The cluster simulator: its control plane is the runtime's own classes, its engine models
behave as documented, and simulated runs keep the runtime's invariants."""

import json
import math

import pytest

from runtime.config.recipe import RecipeError, load_recipe
from runtime.control import coordinator, data_plane, dispatcher, replay_buffer
from runtime.control.scheduling import allocator, generation
from runtime.sim import cluster as sim_cluster
from runtime.sim.parameters import ModelProfile, ProfileError, load_profiles
from runtime.sim.replica import RolloutReplica
from runtime.sim.run import figures, plan, simulate
from tests.helpers import REPO

PROFILES = load_profiles()


def small(recipe="dapo_math.yaml", steps=6, *sets):
    """A shipped recipe cut short: ``steps`` steps with a weight sync every 2 (the recipes
    sync every 16 or 4, which would make these runs several times longer)."""
    sets = (f"train.steps={steps}", "train.sync_every=2", *sets)
    return load_recipe(REPO / "recipes" / recipe, list(sets))


def test_the_simulated_control_plane_is_the_runtime_itself():
    sim = sim_cluster.SimCluster(
        plan(small(), 32).cfg, PROFILES.model("qwen3-8b"), PROFILES.workload("math")
    )
    c = sim.coord
    assert type(c) is coordinator.Coordinator
    assert type(c.data) is data_plane.DataPlane
    assert type(c.data.buffer) is replay_buffer.ReplayBuffer
    assert type(c.data.dispatcher) is dispatcher.Dispatcher
    assert type(c.generation) is generation.GenerationScheduler
    assert type(c.rebalance.allocator) is allocator.ProducerConsumerAllocator
    # and the module uses them, it does not define look-alikes
    assert sim_cluster.Coordinator is coordinator.Coordinator


def model(**kw) -> ModelProfile:
    """Qwen3-8B's profile with ``kw`` changed; no context cost unless asked for, so that a
    step's time is ``step_base_s + step_per_seq_s * c`` and finish times are round
    (tests/unit/test_sim_fidelity.py checks the context cost)."""
    base = PROFILES.model("qwen3-8b")
    fields = {**base.__dict__, "step_per_ctx_token_s": 0.0, **kw}
    return ModelProfile(**fields)


def test_processor_sharing_finishes_at_the_computed_times():
    m = model(step_base_s=0.01, step_per_seq_s=0.0, prefill_tok_s=1e12, kv_tokens=10**9)
    r = RolloutReplica(m, block=1, max_seqs=8)
    r.submit(1, 10, 100)
    r.submit(2, 10, 300)
    r.on_event(0.0)
    # both run: 1 token per 0.01 s each
    assert r.next_event() == pytest.approx(1.0)
    assert r.on_event(r.next_event()) == [1]
    assert r.next_event() == pytest.approx(3.0)
    assert r.on_event(r.next_event()) == [2]
    assert r.next_event() == math.inf


def test_a_batching_curve_slows_each_sequence_but_raises_throughput():
    m = model(step_base_s=0.01, step_per_seq_s=0.001, prefill_tok_s=1e12, kv_tokens=10**9)
    one = RolloutReplica(m, block=1, max_seqs=64)
    one.submit(1, 1, 100)
    one.on_event(0.0)
    many = RolloutReplica(m, block=1, max_seqs=64)
    for i in range(32):
        many.submit(i, 1, 100)
    many.on_event(0.0)
    t1, t32 = one.next_event(), many.next_event()
    assert t32 > t1 and 32 * 100 / t32 > 100 / t1


def test_a_weight_sync_holds_generation_and_resumes_it():
    m = model(step_base_s=0.01, step_per_seq_s=0.0, prefill_tok_s=1e12, kv_tokens=10**9)
    r = RolloutReplica(m, block=1, max_seqs=8)
    r.submit(1, 10, 100)
    r.on_event(0.0)
    r.stall(0.5, 2.0)  # half way, a 2 s sync
    assert r.next_event() == pytest.approx(3.0)  # 0.5 s before + 2 s held + 0.5 s after
    assert r.on_event(r.next_event()) == [1]


def test_a_full_kv_cache_preempts_the_newest_and_recomputes_it():
    m = model(step_base_s=0.01, step_per_seq_s=0.0, prefill_tok_s=1e12, kv_tokens=300)
    r = RolloutReplica(m, block=1, max_seqs=8)
    r.submit(1, 50, 200)
    r.submit(2, 50, 200)
    r.on_event(0.0)
    assert len(r.running) == 2
    t = r.next_event()  # 100 + 2 x S = 300 -> S = 100 tokens each, at 1 s
    assert t == pytest.approx(1.0)
    r.on_event(t)
    # the newest lost its 100 tokens; it is back at once (there is room) from scratch
    assert r.preemptions == 1 and r.running[2].start == pytest.approx(r.S)
    assert r.running[1].start == 0.0 and r.kv_used() == pytest.approx(50 + 100 + 50)
    done = []
    while r.running or r.waiting:
        done += r.on_event(r.next_event())
    assert sorted(done) == [1, 2] and r.preemptions >= 1


def test_a_simulated_run_keeps_the_ledger_and_is_deterministic():
    a = simulate(plan(small(), 32, mode="reflow"), seed=3)
    b = simulate(plan(small(), 32, mode="reflow"), seed=3)
    assert a.summary["state"] == "COMPLETED" and a.summary["steps"] == 6
    samples = a.summary["samples"]
    assert samples["lost"] == 0 and samples["duplicated"] == 0
    assert [m["tokens"] for m in a.metrics] == [m["tokens"] for m in b.metrics]
    assert a.sim_s == b.sim_s
    assert any(m["batch_replay"] > 0 for m in a.metrics)
    row = figures(a, 32, warmup_steps=2, measure_steps=4)  # 3 syncs: 1 warm-up, 2 measured
    assert 0 < row["trainer_tokens_per_s"] <= row["bound_tokens_per_s"] * 1.0001
    assert 0 <= row["trainer_idle_ratio"] <= 1 and 0 <= row["rollout_idle_ratio"] <= 1


@pytest.mark.parametrize("mode", ["colocated_sync", "disaggregated_sync", "one_step_off", "async"])
def test_baseline_modes_run_the_runtime_gates(mode):
    res = simulate(plan(small(), 32, mode=mode))
    assert res.summary["mode"] == mode and res.summary["steps"] == 6
    assert all(m["batch_replay"] == 0 for m in res.metrics)
    if mode in (
        "colocated_sync",
        "disaggregated_sync",
    ):  # one batch at a time: nothing is ever stale
        assert res.summary["samples"]["evicted"] == 0
        assert all(m["max_sample_age"] == 0 for m in res.metrics)


def test_colocated_sync_uses_every_gpu_for_both_phases():
    # The real coordinator alternates two phases of all 32 GPUs: the rollout phase makes
    # the train phase's 2 batches (sync_every 2), every GPU trains them, and each phase
    # change costs the profile's colocated figures (wake; in-place sync + wake)
    res = simulate(plan(small(), 32, mode="colocated_sync"))
    m = PROFILES.model("qwen3-8b")
    assert res.summary["steps"] == 6 and res.summary["samples"]["lost"] == 0
    everyone = list(range(32))
    for line in res.metrics:
        assert line["max_sample_age"] == 0 and line["batch_replay"] == 0
        assert line["ranks_by_role"]["trainer"] == everyone
        if line["step"] % 2:  # the first step of a train phase: its rollout phase before
            assert line["ranks_by_role"]["rollout"] == everyone
            assert line["rank_seconds"]["rollout"] > 0
        else:  # the second: training only
            assert line["ranks_by_role"]["rollout"] == [] and line["rank_seconds"]["rollout"] == 0
        assert line["rank_seconds"]["trainer"] > 0
    switches = res.summary["switches"]
    # (the last: a rollout phase of no training work, for the end's held-out eval)
    assert [s["ratio"] for s in switches] == ["trainer", "rollout"] * 3
    assert [r["when"] for r in res.summary["eval_rounds"]] == ["start", "end"]
    to_train = [s["max_rank_switch_s"] for s in switches if s["ratio"] == "trainer"]
    to_rollout = [s["max_rank_switch_s"] for s in switches if s["ratio"] == "rollout"]
    assert set(to_train) == {m.wake_s} and set(to_rollout) == {m.colocated_sync_s + m.wake_s}
    assert res.summary["held_across_sync"] == 0  # nothing in flight across a sync
    async_run = simulate(plan(small(), 32, mode="async"))
    assert async_run.summary["held_across_sync"] > 0  # the async baseline keeps partial rollout


def test_agent_workloads_have_turns_and_tool_time():
    res = simulate(plan(small("apps_coding.yaml", 4), 32))
    assert res.summary["steps"] == 4 and res.summary["samples"]["lost"] == 0


def test_the_allocator_moves_replica_groups_in_simulation():
    # 64 GPUs of Qwen3-8B with the trainer far slower than the profile: the run is
    # trainer-bound at 48:16, and the allocator gives the trainer whole 4-GPU groups.
    cfg = small("apps_coding.yaml", 40, "scheduler.cooldown_steps=2", "scheduler.window_steps=3")
    res = sim_cluster.SimCluster(
        plan(cfg, 64).cfg, model(train_tok_s=300.0), PROFILES.workload("apps_agent")
    ).run()
    ratios = [p[2] for p in res.placements]
    assert ratios[0] == "48:16" and len(ratios) > 1
    assert all(int(r.split(":")[1]) % 4 == 0 for r in ratios)  # whole trainer groups
    assert int(ratios[-1].split(":")[1]) > 16
    decisions = [m["placement"] for m in res.metrics if "placement" in m]
    assert any(d["applied"] for d in decisions)
    assert res.summary["samples"]["lost"] == 0


def test_bad_inputs_are_one_line_errors(tmp_path):
    with pytest.raises(RecipeError, match="--gpus 30: not a multiple"):
        plan(small(), 30)
    with pytest.raises(ProfileError, match="no model 'qwen3-99b'"):
        plan(small(), 32, model="qwen3-99b")
    bad = tmp_path / "p.yaml"
    bad.write_text("models: {m: {params_b: 1}}\nworkloads: {}\n")
    with pytest.raises(ProfileError, match=r"p\.yaml: m: missing \['kv_bytes_per_token'"):
        load_profiles(bad)


def test_a_mode_is_checked_like_the_recipes_own():
    with pytest.raises(RecipeError) as info:
        plan(small(), 32, mode="bogus_mode")
    assert str(info.value) == (
        "--mode bogus_mode: reflow.mode: 'bogus_mode' is not one of: "
        "colocated_sync, disaggregated_sync, one_step_off, async, reflow"
    )
    # the sigma each mode gets is the recipe rules' too: 0 outside reflow, its default in it
    assert plan(small(), 32, mode="disaggregated_sync").cfg.reflow.sigma == 0.0
    synced = small(
        "dapo_math.yaml",
        6,
        "reflow.mode=disaggregated_sync",
        "reflow.sigma=0",
        "scheduler.auto_rebalance=false",
    )
    assert plan(synced, 32, mode="reflow").cfg.reflow.sigma == 0.5


def test_a_bad_mode_on_the_command_line_is_refused_before_anything_runs():
    from tests.helpers import reflow

    recipe = str(REPO / "recipes" / "dapo_math.yaml")
    allowed = (
        "reflow.mode: 'bogus' is not one of: "
        "colocated_sync, disaggregated_sync, one_step_off, async, reflow"
    )
    sim = reflow(
        "simulate", recipe, "--gpus", "32", "--mode", "disaggregated_sync", "--mode", "bogus"
    )
    assert sim.returncode == 2 and sim.stdout == ""  # not after simulating disaggregated_sync
    assert sim.stderr.strip().splitlines() == [f"reflow: --mode bogus: {allowed}"]
    # the same line a recipe's or an override's mode gets, in simulate as in launch
    for command in (["simulate", recipe, "--gpus", "32"], ["launch", recipe, "--dry-run"]):
        done = reflow(*command, "--set", "reflow.mode=bogus")
        assert done.returncode == 2
        assert done.stderr.strip().splitlines() == [
            f"reflow: {recipe} (--set reflow.mode=bogus): {allowed}"
        ]


def test_reflow_simulate_on_the_command_line():
    from tests.helpers import reflow

    recipe = str(REPO / "recipes" / "dapo_math.yaml")
    done = reflow(
        "simulate",
        recipe,
        "--gpus",
        "32",
        "--steps",
        "4",
        "--set",
        "train.sync_every=2",
        "--warmup-steps",
        "2",
        "--measure-steps",
        "2",
        "--mode",
        "disaggregated_sync",
        "--mode",
        "reflow",
        "--json",
        check=True,
    )
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["mode"] for r in rows] == ["disaggregated_sync", "reflow"]
    assert all(r["steps"] == 4 and r["model"] == "qwen3-8b" and r["lost"] == 0 for r in rows)
    assert "trainer_idle_by_cause" in rows[0] and "rollout_idle_by_cause" in rows[0]
    sets = ["--set", "train.sync_every=1", "--warmup-steps", "1", "--measure-steps", "1"]
    table = reflow("simulate", recipe, "--gpus", "32", "--steps", "2", *sets, check=True).stdout
    assert "qwen3-8b, math, 32 GPUs" in table and "X/X*" in table
    # too short for the protocol (5 + 5 iterations of 2 steps): refused before it runs
    short = reflow(
        "simulate", recipe, "--gpus", "32", "--steps", "4", "--set", "train.sync_every=2"
    )
    assert short.returncode == 2 and short.stdout == ""
    assert "train.steps: 4 is fewer than the protocol's 20" in short.stderr
    bad = reflow("simulate", recipe, "--gpus", "20")
    assert bad.returncode == 2 and "--gpus 20: not a multiple" in bad.stderr


def test_a_simulation_that_stops_making_progress_says_so():
    sim = sim_cluster.SimCluster(
        plan(small(), 32).cfg,
        PROFILES.model("qwen3-8b"),
        PROFILES.workload("math"),
        stall_s=3600.0,
    )
    sim.pool._turn_finished = lambda leader, sid: None  # every finished sample is lost
    with pytest.raises(sim_cluster.SimStalled, match=r"^no training step for \d+ simulated s"):
        sim.run()


# --- ReTool (tool-interactive math): the profile's figures, ../shared/notes/cluster-profile.md


def test_the_retool_workload_draws_the_cluster_profiles_figures():
    import dataclasses
    import random
    import statistics

    w = PROFILES.workload("retool")
    rng = random.Random(11)
    # "ReTool tool calls per trajectory: mean 3.5, 1-8"
    calls = [w.episode_turns(rng) - 1 for _ in range(20000)]
    assert statistics.fmean(calls) == pytest.approx(3.5, abs=0.05)
    assert min(calls) == 1 and max(calls) == 8
    # "ReTool sandbox latency per call: median 0.3 s, log-normal tail, timeout 30 s", and a
    # mean per call of 1.61 s per trajectory over its 3.5 calls
    seconds = [w.tool_s(rng) for _ in range(20000)]
    assert statistics.median(seconds) == pytest.approx(0.3, abs=0.01)
    assert statistics.fmean(seconds) == pytest.approx(1.61 / 3.5, rel=0.06)
    assert max(seconds) <= 30.0
    slow = dataclasses.replace(w, tool_s_median=29.0)
    assert max(slow.tool_s(rng) for _ in range(200)) == 30.0  # cut at the timeout
    # responses: mean 2,707 at the start (0.85% at the 16,384 cap), 4,700 at the end
    for progress, mean in ((0.0, 2707), (1.0, 4700)):
        lengths = [w.lengths.draw(rng, progress) for _ in range(40000)]
        assert statistics.fmean(lengths) == pytest.approx(mean, rel=0.03)
        assert max(lengths) == 16384
    start = [w.lengths.draw(rng, 0.0) for _ in range(40000)]
    assert sum(n == 16384 for n in start) / len(start) == pytest.approx(0.0085, abs=0.003)


def test_workloads_with_a_fixed_number_of_turns_draw_nothing_for_them():
    import random

    # the APPS agent's random stream is the one it had before calls were drawn
    rng = random.Random(5)
    state = rng.getstate()
    assert PROFILES.workload("apps_agent").episode_turns(rng) == 3
    assert PROFILES.workload("math").episode_turns(rng) == 1
    assert rng.getstate() == state


def test_a_retool_simulation_at_16_gpus_completes_with_nothing_lost():
    sim_plan = plan(small("retool.yaml", 8), 16)
    assert sim_plan.workload == "retool"  # from workload.kind tool_reasoning
    sim = sim_cluster.SimCluster(
        sim_plan.cfg, PROFILES.model("qwen3-8b"), PROFILES.workload("retool"), seed=2
    )
    res = sim.run()
    assert res.summary["state"] == "COMPLETED" and res.summary["steps"] == 8
    samples = res.summary["samples"]
    assert samples["lost"] == 0 and samples["duplicated"] == 0
    # the rollout side made the tool calls mid-generation, as many and as long as profiled
    pool = sim.pool
    assert pool.episodes_done >= 8 * 16 * 16
    assert pool.episode_tool_calls / pool.episodes_done == pytest.approx(3.5, abs=0.2)
    assert pool.tool_s_total / pool.tool_calls == pytest.approx(1.61 / 3.5, rel=0.15)


def test_the_retool_recipe_simulates_without_a_workload_option():
    from tests.helpers import reflow

    recipe = str(REPO / "recipes" / "retool.yaml")
    protocol = ["--warmup-steps", "2", "--measure-steps", "2", "--set", "train.sync_every=2"]
    done = reflow(
        "simulate", recipe, "--gpus", "16", "--steps", "4", *protocol, "--json", check=True
    )
    (row,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert row["workload"] == "retool" and row["model"] == "qwen3-8b" and row["gpus"] == 16
    assert row["steps"] == 4 and row["lost"] == 0


def test_a_tool_call_law_outside_its_turns_is_a_one_line_error(tmp_path):
    import yaml

    raw = yaml.safe_load((REPO / "runtime" / "sim" / "profiles.yaml").read_text())
    raw["workloads"]["retool"]["tool_calls_mean"] = 9.5  # more calls than 9 turns allow
    bad = tmp_path / "p.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError) as info:
        load_profiles(bad)
    assert str(info.value) == (
        f"{bad}: retool.tool_calls_mean: expected tool_calls_min..turns - 1 = 1..8, got 9.5"
    )
