"""Idle accounting: scripted event streams whose idle causes are known, for the book alone
and through the coordinator (every idle second lands on one cause)."""

import pytest

from runtime.control.idle import IdleBook
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.unit.test_coordinator import Clock, ident, make, register_all
from tests.unit.test_data_plane import traj


def test_trainer_seconds_go_to_the_state_it_was_in():
    book = IdleBook()
    book.trainer_is(None, 0.0)  # training
    book.trainer_is("weight_sync", 10.0)
    book.trainer_is("fresh_short", 12.0)
    book.trainer_is(None, 15.0)
    book.trainer_is("step_report", 20.0)
    book.trainer_is(None, 21.0)
    book.trainer_is("replay_short", 30.0)
    assert book.trainer == {"weight_sync": 2.0, "fresh_short": 3.0, "step_report": 1.0}
    assert book.trainer_idle(34.0)["replay_short"] == 4.0  # the open interval counts
    with pytest.raises(ValueError, match="unknown trainer idle cause"):
        book.trainer_is("lunch", 35.0)


def test_rollout_idle_goes_to_sync_pauses_then_refusals_then_what_the_rank_held():
    book = IdleBook()
    book.rank_beat(1, 0.0, 0.0, 0.0, 0.0, holding=False)  # the baseline beat
    book.rank_is(1, "staleness", 2.0)
    book.rank_is(1, None, 6.0)
    # 10 s active, 4 busy of which 1 paused for a sync: 7 s idle
    book.rank_beat(1, 10.0, 10.0, 4.0, 1.0, holding=True)
    assert book.rollout == {"weight_sync": 1.0, "staleness": 4.0, "between_turns": 2.0}
    assert book.rollout_idle_s() == pytest.approx(7.0) and book.rollout_active_s == 10.0
    # next 10 s: idle 5 with nothing held and nothing refused
    book.rank_beat(1, 20.0, 20.0, 9.0, 1.0, holding=False)
    assert book.rollout["between_requests"] == pytest.approx(5.0)
    assert book.throttled_busy_s == 0.0


def test_a_rank_refused_work_while_generating_is_throttled_not_busy():
    book = IdleBook()
    book.rank_beat(2, 0.0, 0.0, 0.0, 0.0, holding=True)
    book.rank_is(2, "B_max", 0.0)  # refused all of its slots, all interval long
    book.rank_beat(2, 10.0, 10.0, 8.0, 0.0, holding=True)  # 2 s idle, 8 s generating
    assert book.rollout == {"B_max": pytest.approx(2.0)}
    assert book.throttled_busy_s == pytest.approx(8.0)
    assert book.held_back()
    # a cap from the engine's own load (AIMD) is not a throttle by the run's rules
    book.rank_is(2, "concurrency_cap", 10.0)
    book.rank_beat(2, 20.0, 20.0, 18.0, 0.0, holding=True)
    assert book.throttled_busy_s == pytest.approx(8.0) and not book.held_back()


def test_a_restarted_rank_counts_from_zero_and_a_rank_that_left_starts_over():
    book = IdleBook()
    book.rank_beat(3, 0.0, 100.0, 50.0, 0.0, holding=False)
    book.rank_beat(3, 10.0, 4.0, 1.0, 0.0, holding=False)  # totals went down: restarted
    assert book.rollout_active_s == 4.0 and book.rollout["between_requests"] == 3.0
    book.forget(3)
    book.rank_beat(3, 20.0, 50.0, 0.0, 0.0, holding=False)  # a baseline again
    assert book.rollout_active_s == 4.0


