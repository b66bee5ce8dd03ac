"""Property tests of the replay data cycle over random event sequences."""

import itertools
import math
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.config.recipe import build_config
from runtime.control.data_plane import DataPlane
from runtime.control.replay_buffer import ReplayBuffer
from runtime.control.samplers import MediumRewardSampler, PluginError, make_sampler
from runtime.data.sample import Sample


def traj(req, version, worker=1, reward=None, spans=1, rng=None):
    rng = rng or random.Random(req.sample_id)
    n = rng.randint(1, 20)
    cut = n // 2
    versions = [(version, 0, n)] if spans == 1 else [(version - 1, 0, cut), (version, cut, n)]
    return Sample(
        sample_id=req.sample_id,
        group_id=req.group_id,
        prompt_id=req.prompt_id,
        versions=versions,
        token_ids=list(range(n)),
        logprobs=[-1.0] * n,
        reward=float(rng.random() < 0.5) if reward is None else reward,
        n_valid=n,
        worker=worker,
    )


def prompts():
    for i in itertools.count():
        yield {"text": f"p{i}"}


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    b=st.integers(1, 24),
    n=st.integers(1, 6),
    sigma=st.sampled_from([0.0, 0.25, 0.5, 0.75]),
    tau=st.sampled_from([0.5, 1.0]),
    delta=st.integers(0, 3),
    bmax_factor=st.sampled_from([0.5, 1.0, 2.0]),
    events=st.integers(50, 400),
)
def test_random_event_sequences_keep_every_invariant(
    seed, b, n, sigma, tau, delta, bmax_factor, events
):
    run_events(seed, b, n, sigma, tau, delta, bmax_factor, events)


def test_the_event_driver_really_trains_and_replays():
    batches, dp = run_events(1, 8, 2, 0.5, 0.5, 1, 1.0, 2000)
    assert len(batches) > 20
    assert sum(batch.n_replay for batch in batches) > 0
    assert dp.buffer.transitions["consumed->replayed"] > 0
    assert dp.ledger()["evicted"] > 0
    held = dp.dispatcher.transitions
    assert held["running->held"] == held["held->running"] > 0  # partial rollouts happened


