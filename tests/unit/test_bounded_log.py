"""Lines a peer can cause go to rank 0's log at a bounded rate (runtime/rank/bounded_log.py)."""

from __future__ import annotations

import logging

from runtime.rank.bounded_log import BoundedLog


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_one_line_per_period_and_kind_then_how_many_were_held_back(caplog) -> None:
    clock = Clock()
    logger = logging.getLogger("test.bounded")
    bounded = BoundedLog(logger, period_s=10.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="test.bounded"):
        written = [bounded(logging.WARNING, "refused", f"refused {i}") for i in range(1000)]
        assert bounded(logging.ERROR, "error", "handler failed")  # another kind: its own
        clock.t = 10.5
        assert bounded(logging.WARNING, "refused", "refused again")
    assert written.count(True) == 1 and written[0]
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "refused 0",
        "handler failed",
        "refused again (999 more like it in the last 10 s)",
    ]