def test_the_coordinator_attributes_every_trainer_second_of_a_scripted_run():
    clock = Clock()  # starts at t = 100
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in range(1000)),
        train={"steps": 4, "batch_size": 4},
        algorithm={"group_size": 2},
        reflow={"B_max": 2, "mode": "async"},
    )
    register_all(c)
    rollout = 2  # ranks 2, 3 are the rollout ranks of 2:2

    def ask() -> p.Message:
        ((_, out), *_) = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
        return out

    def deliver() -> None:
        for req, _ in list(c.data.dispatcher.outstanding.values()):
            c.handle(ident(rollout), wire.sample_done(traj(req, 0, worker=rollout), rollout))

    assert isinstance(ask(), p.BatchWait)  # t=100: nothing yet, rollout unhindered
    clock.t = 102.0
    ((_, work),) = c.handle(ident(rollout), p.WorkRequest(rank=rollout, slots=4))
    assert len(work.requests) == 2  # B_max = 2: the rank is held back
    assert isinstance(ask(), p.BatchWait)  # t=102: admission holds rollout back
    clock.t = 105.0
    deliver()
    c.handle(ident(rollout), p.WorkRequest(rank=rollout, slots=2))
    deliver()
    batch = ask()  # t=105: a batch, training
    assert isinstance(batch, p.Batch)
    clock.t = 110.0
    done = p.StepDone(rank=0, step=1, policy_version=1, batch_id=batch.batch_id, metrics={})
    c.handle(ident(0), done)  # the leader broadcasts weights until it asks again
    clock.t = 111.0
    assert isinstance(ask(), p.BatchWait)  # t=111: nothing in the buffer
    clock.t = 115.0
    assert c.idle.trainer_idle(clock.t) == {
        "fresh_short": 2.0 + 4.0,  # 100-102, then 111-115 (no rank held back since)
        "rollout_held": 3.0,
        "weight_sync": 1.0,
    }
    assert c.trainer_idle_ratio(clock.t) == pytest.approx((1.0 + 4.0) / 5.0)
    status = c.status()["idle"]
    assert status["trainer_idle_by_cause"] == {"fresh_short": 0.8, "weight_sync": 0.2}


def test_the_allocator_does_not_count_a_throttled_rollout_rank_as_busy():
    # Before: a rank refused more work by B_max but generating what it had counted as
    # busy, and the allocator read its rate as that of a slow rank.
    clock = Clock()
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in range(1000)),
        train={"steps": 4, "batch_size": 4},
        algorithm={"group_size": 2},
        reflow={"B_max": 4, "mode": "reflow", "sigma": 0.0},  # no replay, the allocator on
        scheduler={"auto_rebalance": True, "window_steps": 1},
    )
    register_all(c)

    def beat(rank: int, active: float, busy: float) -> None:
        msg = p.Heartbeat(
            rank=rank,
            role="rollout",
            state="busy" if busy else "idle",
            layout_epoch=0,
            rollout_active_s=active,
            rollout_busy_s=busy,
            engine={},
        )
        c.handle(ident(rank), msg)

    beat(2, 0.0, 0.0)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=8))
    assert len(work.requests) == 4  # refused the other 4: B_max
    clock.t += 10.0
    beat(2, 10.0, 10.0)  # generating all along, with half of its slots filled
    for req, _ in list(c.data.dispatcher.outstanding.values()):
        c.handle(ident(2), wire.sample_done(traj(req, 0, worker=2), 2))
    ((_, batch), *_) = c.handle(ident(0), p.BatchRequest(rank=0))
    done = p.StepDone(rank=0, step=1, policy_version=1, batch_id=batch.batch_id, metrics={})
    c.handle(ident(0), done)
    # refused half of its slots all along: busy at half its capacity, 5 of the 10 s
    assert c.rebalance._marks[-1].rollout_busy_s == pytest.approx(5.0)
    assert c.idle.throttled_busy_s == pytest.approx(5.0)


def test_throttled_time_counts_the_share_of_slots_the_refusal_left_empty():
    book = IdleBook()
    book.rank_beat(4, 0.0, 0.0, 0.0, 0.0, holding=True)
    book.rank_is(4, "staleness", 0.0, unused=0.25)  # three quarters of its slots full
    book.rank_beat(4, 10.0, 10.0, 10.0, 0.0, holding=True)
    assert book.throttled_busy_s == pytest.approx(2.5) and book.rollout_idle_s() == 0.0
