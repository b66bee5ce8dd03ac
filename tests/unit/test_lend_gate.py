"""The lend gate on scripted supply streams: when a waiting trainer's groups are lent to
rollout, when they come back, and how the gate learns from lends that did not pay."""

from __future__ import annotations

import pytest

from runtime.control.scheduling.lending import LendGate, Supply


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def gate(clock: Clock) -> LendGate:
    # a lend and a reclaim of 2 s each (the memory plan's estimate): a 4 s round trip,
    # worth it at a predicted wait above 1.5 x 4 = 6 s
    return LendGate(2.0, 2.0, clock, margin=1.5)


def test_a_wait_longer_than_the_margin_of_round_trips_lends_every_trainer_group():
    g = gate(Clock())
    assert g.should_lend(Supply(fresh_needed=64, fresh_rate=4.0), 2) == 2
    assert g.status()["lent_now"] == 2
    # one lend at a time
    assert g.should_lend(Supply(64, 4.0), 2) == 0


def test_a_wait_shorter_than_the_margin_of_round_trips_lends_nothing():
    g = gate(Clock())
    assert g.should_lend(Supply(fresh_needed=20, fresh_rate=4.0), 2) == 0
    assert g.should_lend(Supply(fresh_needed=0, fresh_rate=0.0), 2) == 0
    assert g.should_lend(Supply(fresh_needed=64, fresh_rate=4.0), 0) == 0
    assert g.status()["lent_now"] == 0


def test_the_groups_come_back_once_the_batch_fills_within_the_reclaim():
    clock = Clock()
    g = gate(clock)
    g.should_lend(Supply(64, 4.0), 2)
    g.lent(1.5)
    clock.t = 5.0
    assert not g.should_reclaim(Supply(fresh_needed=40, fresh_rate=8.0))
    clock.t = 9.0
    assert g.should_reclaim(Supply(fresh_needed=12, fresh_rate=8.0))
    assert not g.should_reclaim(Supply(12, 8.0))  # asked once
    g.reclaimed(2.5, trainer_waited=False)
    (lend,) = g.history
    assert lend.paid and (lend.decided_at, lend.reclaimed_at) == (0.0, 9.0)
    assert g.margin == pytest.approx(1.4)  # a lend that paid lowers it
    # each direction's cost now follows what this run measured
    assert (g.lend_cost.seconds(), g.reclaim_cost.seconds()) == (1.5, 2.5)


def test_a_lend_that_did_not_pay_raises_the_margin_and_the_next_wait_like_it_stays():
    g = gate(Clock())
    assert g.should_lend(Supply(28, 4.0), 2) == 2  # 7 s predicted > 6 s
    g.lent(2.0)
    assert g.should_reclaim(Supply(4, 4.0))
    g.reclaimed(2.0, trainer_waited=True)  # back, and the trainer still waited
    assert g.history[-1].paid is False and g.margin == pytest.approx(2.0)
    assert g.should_lend(Supply(28, 4.0), 2) == 0  # 7 s < 2.0 x 4 s now
    assert g.status() == {
        "lent_now": 0, "lends": 1, "paid": 0, "margin": 2.0, "lend_s": 2.0, "reclaim_s": 2.0,
        "predicted_wait_s": 7.0,  # the last lend's
    }  # fmt: skip


def test_a_lend_that_kept_the_trainer_away_past_the_predicted_wait_did_not_pay():
    # The batch was there when the trainer came back, but 9 s after the lend was decided
    # on a predicted wait of 7 s: without the lend it would have trained 2 s sooner.
    # Before, only a trainer that found its batch short again made a lend unpaid.
    clock = Clock()
    g = gate(clock)
    assert g.should_lend(Supply(28, 4.0), 2) == 2
    g.lent(2.0)
    clock.t = 7.0
    assert g.should_reclaim(Supply(4, 8.0))
    clock.t = 9.0  # the reclaim's switch, then the trainer's request
    g.reclaimed(2.0, trainer_waited=False)
    (lend,) = g.history
    assert lend.paid is False and lend.back_at == 9.0
    assert g.margin == pytest.approx(2.0)


def test_slow_measured_switches_make_the_gate_wait_for_longer_gaps():
    g = gate(Clock())
    g.should_lend(Supply(64, 4.0), 2)
    g.lent(9.0)  # a first offload far slower than planned
    g.should_reclaim(Supply(0, 4.0))
    g.reclaimed(9.0, trainer_waited=False)
    # 16 s predicted wait, against 1.4 x 18 s of round trip now: no lend
    assert g.should_lend(Supply(64, 4.0), 2) == 0


def test_the_margin_stays_within_its_bounds_and_bad_reports_are_refused():
    g = LendGate(0.1, 0.1, Clock(), margin=1.0, margin_up=5.0, max_margin=3.0)
    for _ in range(3):
        assert g.should_lend(Supply(100, 1.0), 1) == 1
        assert g.should_reclaim(Supply(0, 1.0))
        g.reclaimed(0.1, trainer_waited=True)
    assert g.margin == 3.0
    with pytest.raises(RuntimeError, match="no lend being reclaimed"):
        g.reclaimed(0.1, trainer_waited=False)
    with pytest.raises(ValueError, match="cannot take"):
        g.lent(-1.0)
    with pytest.raises(ValueError, match=r"margin 0\.5 outside"):
        LendGate(1.0, 1.0, Clock(), margin=0.5)