def run_events(seed, b, n, sigma, tau, delta, bmax_factor, events):
    rng = random.Random(seed)
    mode = "reflow" if sigma > 0 else "async"
    cfg = build_config(
        {
            "train": {"batch_size": b, "steps": 10**6},
            "algorithm": {"group_size": n},
            "reflow": {
                "mode": mode,
                "sigma": sigma,
                "tau": tau,
                "delta": delta,
                "B_max": max(1, int(b * bmax_factor)),
            },
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    running = {}  # sample_id -> (request, worker, version when started)
    ghosts = []  # requests a departed worker may still report late (its outbox)
    duplicates = resent = stale = 0
    batches = []
    in_training = None
    for _ in range(events):
        clock.t += rng.random()
        e = rng.random()
        if e < 0.35:
            worker = rng.randint(1, 3)
            for req in dp.request_work(worker, rng.randint(1, 8)):
                running[req.sample_id] = (req, worker, dp.policy_version)
        elif e < 0.7 and running:
            sid = rng.choice(sorted(running))
            req, worker, started = running.pop(sid)
            # A partial rollout: started before a weight sync, finished after it.
            spans = 2 if started < dp.policy_version and rng.random() < 0.5 else 1
            version = started + 1 if spans == 2 else started
            assert dp.deliver(traj(req, version, worker, spans=spans, rng=rng))
            if rng.random() < 0.05:  # sent again (its ack was lost): rejected, not counted
                assert not dp.deliver(traj(req, version, worker, rng=rng))
                resent += 1
        elif e < 0.75 and ghosts:
            # A late result from a worker that lost this request in a role switch: it was
            # requeued (and maybe re-dispatched, maybe delivered by its new owner), so it is
            # rejected as stale; the new owner's counts.
            req, worker, version = ghosts.pop(rng.randrange(len(ghosts)))
            owner = running.get(req.sample_id)
            if owner is None or owner[1] != worker:
                came_from = dp.delivered_ids.get(req.sample_id)
                assert not dp.deliver(traj(req, version, worker, rng=rng))
                stale += came_from != worker
                resent += came_from == worker
        elif e < 0.77 and (held := list(dp.buffer.samples())):
            # valid-shaped nonsense: worker 4, never handed anything, sends a delivered id
            forged = rng.choice(held)
            assert not dp.deliver(traj(forged, dp.policy_version, worker=4, rng=rng))
            duplicates += 1
        elif e < 0.85 and in_training is None:
            batch = dp.next_batch()
            if batch is not None:
                batches.append(batch)
                in_training = batch
                ids = [t.sample_id for t in batch.samples]
                assert len(ids) == len(set(ids)) == b
                assert batch.n_unused >= math.ceil(b * (1 - sigma) - 1e-9)
                assert batch.n_replay <= b * sigma + 1e-9
                assert batch.max_age <= delta
                assert all(
                    t.is_replay == (i >= batch.n_unused) for i, t in enumerate(batch.samples)
                )
        elif e < 0.95 and in_training is not None:
            dp.finish_step(in_training.batch_id, dp.step + 1, dp.policy_version + 1)
            in_training = None
        elif running and rng.random() < 0.5:  # a rollout worker dies: its work is requeued
            worker = rng.randint(1, 3)
            lost = [s for s, (_, w, _) in running.items() if w == worker]
            assert dp.worker_gone(worker) == len(lost)
            for s in lost:
                ghosts.append(running.pop(s))
        assert len(dp.dispatcher.outstanding) <= cfg.reflow.B_max
        assert len(dp.dispatcher.outstanding) == len(running)
        per_worker = Counter(w for _, w in dp.dispatcher.outstanding.values())
        assert all(dp.dispatcher.running_at(w) == per_worker[w] for w in range(4))
        assert dp.buffer.n_waiting_for_group == sum(len(g) for g in dp.buffer._groups.values())
        assert dp.ledger_problems() == []  # the request side: handed out = back + out + in
    ledger = dp.ledger()
    assert ledger["lost"] == 0 and ledger["duplicated"] == duplicates
    assert dp.rejected["resent"] == resent
    assert dp.rejected["stale_worker"] == stale
    assert ledger["delivered"] == len(dp.delivered_ids)
    assert ledger["delivered"] == ledger["held_in_buffer"] + ledger["evicted"] + ledger["retired"]
    assert ledger["dispatched"] == ledger["delivered"] + ledger["outstanding"]
    transitions = dp.buffer.transitions
    into_pool = transitions["finished->available"] + transitions["consumed->replayed"]
    out_of_pool = (
        transitions["available->consumed"]
        + transitions["replayed->consumed"]
        + transitions["available->evicted"]
        + transitions["replayed->evicted"]
    )
    assert into_pool - out_of_pool == len(dp.buffer.unused) + len(dp.buffer.replay)
    if sigma == 0:
        assert all(batch.n_replay == 0 for batch in batches)
    return batches, dp


def test_batch_waits_until_the_unused_minimum_is_met():
    buf = ReplayBuffer(batch_size=4, sigma=0.5, delta=1, group_size=1)

    class R:
        def __init__(self, i):
            self.sample_id, self.group_id, self.prompt_id = i, i, i

    for i in range(3):
        buf.add(traj(R(i), 0))
    assert buf.sample_batch(0) is None  # 3 unused, no replay: cannot make 4
    buf.add(traj(R(3), 0))
    first = buf.sample_batch(0)
    assert first is not None and (first.n_unused, first.n_replay) == (4, 0)
    buf.replay_filter = type("Keep", (), {"keep": lambda self, t: True})()
    buf.complete_batch(first.batch_id)
    assert len(buf.replay) == 4
    buf.add(traj(R(4), 1))
    assert buf.sample_batch(1) is None  # 1 unused < ceil(4 * 0.5)
    buf.add(traj(R(5), 1))
    second = buf.sample_batch(1)
    assert (second.n_unused, second.n_replay) == (2, 2)
    assert buf.sample_batch(3) is None
    assert buf.evicted == {"stale_replay": 2}  # version 0 samples are 3 versions old


def test_groups_become_available_together_with_normalised_advantages():
    buf = ReplayBuffer(batch_size=2, sigma=0.0, delta=1, group_size=4)

    class R:
        def __init__(self, i):
            self.sample_id, self.group_id, self.prompt_id = i, 7, 7

    rewards = [1.0, 0.0, 0.0, 1.0]
    for i, r in enumerate(rewards[:3]):
        buf.add(traj(R(i), 0, reward=r))
        assert not buf.unused
    buf.add(traj(R(3), 0, reward=rewards[3]))
    advs = [buf.unused[i].advantage for i in range(4)]
    assert advs == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    with pytest.raises(ValueError, match="delivered twice"):
        buf.add(traj(R(3), 0))


def test_medium_reward_sampler_rejects_uniform_groups():
    buf = ReplayBuffer(
        batch_size=2, sigma=0.0, delta=1, group_size=2, sampler=MediumRewardSampler()
    )

    class R:
        def __init__(self, i, g):
            self.sample_id, self.group_id, self.prompt_id = i, g, g

    buf.add(traj(R(0, 0), 0, reward=1.0))
    buf.add(traj(R(1, 0), 0, reward=1.0))
    buf.add(traj(R(2, 1), 0, reward=1.0))
    buf.add(traj(R(3, 1), 0, reward=0.0))
    assert sorted(buf.unused) == [2, 3]
    assert buf.evicted == {"sampler_rejected": 2}


def test_samplers_by_name_and_dotted_path():
    assert type(make_sampler("random")).__name__ == "RandomSampler"
    assert type(make_sampler("runtime.control.samplers:MediumRewardSampler")) is MediumRewardSampler
    assert type(make_sampler("runtime.control.samplers.MediumRewardSampler")) is MediumRewardSampler
    with pytest.raises(PluginError, match="cannot be imported"):
        make_sampler("nope.module:Thing")
    with pytest.raises(PluginError, match="lacks method"):
        make_sampler("runtime.control.samplers:AcceptAll")


def test_staleness_admission_stops_work_that_would_be_evicted():
    cfg = build_config(
        {
            "train": {"batch_size": 4},
            "algorithm": {"group_size": 1},
            "reflow": {"delta": 0, "B_max": 100, "mode": "async"},
        }
    )
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), Clock())
    got = dp.request_work(1, 100)
    assert len(got) == 4  # fresh_per_step=4, delta=0: at most 4 can be consumed in time
    assert dp.dispatcher.blocked["staleness"] == 1


