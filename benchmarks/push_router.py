"""Push routing: each request sent to the cheapest feasible worker, with group affinity.

The runtime admits pull-based (the rank that asks is the candidate:
:meth:`runtime.control.scheduling.router.TokenRouter.admit`). benchmarks/scheduling.py
compares token-aware routing against round-robin in a simulated push setting, which needs
the router to pick the worker itself; that choice is this subclass. Costs sit in a lazy
min-heap (an entry per change, stale ones skipped), so a decision looks at a few of the
cheapest workers, not all of them: O(log W).
"""

from __future__ import annotations

import heapq
import itertools

from runtime.control.scheduling.router import RouterSettings, TokenRouter


class PushRouter(TokenRouter):
    PROBE = 64  # cheapest workers tried before a request is declared unroutable now

    def __init__(self, settings: RouterSettings | None = None) -> None:
        self._heap: list[tuple[float, int, int]] = []  # (cost, stamp, worker)
        self._stamp: dict[int, int] = {}
        self._next_stamp = itertools.count()
        super().__init__(settings)

    def remove_worker(self, worker: int) -> list[int]:
        self._stamp.pop(worker, None)
        return super().remove_worker(worker)

    def _touch(self, worker: int) -> None:
        stamp = next(self._next_stamp)
        self._stamp[worker] = stamp
        heapq.heappush(self._heap, (self.cost(self.workers[worker]), stamp, worker))
        if len(self._heap) > 4 * len(self.workers) + 1024:  # drop the stale entries
            self._heap = [e for e in self._heap if self._stamp.get(e[2]) == e[1]]
            heapq.heapify(self._heap)

    def _cheapest(self, need: int, exclude: int | None = None) -> tuple[float, int] | None:
        """The lowest-cost worker that can take ``need`` tokens (among the PROBE cheapest)."""
        popped, found = [], None
        while self._heap and len(popped) < self.PROBE:
            cost, stamp, worker = heapq.heappop(self._heap)
            if self._stamp.get(worker) != stamp:
                continue  # stale
            popped.append((cost, stamp, worker))
            if worker != exclude and self.feasible(self.workers[worker], need):
                found = (cost, worker)
                break
        for entry in popped:
            heapq.heappush(self._heap, entry)
        return found

    def route(
        self, request: int, group: int, prompt_tokens: int, workload: str = "default"
    ) -> int | None:
        """The worker for ``request``, admitted there (load booked); None when no worker can
        take it now (the request stays queued)."""
        need = self.footprint(prompt_tokens, workload)
        home = self._group_home.get(group)
        if home is not None and home in self.workers:
            w = self.workers[home]
            at_home = need - prompt_tokens  # the prompt is in its prefix cache already
            if self.feasible(w, at_home):
                other = self._cheapest(need, exclude=home)
                if other is None or self.cost(w) <= other[0] + self.s.affinity_slack:
                    return self._book(request, group, home, at_home)
        best = self._cheapest(need)
        if best is None:
            return None
        return self._book(request, group, best[1], need)
