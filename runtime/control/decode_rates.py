"""Each rollout engine's measured decode rate by concurrency, from its heartbeats.

Every heartbeat carries the engine's running requests and its generated tokens so far.
Between two heartbeats of a rank, the tokens it generated and the seconds that passed are
added to the bin of its concurrency (the mean of the two running counts, rounded). The
bins, summed over ranks, are the run's decode curve ``tokens/s at c running``: what the
cluster simulator needs to model that engine (``runtime/sim/fit.py``), measured under the
run's real conditions (here: CPU cores shared with the trainers). Bounded: one bin per
concurrency value. Pure logic; the coordinator feeds it.
"""

from __future__ import annotations

from typing import Any

# A longer gap (a role switch, a stalled rank) says nothing about the decode rate.
MAX_GAP_S = 5.0


class EngineRateProfile:
    def __init__(self) -> None:
        self._last: dict[int, tuple[float, float, float]] = {}  # rank -> (t, generated, running)
        self.bins: dict[int, list[float]] = {}  # concurrency -> [tokens, seconds]

    def observe(self, rank: int, t: float, engine: dict[str, Any]) -> None:
        if "generated" not in engine or "running" not in engine:
            return
        generated, running = float(engine["generated"]), float(engine["running"])
        last = self._last.get(rank)
        self._last[rank] = (t, generated, running)
        if last is None:
            return
        dt, tokens = t - last[0], generated - last[1]
        c = round((running + last[2]) / 2)
        if not 0 < dt <= MAX_GAP_S or tokens < 0 or c < 1:
            return  # idle, a restarted engine (counter reset), or a gap
        acc = self.bins.setdefault(c, [0.0, 0.0])
        acc[0] += tokens
        acc[1] += dt

    def forget(self, rank: int) -> None:
        """The rank left the rollout pool: its next heartbeat starts a new interval."""
        self._last.pop(rank, None)

    def summary(self) -> dict[str, list[float]]:
        """``{concurrency: [tokens, seconds]}`` (string keys: it goes to JSON)."""
        return {str(c): [round(x, 3) for x in v] for c, v in sorted(self.bins.items())}


def fit_decode_curve(bins: dict[str, list[float]]) -> tuple[float, float] | None:
    """``(base_s, per_seq_s)`` of a decode step ``base_s + per_seq_s * c`` (c sequences
    each get one token per step, so throughput is ``c / step``), by least squares on
    ``1/rate = per_seq_s + base_s / c`` weighted by the seconds each bin holds. None when
    the run saw fewer than two concurrency values."""
    points = [(int(c), tok / s, s) for c, (tok, s) in bins.items() if tok > 0 and s > 0]
    if len({c for c, _, _ in points}) < 2:
        return None
    w = sum(s for _, _, s in points)
    xs = [(1.0 / c, 1.0 / rate, s) for c, rate, s in points]
    mx = sum(x * s for x, _, s in xs) / w
    my = sum(y * s for _, y, s in xs) / w
    var = sum(s * (x - mx) ** 2 for x, _, s in xs)
    if var <= 0:
        return None
    base = sum(s * (x - mx) * (y - my) for x, y, s in xs) / var
    base = max(base, 0.0)
    per_seq = max(my - base * mx, 0.0)
    if per_seq == 0.0 and base == 0.0:
        return None
    return base, per_seq