def _fill(dp, clock, reqs, version):
    for r in reqs:
        clock.t += 0.1
        assert dp.deliver(traj(r, version, reward=float(r.sample_id % 2)))


@pytest.mark.parametrize("mode", ["colocated_sync", "disaggregated_sync", "one_step_off", "async"])
def test_execution_modes_gate_generation(mode):
    cfg = build_config(
        {
            "train": {"batch_size": 4},
            "algorithm": {"group_size": 2},
            "reflow": {"mode": mode, "B_max": 100, "delta": 1},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    first = dp.request_work(1, 100)
    if mode == "async":
        assert len(first) == 8  # bounded only by staleness admission: (delta + 1) * b
        return
    # one batch at a time (sync_every 1), one_step_off the next one too
    assert len(first) == (8 if mode == "one_step_off" else 4)
    assert dp.request_work(1, 100) == []
    _fill(dp, clock, first, 0)
    batch = dp.next_batch()
    assert batch is not None and batch.n_unused == 4
    during = dp.request_work(1, 100)
    assert during == []  # one_step_off's next batch is generated; the sync modes wait
    dp.finish_step(batch.batch_id, 1, 1)
    after = dp.request_work(1, 100)
    # one_step_off: the batch after next, while the next one trains
    assert len(after) == 4


@pytest.mark.parametrize("mode", ["disaggregated_sync", "one_step_off"])
def test_a_disaggregated_baselines_step_is_one_weight_publication(mode):
    # sync_every 4, as verl counts a step: disaggregated sync generates the interval's 4
    # batches at once and waits while they train; one-step-off generates the next
    # interval's during them. Before, both generated one trainer step's batch at a time,
    # which at the DAPO sizing left a 128-GPU rollout side 78% idle.
    cfg = build_config(
        {
            "train": {"batch_size": 4, "sync_every": 4, "steps": 12},
            "algorithm": {"group_size": 2},
            "reflow": {"mode": mode, "B_max": 1000, "delta": 1},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    first = dp.request_work(1, 1000)
    assert len(first) == (32 if mode == "one_step_off" else 16)
    _fill(dp, clock, first, 0)
    for step in range(1, 5):
        batch = dp.next_batch()
        assert batch is not None
        assert dp.request_work(1, 1000) == []
        dp.finish_step(batch.batch_id, step, step // 4)
    # interval 1 trained: the next interval (one_step_off: the one after it) may go
    assert len(dp.request_work(1, 1000)) == 16


def test_a_colocated_rollout_phase_generates_every_batch_up_to_the_next_sync():
    # sync_every 2: the rollout phase makes both batches of the train phase, then waits
    # (the trainer then trains the two steps on every rank: runtime/control/colocation.py)
    cfg = build_config(
        {
            "train": {"batch_size": 4, "sync_every": 2, "steps": 4},
            "algorithm": {"group_size": 2},
            "reflow": {"mode": "colocated_sync", "B_max": 100, "delta": 1},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    first = dp.request_work(1, 100)
    assert len(first) == 8 and dp.request_work(1, 100) == []
    assert dp.last_refusal == "colocated_sync_barrier"
    _fill(dp, clock, first, 0)
    for step in (1, 2):
        batch = dp.next_batch()
        assert batch is not None and batch.n_unused == 4
        assert dp.request_work(1, 100) == []  # nothing while a batch trains
        dp.finish_step(batch.batch_id, step, step // 2)
    assert len(dp.request_work(1, 100)) == 8  # the next phase's two batches


@pytest.mark.parametrize("mode", ["colocated_sync", "disaggregated_sync", "one_step_off"])
def test_the_batch_barrier_never_strands_a_started_group(mode):
    # b = 4, groups of 3: the barrier admits 4 requests, i.e. a group and a third. The
    # other two members of the second group must still go out, or no batch ever forms.
    cfg = build_config(
        {
            "train": {"batch_size": 4},
            "algorithm": {"group_size": 3},
            "reflow": {"mode": mode, "B_max": 100, "delta": 2},  # staleness not binding
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    got = dp.request_work(1, 100)
    ahead = 2 if mode == "one_step_off" else 1  # batches (one_step_off: the next one too)
    assert len(got) == 4 * ahead
    rest = dp.request_work(1, 100)
    assert [r.group_id for r in rest] == [ahead * 4 // 3] * (3 - ahead * 4 % 3)
    _fill(dp, clock, got + rest, 0)
    assert dp.next_batch() is not None


def test_admission_counts_the_trainers_demand_not_the_fresh_samples_it_took():
    # Before: the bound was the EWMA of the fresh samples batches took; in reflow they
    # take fewer exactly when fewer arrive, which throttled rollout further (4 here).
    cfg = build_config(
        {
            "train": {"batch_size": 4},
            "algorithm": {"group_size": 1},
            "reflow": {"delta": 1, "B_max": 100, "mode": "reflow"},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    for step in range(1, 41):  # batches of two fresh samples (replay fills the rest)
        _fill(dp, clock, dp.request_work(1, 4 if step == 1 else 2), dp.policy_version)
        batch = dp.next_batch()
        assert batch is not None and batch.n_unused == (4 if step == 1 else 2)
        dp.finish_step(batch.batch_id, step, step)
    got = dp.request_work(1, 100)
    assert len(got) == 8  # b x (delta + 1)


def test_admission_horizon_counts_the_steps_left_before_a_version_is_too_old():
    # sync every 4 steps, delta 1: a sample of version v may be taken by the batches of
    # steps up to (v + 2) x 4. After 3 steps at version 0: 5 steps left, b = 2.
    cfg = build_config(
        {
            "train": {"batch_size": 2, "sync_every": 4, "steps": 8},
            "algorithm": {"group_size": 1},
            "reflow": {"delta": 1, "B_max": 100, "mode": "async"},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    assert len(dp.request_work(1, 100)) == 2 * 8  # fresh run: 8 steps of version 0
    dp.worker_gone(1)
    dp.step = 3
    assert len(dp.request_work(1, 100)) == 2 * 5


@pytest.mark.parametrize("delta", [0, 1, 2])
def test_admission_leaves_out_the_step_whose_batch_is_in_training(delta):
    # A batch in training was drawn already: it takes no sample admitted now. Before, the
    # horizon counted its step as one still to come, so while a batch trained rollout
    # generated b samples more than any later batch could take within delta (at delta 0
    # every one of them, reflow sigma 0 / delta 0 then evicted ~10k of 48k samples on the
    # demo and learned below disaggregated_sync). AReaL's staleness capacity,
    # (max_staleness + version + 1) x b - (accepted + running), counts that batch too.
    b = 4
    cfg = build_config(
        {
            "train": {"batch_size": b},
            "algorithm": {"group_size": 1},
            "reflow": {"delta": delta, "sigma": 0, "B_max": 100, "mode": "reflow"},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    for step in range(1, 4):
        _fill(dp, clock, dp.request_work(1, b), dp.policy_version)
        batch = dp.next_batch()
        assert batch is not None
        assert len(dp.request_work(1, 100)) == b * delta  # this version's later batches
        dp.worker_gone(1)
        dp.finish_step(batch.batch_id, step, step)
        assert len(dp.request_work(1, 100)) == b * (delta + 1)
        dp.worker_gone(1)


def test_with_sync_every_2_a_sample_first_trained_after_its_publication_is_replayed_next():
    # delta 1, a sync every 2 steps: version 1 is published by step 2. A sample of version
    # 1 first trained in step 3 is 0 versions old in step 4, and still 1 old in steps 5-6.
    # Counted per step (before), it was 1 version old in step 4 and evicted after it.
    cfg = build_config(
        {
            "train": {"batch_size": 2, "sync_every": 2, "steps": 8},
            "algorithm": {"group_size": 1},
            "reflow": {"delta": 1, "sigma": 0.5, "B_max": 100, "mode": "reflow"},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    train = cfg.train

    def step(n: int, fresh: int) -> list[int]:
        _fill(dp, clock, dp.request_work(1, fresh), dp.policy_version)
        batch = dp.next_batch()
        assert batch is not None, f"no batch at step {n}"
        dp.finish_step(batch.batch_id, n, train.version_at(n))
        return [t.sample_id for t in batch.samples[batch.n_unused :]]

    step(1, 2)
    step(2, 2)
    assert dp.policy_version == 1
    _fill(dp, clock, dp.request_work(1, 2), dp.policy_version)
    third = dp.next_batch()
    assert third is not None and third.n_unused == 2
    mine = {t.sample_id for t in third.samples}
    dp.finish_step(third.batch_id, 3, train.version_at(3))
    assert len(step(4, 1)) == 1
    # version 2 is out: the version-0 samples of steps 1-2 are gone, step 3's stay
    assert dp.policy_version == 2 and dp.buffer.evicted == {"stale_replay": 4}
    assert mine <= set(dp.buffer.replay)
    replayed = step(5, 1)  # version 1 at version 2: still within delta
    assert len(replayed) == 1 and dp.buffer.replay[replayed[0]].oldest_version == 1


def test_a_late_result_after_its_new_owner_delivered_is_stale_not_a_duplicate():
    # A rollout rank switched to training while its result was on the wire; the request
    # went to another rank, which delivered first. The ledger's `duplicated` is for a
    # sample sent by a worker never handed it (CI once counted the late one: 4 of them).
    cfg = build_config({"train": {"batch_size": 4}, "algorithm": {"group_size": 1}})
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    (req,) = dp.request_work(1, 1)
    assert dp.worker_gone(1) == 1
    (again,) = dp.request_work(2, 1)
    assert again.sample_id == req.sample_id
    assert dp.deliver(traj(again, 0, worker=2))
    assert not dp.deliver(traj(req, 0, worker=1))
    assert not dp.deliver(traj(req, 0, worker=3))
    assert dp.rejected == {"stale_worker": 1, "duplicate": 1}
    assert dp.ledger()["duplicated"] == 1


def test_disaggregated_sync_finishes_its_interval_while_the_first_batches_train():
    # slots for one batch at a time: the interval's other batches are generated while the
    # first ones train (before, rollout was refused during every trainer step, which made
    # the baseline slower than its definition: 21-27% in a toy run)
    cfg = build_config(
        {
            "train": {"batch_size": 4, "sync_every": 4, "steps": 8},
            "algorithm": {"group_size": 2},
            "reflow": {"mode": "disaggregated_sync", "B_max": 1000, "delta": 1},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    _fill(dp, clock, dp.request_work(1, 4), 0)
    batch = dp.next_batch()
    assert batch is not None
    assert len(dp.request_work(1, 4)) == 4  # the interval's next batch, during step 1
    assert len(dp.request_work(1, 100)) == 8  # and the rest of the interval, no more
    assert dp.request_work(1, 100) == []


def test_a_started_group_is_never_refused_its_rest_by_staleness():
    # b = 6, groups of 4, delta 0: admission lets 6 out (a group and a half). Before, the
    # other half of the second group was refused forever (what staleness counts ahead
    # holds its first half), and no batch could ever form.
    cfg = build_config(
        {
            "train": {"batch_size": 6},
            "algorithm": {"group_size": 4},
            "reflow": {"mode": "async", "delta": 0, "B_max": 100},
        }
    )
    clock = Clock()
    dp = DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts(), clock)
    got = dp.request_work(1, 100)
    assert len(got) == 8 and {r.group_id for r in got} == {0, 1}
    _fill(dp, clock, got, 0)
    assert dp.next_batch() is not None


class _Req:
    def __init__(self, i):
        self.sample_id, self.group_id, self.prompt_id = i, i, i


def test_fresh_samples_are_taken_oldest_version_first():
    # Before, a uniform pick among 40 unused samples left older ones to expire while it
    # trained newer ones (math 32B/32: 20.4% of deliveries evicted unused).
    buf = ReplayBuffer(batch_size=4, sigma=0.0, delta=1, group_size=1, seed=3)
    for i in range(40):
        buf.add(traj(_Req(i), version=0 if i >= 36 else 1))  # the last 4 are the oldest
    batch = buf.sample_batch(current_version=1)
    assert batch is not None
    assert sorted(t.sample_id for t in batch.samples) == [36, 37, 38, 39]
    # within a version, arrival order
    batch = buf.sample_batch(current_version=1)
    assert [t.sample_id for t in batch.samples] == [0, 1, 2, 3]
    # the sampler's own choice on request
    rnd = ReplayBuffer(batch_size=4, sigma=0.0, delta=1, group_size=1, fresh_order="sampler")
    for i in range(40):
        rnd.add(traj(_Req(i), version=1))
    assert [t.sample_id for t in rnd.sample_batch(1).samples] != [0, 1, 2, 3]


def test_a_partial_rollouts_age_may_count_from_its_newest_span():
    # spans of versions 0 and 1, trained at version 2 with delta 1: too old by its oldest
    # span (today's rule), in time by its newest
    def held(age_from):
        buf = ReplayBuffer(batch_size=1, sigma=0.0, delta=1, group_size=1, age_from=age_from)
        buf.add(traj(_Req(7), version=1, spans=2))
        return buf.sample_batch(current_version=2)

    assert held("oldest_span") is None
    assert held("newest_span") is not None
    with pytest.raises(ValueError, match="age_from"):
        ReplayBuffer(batch_size=1, sigma=0.0, delta=1, group_size=1, age_from="median")


def test_a_sampler_of_ones_own_chooses_its_fresh_samples_unless_told_otherwise():
    from runtime.config.schema import BUILTIN_SAMPLERS
    from runtime.control.samplers import SAMPLERS

    assert set(BUILTIN_SAMPLERS) == set(SAMPLERS)
    assert build_config({}).reflow.fresh_order == "oldest"
    own = {"sampler": "runtime.control.samplers:MediumRewardSampler"}
    assert build_config({"reflow": own}).reflow.fresh_order == "sampler"
    told = {**own, "fresh_order": "oldest"}
    assert build_config({"reflow": told}).reflow.fresh_order == "oldest"
