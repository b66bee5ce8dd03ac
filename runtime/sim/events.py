"""The simulator's clock and event queue: what happens next, in a deterministic order."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any


class EventQueue:
    """Events ordered by time, ties broken by the order they were scheduled in, so a run
    with the same seed replays event for event."""

    def __init__(self) -> None:
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    def clock(self) -> float:
        return self.now

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, args))

    def token(self) -> int:
        """A fresh number, for callers that mark which of their events is the live one."""
        return next(self._seq)

    def run(self, until: float, done: Callable[[], bool]) -> None:
        """Run events in order until none is left, ``done()`` holds, or the next one is
        past ``until``."""
        while self._events and not done():
            t, _, fn, args = heapq.heappop(self._events)
            if t > until:
                return
            self.now = max(self.now, t)
            fn(*args)
