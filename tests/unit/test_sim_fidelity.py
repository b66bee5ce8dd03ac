"""The simulator's engine models against the mechanisms of real clusters that its first
version left out (docs/simulator.md, "What each simulated mechanism is"): prefix caching
across the turns of an episode, prefill as busy time (not a weight-sync pause), the
trainer's old-policy log-prob pass, a decode cost that grows with the context, the
tensor-parallel all-reduces, and a role switch made of its phases. One test per mechanism;
each failed on the simulator before the mechanism was modelled."""

import dataclasses

import pytest

from runtime.config.recipe import load_recipe
from runtime.control.idle import IdleBook
from runtime.sim import cluster as sim_cluster
from runtime.sim.parameters import ModelProfile, load_profiles
from runtime.sim.replica import RolloutReplica
from runtime.sim.run import plan
from tests.helpers import REPO

PROFILES = load_profiles()


def model(name: str = "qwen3-8b", **kw) -> ModelProfile:
    return dataclasses.replace(PROFILES.model(name), **kw)


def small(recipe: str = "dapo_math.yaml", steps: int = 6, *sets: str):
    sets = (f"train.steps={steps}", "train.sync_every=2", *sets)
    return load_recipe(REPO / "recipes" / recipe, list(sets))


def run_out(r: RolloutReplica) -> list[int]:
    """Every event until the replica has nothing left; the finished ids in order."""
    done: list[int] = []
    while r.running or r.waiting:
        done += r.on_event(r.next_event())
    return done


# --- 1. prefix caching across the turns of an episode ---------------------------------


def test_a_later_turn_prefills_only_what_its_cached_prefix_lacks():
    # 100 prompt tokens per second of prefill: the seconds show how much was prefilled
    m = model(step_base_s=0.01, step_per_ctx_token_s=0.0, prefill_tok_s=100.0, kv_tokens=10**6)
    r = RolloutReplica(m, block=1, max_seqs=8, prefix_cache=True)
    r.submit(1, 100, 50)  # turn 1: a 100-token prompt, 50 generated
    r.on_event(0.0)
    assert r.prefill_s == pytest.approx(1.0)
    assert run_out(r) == [1]
    # turn 2 after a tool call: its context is the prompt, turn 1 and a 20-token output
    r.submit(1, 100 + 50 + 20, 50)
    r.on_event(r.t + 2.0)
    assert r.prefill_s == pytest.approx(1.0 + 0.2)  # only the tool output
    assert r.cached_blocks == 150 and r.prefilled_blocks == 120
    assert run_out(r) == [1]


def test_a_turn_whose_cached_context_was_evicted_pays_for_it_again():
    m = model(step_base_s=0.01, step_per_ctx_token_s=0.0, prefill_tok_s=100.0, kv_tokens=400)
    r = RolloutReplica(m, block=1, max_seqs=8, prefix_cache=True)
    r.submit(1, 100, 50)
    r.on_event(0.0)
    run_out(r)  # 150 blocks freed into the cache
    # while episode 1 waits in a tool call, another sequence needs 100 + 250 blocks: the
    # cache gives up 100 of episode 1's (the tail: 50 of its prefix stay)
    r.submit(2, 100, 250)
    r.on_event(r.t)
    run_out(r)
    before = r.prefill_s
    r.submit(1, 150, 10)
    r.on_event(r.t)
    hit = r.cached_blocks
    assert 0 < hit < 150 and r.prefill_s - before == pytest.approx((150 - hit) / 100.0)
    # a single-turn replica keeps no cache: every prompt is prefilled in full
    plain = RolloutReplica(m, block=1, max_seqs=8)
    plain.submit(1, 100, 50)
    plain.on_event(0.0)
    run_out(plain)
    plain.submit(1, 150, 10)
    plain.on_event(plain.t)
    assert plain.cached_blocks == 0 and plain.prefilled_blocks == 250


