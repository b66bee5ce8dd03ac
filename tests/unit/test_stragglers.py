"""A group's straggler no longer dooms its finished members (reflow.max_stragglers).

Before, a group became available only once all its members were in; its members all
carry the version they were dispatched at, so one member that generated for more than
``delta`` versions made the whole group stale on arrival (ReTool, Qwen3-8B on 32 GPUs in
simulation: 28M generated tokens evicted unused).
"""

from __future__ import annotations

import itertools

import pytest

from runtime.config.recipe import RecipeError, build_config
from runtime.control.data_plane import DataPlane
from runtime.control.replay_buffer import ReplayBuffer
from runtime.data.sample import ParkedRollout, Sample, Turn


def member(sample_id: int, group: int, version: int, reward: float, worker: int = 1) -> Sample:
    return Sample(
        sample_id=sample_id,
        group_id=group,
        prompt_id=group,
        versions=[(version, 0, 3)],
        token_ids=[1, 2, 3],
        logprobs=[-1.0] * 3,
        reward=reward,
        n_valid=3,
        worker=worker,
    )


def test_a_group_about_to_expire_trains_without_its_one_straggler():
    buf = ReplayBuffer(batch_size=3, sigma=0.0, delta=1, group_size=4, max_stragglers=1)
    for i, r in enumerate([1.0, 0.0, 0.0]):
        buf.add(member(i, group=7, version=0, reward=r))
    # a batch that is not the last to take version 0: the group waits for its straggler
    assert buf.sample_batch(1, last_chance=-1) is None and buf.n_waiting_for_group == 3
    batch = buf.sample_batch(1, last_chance=0)  # the last batch for them: it closes
    assert batch is not None and sorted(t.sample_id for t in batch.samples) == [0, 1, 2]
    # advantages over the three members in (mean 1/3)
    adv = {t.sample_id: t.advantage for t in batch.samples}
    assert adv[0] > 0 > adv[1] == adv[2]
    assert sum(adv.values()) == pytest.approx(0.0, abs=1e-5)
    # the straggler arrives later: dropped with its own reason, counted as waste
    buf.add(member(3, group=7, version=0, reward=1.0))
    assert buf.evicted == {"straggler": 1} and buf.evicted_tokens["straggler"] == 3
    assert not buf.holds(3) and buf.n_waiting_for_group == 0


def test_without_straggler_closing_the_whole_group_expires():
    # max_stragglers 0 (the baselines; the code before): the three finished members wait,
    # and the straggler's arrival at version 2 makes all four stale at once
    buf = ReplayBuffer(batch_size=3, sigma=0.0, delta=1, group_size=4, max_stragglers=0)
    for i in range(3):
        buf.add(member(i, group=7, version=0, reward=float(i == 0)))
    assert buf.sample_batch(1, last_chance=0) is None
    buf.add(member(3, group=7, version=0, reward=1.0))
    assert buf.sample_batch(2) is None and buf.evicted == {"stale_unused": 4}


def test_a_group_missing_more_than_max_stragglers_waits():
    buf = ReplayBuffer(batch_size=2, sigma=0.0, delta=1, group_size=4, max_stragglers=1)
    for i in range(2):
        buf.add(member(i, group=7, version=0, reward=float(i)))
    assert buf.sample_batch(1, last_chance=0) is None and buf.n_waiting_for_group == 2
    # a group of two with one missing: one member alone has no advantage to speak of
    small = ReplayBuffer(batch_size=1, sigma=0.0, delta=0, group_size=2, max_stragglers=1)
    small.add(member(0, group=1, version=0, reward=1.0))
    assert small.sample_batch(0, last_chance=0) is None and small.n_waiting_for_group == 1
    with pytest.raises(ValueError, match="max_stragglers"):
        ReplayBuffer(batch_size=1, sigma=0.0, delta=0, group_size=2, max_stragglers=-1)


def test_closed_groups_survive_a_checkpoint():
    buf = ReplayBuffer(batch_size=3, sigma=0.0, delta=1, group_size=4, max_stragglers=1)
    for i in range(3):
        buf.add(member(i, group=7, version=0, reward=float(i == 0)))
    batch = buf.sample_batch(1, last_chance=0)
    assert batch is not None
    buf.complete_batch(batch.batch_id)
    state = buf.state_dict()
    resumed = ReplayBuffer(batch_size=3, sigma=0.0, delta=1, group_size=4, max_stragglers=1)
    view = resumed.closed_groups  # the dispatcher holds this view: it must stay live
    resumed.load_state_dict(state)
    assert 7 in view
    resumed.add(member(3, group=7, version=0, reward=1.0))
    assert resumed.evicted == {"straggler": 1}


