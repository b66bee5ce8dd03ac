"""The response-length model of the synthetic engines and the simulator: log-normal lengths
whose median drifts over training.

``n = clamp(int(LogNormal(log(median(x)), sigma)), 1, cap)``, with ``median(x) = base *
m(x)`` and ``m`` piecewise linear through the knots ``(x, m)`` (constant before the first
and after the last). ``x`` is whatever clock the user drifts on: the synthetic rollout
engine uses the policy version (``engine.synthetic_length_schedule``), the simulator the
run's progress in [0, 1] (``median_start`` -> ``median_end`` of a workload profile).
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# The synthetic rollout engine's lengths (runtime/engines/synthetic.py), which the
# simulator reproduces for it (runtime/sim/fit.py): median cap / 8, p99/p50 about 6.
SYNTHETIC_MEDIAN_FRACTION = 1 / 8
SYNTHETIC_SIGMA = 0.8


def piecewise_linear(knots: Sequence[tuple[float, float]], x: float) -> float:
    """``m(x)`` through ``knots`` (sorted by x), constant outside them; 1 with no knots."""
    if not knots:
        return 1.0
    if x <= knots[0][0]:
        return knots[0][1]
    for (x0, m0), (x1, m1) in itertools.pairwise(knots):
        if x <= x1:
            return m0 + (m1 - m0) * (x - x0) / (x1 - x0)  # x1 > x0: x <= x0 returned before
    return knots[-1][1]


@dataclass(frozen=True)
class ResponseLengths:
    base: float  # the median where the multiplier is 1
    sigma: float  # log-normal spread
    cap: int  # the longest response (max tokens)
    knots: tuple[tuple[float, float], ...] = ()  # (x, multiplier), sorted by x

    def median(self, x: float) -> float:
        return self.base * piecewise_linear(self.knots, x)

    def mean(self, x: float) -> float:
        """The mean of the uncapped log-normal at ``x``."""
        return self.median(x) * math.exp(self.sigma**2 / 2)

    def draw(self, rng: random.Random, x: float) -> int:
        median = self.base * piecewise_linear(self.knots, x)
        n = rng.lognormvariate(math.log(median), self.sigma)
        return max(1, min(self.cap, int(n)))


def drifting(start: float, end: float, sigma: float, cap: int) -> ResponseLengths:
    """A median moving linearly from ``start`` to ``end`` over progress 0 -> 1."""
    return ResponseLengths(1.0, sigma, cap, ((0.0, start), (1.0, end)))


def synthetic_lengths(cap: int, schedule: Mapping[int, float] | None = None) -> ResponseLengths:
    """The synthetic engine's: median ``cap / 8`` times the schedule's multiplier at the
    policy version (``{version: multiplier}``, interpolated)."""
    knots = tuple(sorted((int(k), float(v)) for k, v in (schedule or {}).items()))
    return ResponseLengths(cap * SYNTHETIC_MEDIAN_FRACTION, SYNTHETIC_SIGMA, cap, knots)
