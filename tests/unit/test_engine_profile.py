"""The decode curve measured from heartbeats, and its fit."""

import pytest

from runtime.control.decode_rates import EngineRateProfile, fit_decode_curve

pytestmark = pytest.mark.unit


def test_heartbeats_fill_bins_by_concurrency_and_skip_what_says_nothing():
    prof = EngineRateProfile()
    prof.observe(2, 0.0, {"running": 4, "generated": 0})
    prof.observe(2, 1.0, {"running": 4, "generated": 100})  # 100 tokens at c = 4
    prof.observe(2, 2.0, {"running": 8, "generated": 250})  # c = (4 + 8) / 2 = 6
    prof.observe(2, 9.0, {"running": 8, "generated": 900})  # a 7 s gap: skipped
    prof.observe(2, 10.0, {"running": 0, "generated": 900})  # c = 4, no tokens
    prof.observe(2, 11.0, {"running": 0, "generated": 900})  # idle: skipped
    prof.observe(3, 0.5, {"running": 4, "generated": 5})  # another rank, first beat
    prof.observe(3, 1.5, {"running": 4, "generated": 55})
    prof.forget(3)  # left the rollout pool
    prof.observe(3, 30.0, {"running": 4, "generated": 0})  # a new interval, no negative
    prof.observe(2, 12.0, {})  # a heartbeat without engine stats
    assert prof.summary() == {"4": [150.0, 3.0], "6": [150.0, 1.0]}


def test_the_fit_recovers_a_known_decode_step():
    base, per_seq = 0.012, 0.0008
    bins = {}
    for c, seconds in ((1, 2.0), (4, 5.0), (8, 10.0), (16, 3.0)):
        bins[str(c)] = [seconds * c / (base + per_seq * c), seconds]
    got = fit_decode_curve(bins)
    assert got == pytest.approx((base, per_seq), rel=1e-6)
    assert fit_decode_curve({"8": [1000.0, 2.0]}) is None  # one concurrency: no curve
    assert fit_decode_curve({}) is None


def test_the_reward_level_that_reproduces_a_measured_drop_rate():
    from runtime.sim.fit import reward_for_drop_rate

    for n, p in ((4, 0.09), (4, 0.3), (16, 0.05)):
        dropped = p**n + (1 - p) ** n
        assert reward_for_drop_rate(dropped, n) == pytest.approx(p, abs=1e-9)
    assert reward_for_drop_rate(0.0, 4) == 0.5  # below what any p gives: the fewest drops