def test_agent_episodes_reuse_their_context_and_tool_outputs_are_prefilled():
    cfg = plan(small("apps_coding.yaml", 4), 32).cfg
    workload = dataclasses.replace(PROFILES.workload("apps_agent"), tool_output_tokens=160)
    sim = sim_cluster.SimCluster(cfg, PROFILES.model("qwen3-8b"), workload)
    res = sim.run()
    assert res.summary["samples"]["lost"] == 0
    replicas = list(sim.pool.replicas.values())
    cached = sum(r.cached_blocks for r in replicas)
    prefilled = sum(r.prefilled_blocks for r in replicas)
    # turns 2 and 3 of every episode find most of their context cached
    assert cached > prefilled > 0


# --- 2. prefill is busy time, booked by name, never a weight-sync pause ---------------


def test_prefill_is_busy_time_and_not_a_weight_sync_pause():
    m = model(step_base_s=0.01, step_per_ctx_token_s=0.0, prefill_tok_s=100.0, kv_tokens=10**6)
    r = RolloutReplica(m, block=1, max_seqs=8)
    r.submit(1, 100, 50)
    r.on_event(0.0)
    r.advance(1.0)  # the whole prefill
    assert r.busy_s == pytest.approx(1.0) and r.prefill_s == pytest.approx(1.0)
    assert r.paused_s == 0.0
    r.stall(1.0, 2.0)  # a weight sync is a pause
    r.advance(3.0)
    assert r.paused_s == pytest.approx(2.0) and r.prefill_s == pytest.approx(1.0)
    assert r.stats()["prefill_s"] == pytest.approx(1.0)  # what the heartbeat carries
    # the idle book: a beat's prefill seconds are busy, by name; the pause is the sync's
    book = IdleBook()
    book.rank_beat(1, 0.0, 0.0, 0.0, 0.0, holding=True, prefill_s=0.0)
    book.rank_beat(1, 10.0, 10.0, 6.0, 2.0, holding=True, prefill_s=1.0)
    assert book.rollout["weight_sync"] == pytest.approx(2.0)
    assert book.rollout_busy["prefill"] == pytest.approx(1.0)
    assert "prefill" not in book.rollout  # not idle
    report = book.report(10.0, None)
    assert report["rollout_busy_by_cause"] == {"prefill": 0.1}


def test_a_simulated_run_pauses_rollout_only_for_its_weight_syncs():
    sim = sim_cluster.SimCluster(
        plan(small("apps_coding.yaml", 4), 16, mode="async").cfg,
        PROFILES.model("qwen3-8b"),
        PROFILES.workload("apps_agent"),
    )
    syncs: list[int] = []
    on_sync = sim.pool.on_weight_sync

    def counted(rank: int, version: int) -> None:
        syncs.append(rank)
        on_sync(rank, version)

    sim.pool.on_weight_sync = counted
    res = sim.run()
    assert res.summary["state"] == "COMPLETED" and syncs
    sync_s = PROFILES.model("qwen3-8b").weight_sync_s
    # a rank is paused at most the sync time per sync it received: prefill is not a pause
    assert sum(sim.pool.rollout_paused) <= len(syncs) * sync_s * 1.0001
    assert sum(sim.pool.rollout_prefill) > 0
    # and rank 0 books it by name, from the heartbeats' engine stats
    assert res.summary["rollout_busy_by_cause"]["prefill"] > 0


# --- 3. the trainer's old-policy log-prob pass ----------------------------------------


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_trainer_step_grows_with_the_log_prob_fraction(fraction):
    m = model(logprob_fraction=fraction)
    on = small("dapo_math.yaml", 4, "algorithm.recompute_old_logprobs=true")
    res = sim_cluster.SimCluster(plan(on, 32).cfg, m, PROFILES.workload("math")).run()
    # trainer GPU-seconds per trained token: the update, and the pass before it
    per_token = res.trainer_gpu_busy_s / res.trained_tokens
    assert per_token == pytest.approx((1 + fraction) / m.train_tok_s)
    # a recipe that does not recompute them does not pay for the pass
    off = sim_cluster.SimCluster(plan(small(steps=4), 32).cfg, m, PROFILES.workload("math")).run()
    assert off.trainer_gpu_busy_s / off.trained_tokens == pytest.approx(1 / m.train_tok_s)