def _data_plane(group_size: int, **reflow) -> DataPlane:
    cfg = build_config(
        {
            "train": {"batch_size": 3, "steps": 100, "sync_every": 1},
            "algorithm": {"group_size": group_size},
            "reflow": {"delta": 1, "B_max": 8, **reflow},
        }
    )
    prompts = ({"text": f"p{i}"} for i in itertools.count())
    return DataPlane(cfg.reflow, cfg.train, cfg.algorithm.group_size, prompts, lambda: 0.0)


def test_a_queued_straggler_of_a_closed_group_is_not_generated():
    dp = _data_plane(group_size=4)
    assert dp.buffer.max_stragglers == 1  # reflow's default
    reqs = dp.request_work(worker=1, slots=4)
    assert [r.group_id for r in reqs] == [0, 0, 0, 0]
    # the fourth member comes back to the queue (its worker left) before the group closes
    dp.worker_gone(1)
    reqs = dp.request_work(worker=2, slots=3)
    for r in reqs:
        ok = dp.deliver(
            member(r.sample_id, r.group_id, version=0, reward=float(r.sample_id == 0), worker=2)
        )
        assert ok
    # sync_every 1, delta 1: version 0's last batch is step 2's (TrainConfig.last_step_for)
    dp.step = dp.policy_version = 0
    assert dp.next_batch() is None  # step 1's batch: the group waits for its straggler
    dp.step = dp.policy_version = 1
    batch = dp.next_batch()  # step 2's, the last to take version 0: it closes
    assert batch is not None and len(batch.samples) == 3
    # its queued straggler is dropped, not handed out; the next group's members are
    nxt = dp.request_work(worker=2, slots=2)
    assert [r.group_id for r in nxt] == [1, 1]
    assert dp.dispatcher.transitions["pending->dropped"] == 1
    assert dp.ledger_problems() == []
    assert dp.ledger()["lost"] == 0


def test_a_parked_rollout_of_a_closed_group_is_counted_as_dropped():
    # A stop parks what a straggler had generated; if its group closes before the resumed
    # run hands it out again, the parked tokens are dropped with it and the parked counts
    # add up: continued + regenerated + dropped == kept.
    dp = _data_plane(group_size=4)
    reqs = dp.request_work(worker=1, slots=4)
    parked = ParkedRollout(
        token_ids=[5, 6, 7],
        logprobs=[-0.5] * 3,
        loss_mask=[1] * 3,
        versions=[(0, 0, 3)],
        turns=[Turn(start=0, end=3, finish="abort", stop=None)],
    )
    assert dp.dispatcher.keep_parked(reqs[3].sample_id, 1, parked)
    dp.worker_gone(1)  # all four back to the queue; the fourth keeps its parked rollout
    for r in dp.request_work(worker=2, slots=3):
        assert r.resume is None
        assert dp.deliver(member(r.sample_id, r.group_id, version=0, reward=1.0, worker=2))
    dp.step = dp.policy_version = 1
    assert dp.next_batch() is not None  # the last batch version 0 may reach: it closes
    assert [r.group_id for r in dp.request_work(worker=2, slots=1)] == [1]
    counts = dp.dispatcher.stats()["parked_rollouts"]
    assert counts["kept_tokens"] == 3
    assert counts["dropped_straggler"] == 1 and counts["dropped_straggler_tokens"] == 3
    assert counts.get("continued_tokens", 0) + counts.get("regenerated_tokens", 0) == 0


def test_the_mode_decides_the_default_and_a_baseline_refuses_closing():
    assert build_config({}).reflow.stragglers_allowed == 1
    assert build_config({"reflow": {"mode": "async"}}).reflow.stragglers_allowed == 0
    assert build_config({"reflow": {"max_stragglers": 3}}).reflow.stragglers_allowed == 3
    assert build_config({"reflow": {"max_stragglers": 0}}).reflow.stragglers_allowed == 0
    with pytest.raises(RecipeError, match=r"reflow.max_stragglers: 1 needs mode=reflow"):
        build_config({"reflow": {"mode": "async", "max_stragglers": 1}})