def test_the_profiles_log_prob_fraction_is_inside_the_published_range():
    for m in PROFILES.models.values():
        assert 0.24 <= m.logprob_fraction <= 0.53  # cluster profile sec. 5


# --- 4. decode cost that grows with the context ---------------------------------------


def test_decode_slows_with_a_longer_context_at_the_computed_time():
    a, k = 0.01, 1e-5
    m = model(step_base_s=a, step_per_seq_s=0.0, step_per_ctx_token_s=k, prefill_tok_s=1e12)
    times = {}
    for prompt in (100, 8000):
        r = RolloutReplica(m, block=1, max_seqs=8)
        r.submit(1, prompt, 1000)
        r.on_event(0.0)
        times[prompt] = r.next_event()
        # every step reads the whole context, which grows by a token a step
        assert times[prompt] == pytest.approx(1000 * (a + k * prompt) + k * 1000**2 / 2)
        assert r.on_event(times[prompt]) == [1]
    assert times[8000] > times[100]
    # advancing part way and then on lands at the same finish (the integral is exact)
    r = RolloutReplica(m, block=1, max_seqs=8)
    r.submit(1, 100, 1000)
    r.on_event(0.0)
    r.advance(times[100] / 3)
    assert r.next_event() == pytest.approx(times[100])


def test_the_context_cost_is_the_former_per_sequence_cost_at_4k_tokens():
    # the former fixed figures: the KV read of a 4k-token context at 60% of HBM bandwidth
    former = {"qwen3-4b": 0.00029, "qwen3-8b": 0.00029, "qwen3-14b": 0.00016, "qwen3-32b": 0.00013}
    for name, per_seq in former.items():
        m = PROFILES.model(name)
        tp = m.rollout_gpus_per_replica
        assert m.step_per_ctx_token_s == pytest.approx(
            m.kv_bytes_per_token / tp / (3.35e12 * 0.6), rel=0.01
        )
        assert m.step_per_seq_s + 4000 * m.step_per_ctx_token_s == pytest.approx(per_seq, rel=0.02)


# --- 5. tensor-parallel all-reduces ---------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3-14b", "qwen3-32b"])
def test_tensor_parallel_replicas_pay_their_all_reduces(name):
    m = PROFILES.model(name)
    assert m.rollout_gpus_per_replica > 1 and m.tp_step_s > 0 and m.tp_per_seq_s > 0
    no_tp = dataclasses.replace(m, tp_step_s=0.0, tp_per_seq_s=0.0)
    steps = []
    for profile in (m, no_tp):
        r = RolloutReplica(profile, block=16, max_seqs=64)
        for i in range(64):
            r.submit(i, 50, 100)
        r.on_event(0.0)
        steps.append(r.step_s())
    assert steps[0] - steps[1] == pytest.approx(m.tp_step_s + 64 * m.tp_per_seq_s)
    for tp1 in ("qwen3-4b", "qwen3-8b"):  # one GPU per replica: no all-reduce
        assert PROFILES.model(tp1).tp_step_s == PROFILES.model(tp1).tp_per_seq_s == 0.0


# --- 6. a role switch is the sum of its phases ----------------------------------------


def test_a_role_switch_takes_the_sum_of_its_parts():
    m = PROFILES.model("qwen3-8b")
    assert m.switch_s is None
    state_gb = m.params_b * m.trainer_state_bytes_per_param / m.trainer_gpus_per_replica
    weights_gb = 2 * m.params_b / m.rollout_gpus_per_replica
    # a sharded trainer's leaving rank frees its shards: no copy to the host
    assert m.trainer_gpus_per_replica > 1
    to_rollout = m.wake_s + m.regroup_s + m.weight_sync_s
    to_trainer = (
        weights_gb / m.offload_gb_s
        + state_gb / m.offload_gb_s
        + m.regroup_s
        + state_gb / m.state_transfer_gb_s
    )
    sim = sim_cluster.SimCluster(plan(small(), 32).cfg, m, PROFILES.workload("math"))
    sim._roles_before = ["trainer", "rollout", "rollout"]
    roles = ["rollout", "trainer", "rollout"]
    seconds, phases = sim._switch_s(0, roles)
    assert seconds == pytest.approx(to_rollout) and sum(phases.values()) == seconds
    assert sim._switch_s(1, roles)[0] == pytest.approx(to_trainer)
    assert sim._switch_s(2, roles) == (m.regroup_s, {"regroup": m.regroup_s})  # kept its role
    # a replicated trainer (one GPU per replica) copies its whole state to the host
    whole = dataclasses.replace(m, trainer_gpus_per_replica=1)
    sim = sim_cluster.SimCluster(plan(small(), 32).cfg, whole, PROFILES.workload("math"))
    sim._roles_before = ["trainer", "rollout", "rollout"]
    offload = sim._switch_s(0, roles)[1]["offload"]
    assert offload == pytest.approx(m.params_b * m.trainer_state_bytes_per_param / m.offload_gb_s)
    # in a run, the allocator's switches report those phases to rank 0
    cfg = small("apps_coding.yaml", 12, "scheduler.cooldown_steps=2", "scheduler.window_steps=3")
    slow = dataclasses.replace(m, train_tok_s=300.0)  # trainer-bound: rollout ranks move
    res = sim_cluster.SimCluster(plan(cfg, 64).cfg, slow, PROFILES.workload("apps_agent")).run()
    switches = [s for s in res.summary["switches"] if s["applied"]]
    assert switches
    for s in switches:
        assert s["max_rank_switch_s"] == pytest.approx(to_trainer, rel=1e-3)
        assert set(s["phases_max_s"]) == {"offload", "wake", "regroup", "state_transfer"}


def test_a_profile_without_switch_s_needs_every_part():
    with pytest.raises(ValueError, match=r"missing \['offload_gb_s'\]"):
        model(offload_gb_s=None)
    # a given switch_s (a fitted CPU run's) is used as it is
    assert model(switch_s=3.0).switch_s == 3.0


# --- 7. a mixture of experts' profile --------------------------------------------------


def test_the_moe_profile_takes_total_parameters_for_bytes_and_active_for_flops():
    """qwen3-30b-a3b's derived figures from the shape runtime/config/architectures.py
    counts (memory, syncs and switches: all experts; FLOPs: the 8 routed per token)."""
    from runtime.config.architectures import KNOWN

    m, shape = PROFILES.model("qwen3-30b-a3b"), KNOWN["qwen3-30b-a3b"]
    total, active = shape.total_params, shape.active_params
    assert m.params_b == pytest.approx(total / 1e9, rel=0.01)
    assert m.kv_bytes_per_token == shape.layers * shape.kv_width * 2 * 2
    tp, flops = m.rollout_gpus_per_replica, 989e12 * 0.35
    assert m.prefill_tok_s == pytest.approx(tp * flops / (2 * active), rel=0.02)
    assert m.train_tok_s == pytest.approx(flops / (8 * active), rel=0.02)
    # a decode step reads every expert's weights (bf16), split over the TP ranks
    assert m.step_base_s == pytest.approx(2 * total / tp / (3.35e12 * 0.6), rel=0.02)
    assert m.kv_tokens == pytest.approx(
        tp * (72e9 - 2 * total / tp) / m.kv_bytes_per_token, rel=0.02
    )
