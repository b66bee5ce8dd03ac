"""When a waiting trainer's ranks generate: the lend gate, pure logic with the caller's clock.

A trainer that waits for fresh samples waits idle, though every rank of ReFlow holds a
rollout side too. The gate decides, from what rank 0 already knows, whether to lend the
trainer's replica groups to rollout *now* (inside a step, not at the next sync point) and
when to take them back:

- **Lend** when the trainer is short of fresh samples and the predicted wait (the fresh
  samples the next batch still lacks over the rate they arrive at) exceeds the round trip
  of a switch (lend + reclaim, each direction's measured cost) by the gate's margin: a
  shorter wait would be spent switching.
- **Reclaim** once the buffer will hold the batch by the time the lent groups are back:
  the fresh samples still missing, at the rate every rollout rank (the lent ones with
  them) delivers them, arrive within the reclaim's cost.
- **Learn.** Each direction's cost starts at the memory plan's estimate and follows the
  run's own lends (a moving average of the measured seconds). A lend that did not pay
  raises the margin, one that paid lowers it, within bounds, as verl's switch threshold
  adapts (+0.05 / -0.03 of a batch there). A lend did not pay when its reclaim found the
  trainer waiting for samples anyway (the groups came back too early, or the wait was
  shorter than predicted), or when the trainer was back later than the wait the lend was
  decided on: without the lend its batch would have been there sooner. (Before
  2026-12-06 only the first counted: math, Qwen3-14B on 16 GPUs in simulation, lent 32
  times, 31 "paid", and trained 0.91x of its tokens without lending.)

Nothing here moves a rank: the coordinator asks, acts (runtime/control/rebalance.py
moves whole replica groups), and reports back what a lend cost and whether it paid.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.config.layout import Layout
from runtime.config.schema import SchedulerConfig


@dataclass(frozen=True)
class Supply:
    """The fresh-sample supply at a moment, as rank 0 sees it."""

    fresh_needed: int  # fresh samples the next batch still lacks (0: it can be formed)
    fresh_rate: float  # fresh samples per second arriving lately, all rollout ranks


@dataclass
class SwitchCost:
    """Seconds of a switch in one direction: the memory plan's estimate until the run has
    measured its own, then a moving average of those (``weight`` for the newest)."""

    estimate_s: float
    weight: float = 0.5
    _average: float | None = None

    def seconds(self) -> float:
        return self.estimate_s if self._average is None else self._average

    def observe(self, seconds: float) -> None:
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"a switch cannot take {seconds!r} s")
        avg = self._average
        self._average = seconds if avg is None else avg + self.weight * (seconds - avg)


@dataclass
class Lend:
    """One lend, from the decision to the verdict on it."""

    groups: int
    decided_at: float
    predicted_wait_s: float
    reclaimed_at: float | None = None
    paid: bool | None = None  # decided when the reclaimed groups train again
    back_at: float | None = None  # when the trainer, whole again, asked for its batch
    forced: bool = False  # called back by the run (a stop, a lost rank), not by the gate


class LendGate:
    """Decides lends and reclaims of the trainer's replica groups (see the module).

    ``margin``: how many round trips the predicted wait must exceed to lend; it moves by
    ``margin_up`` after a lend that did not pay and ``margin_down`` after one that did,
    within [``min_margin``, ``max_margin``].
    """

    def __init__(
        self,
        lend_estimate_s: float,
        reclaim_estimate_s: float,
        clock: Callable[[], float],
        *,
        margin: float = 1.5,
        margin_up: float = 0.5,
        margin_down: float = 0.1,
        min_margin: float = 1.0,
        max_margin: float = 8.0,
    ) -> None:
        if not min_margin <= margin <= max_margin:
            raise ValueError(f"margin {margin} outside [{min_margin}, {max_margin}]")
        self.lend_cost = SwitchCost(lend_estimate_s)
        self.reclaim_cost = SwitchCost(reclaim_estimate_s)
        self.clock = clock
        self.margin = margin
        self.margin_up, self.margin_down = margin_up, margin_down
        self.min_margin, self.max_margin = min_margin, max_margin
        self.current: Lend | None = None
        self.history: list[Lend] = []

    # --- the decisions --------------------------------------------------------------

    def round_trip_s(self) -> float:
        return self.lend_cost.seconds() + self.reclaim_cost.seconds()

    @staticmethod
    def predicted_wait_s(supply: Supply) -> float:
        """Seconds until the batch's fresh samples are in, at the current rate."""
        if supply.fresh_needed <= 0:
            return 0.0
        return math.inf if supply.fresh_rate <= 0 else supply.fresh_needed / supply.fresh_rate

    def should_lend(self, supply: Supply, trainer_groups: int) -> int:
        """Trainer replica groups to lend now (0: none). Ask it only while the trainer
        waits for fresh samples with rollout unhindered (the idle cause ``fresh_short``):
        where admission holds rollout back, lent ranks would be held back too. All of
        them or none: the trainer steps with every group, so one kept back would only
        wait."""
        if self.current is not None or trainer_groups < 1:
            return 0
        wait = self.predicted_wait_s(supply)
        if wait <= self.margin * self.round_trip_s():
            return 0
        self.current = Lend(trainer_groups, self.clock(), wait)
        return trainer_groups

    def should_reclaim(self, supply: Supply) -> bool:
        """Whether the lent groups should come back now: the batch's missing fresh samples
        will be in by the time the reclaim is done."""
        if self.current is None or self.current.reclaimed_at is not None:
            return False
        if self.predicted_wait_s(supply) > self.reclaim_cost.seconds():
            return False
        self.current.reclaimed_at = self.clock()
        return True

    def force_reclaim(self) -> None:
        """The run calls the lent groups back for its own reasons (a stop, a lost rank):
        the lend gets no verdict and the margin stays."""
        if self.current is None:
            return
        if self.current.reclaimed_at is None:
            self.current.reclaimed_at = self.clock()
        self.current.forced = True  # (also after the gate's own call: a rank lost since)

    # --- what the coordinator reports back ------------------------------------------

    def lent(self, seconds: float) -> None:
        """The lend's switch is done: it took ``seconds`` (its slowest rank)."""
        self.lend_cost.observe(seconds)

    def reclaimed(self, seconds: float | None, trainer_waited: bool) -> None:
        """The reclaim's switch is done in ``seconds`` (None: not a switch's cost, it
        waited for a rank lost meanwhile) and the trainer, whole again, asks for its batch
        now; ``trainer_waited``: it still found too few fresh samples. Such a lend did not
        pay, nor one that kept the trainer away longer than the wait it was decided on
        (module doc): the margin rises, and falls after one that paid."""
        lend = self.current
        if lend is None or lend.reclaimed_at is None:
            raise RuntimeError("a reclaim reported with no lend being reclaimed")
        if seconds is not None:
            self.reclaim_cost.observe(seconds)
        lend.back_at = self.clock()
        if not lend.forced:
            away = lend.back_at - lend.decided_at
            lend.paid = not trainer_waited and away <= lend.predicted_wait_s
            step = -self.margin_down if lend.paid else self.margin_up
            self.margin = min(self.max_margin, max(self.min_margin, self.margin + step))
        self.history.append(lend)
        self.current = None

    def status(self) -> dict[str, Any]:
        """For ``reflow status`` and the metrics: lends, their cost and their yield."""
        last = self.current or (self.history[-1] if self.history else None)
        wait = last.predicted_wait_s if last is not None else None
        return {
            "lent_now": self.current.groups if self.current is not None else 0,
            # the wait the newest lend was decided on (None: no lend yet, or no rate)
            "predicted_wait_s": round(wait, 3)
            if wait is not None and math.isfinite(wait)
            else None,
            "lends": len(self.history),
            "paid": sum(1 for x in self.history if x.paid),
            "margin": round(self.margin, 3),
            "lend_s": round(self.lend_cost.seconds(), 3),
            "reclaim_s": round(self.reclaim_cost.seconds(), 3),
        }


class ArrivalRate:
    """Samples per second lately: the last ``size`` arrival times, the gap since the
    newest counted (a supply that stopped reads as slowing down, not as steady)."""

    def __init__(self, size: int = 64) -> None:
        if size < 2:
            raise ValueError(f"an arrival rate needs at least 2 arrivals, not {size}")
        self._times: deque[float] = deque(maxlen=size)

    @property
    def count(self) -> int:
        """Arrivals in the window (at most ``size``)."""
        return len(self._times)

    def arrived(self, now: float) -> None:
        self._times.append(now)

    def per_s(self, now: float) -> float:
        """0 before two arrivals; unbounded when they all came at this very instant."""
        if len(self._times) < 2:
            return 0.0
        span = now - self._times[0]
        return (len(self._times) - 1) / span if span > 0 else math.inf


@dataclass
class ActiveLend:
    """A lend under way: the layout it left, and its two switches' records."""

    before: Layout
    lend_epoch: int
    reclaim_epoch: int | None = None
    lend_s: float | None = None  # the lend's switch, once every rank took it up
    lent_since: float = 0.0  # when the groups began to generate


class Lends:
    """The run's lends (``scheduler.lend_trainer``): the gate, the arrival rate, the lend
    under way and the one whose verdict is due."""

    def __init__(self, sch: SchedulerConfig, clock: Callable[[], float]) -> None:
        self.gate = LendGate(
            sch.lend_estimate_s, sch.lend_estimate_s, clock, margin=sch.lend_margin
        )
        self.arrivals = ArrivalRate()
        self.active: ActiveLend | None = None
        # reclaimed (its switch's seconds): the trainer's next request tells if it paid
        self.verdict_due: float | None = None
        # a stop asked for while lent: the groups come back, then the stop's checkpoint
        self.stop_reason: str | None = None
        self.lent_s = 0.0  # rank-seconds of trainer ranks generating, over the run
        self.refused: dict[str, int] = {}  # lends the gate did not get to weigh, by why

    # --- the lend's course, as rank 0 follows it (runtime/control/lends.py) -----------

    def refuse(self, why: str) -> None:
        """No lend could be weighed now, for ``why`` (counted for status)."""
        self.refused[why] = self.refused.get(why, 0) + 1

    def begin(self, before: Layout, epoch: int) -> None:
        """The gate lent: the layout left, the lend's epoch."""
        self.active = ActiveLend(before=before, lend_epoch=epoch)

    def switched_out(self, seconds: float, now: float) -> None:
        """The lend's switch is done in ``seconds``: the groups generate from ``now``."""
        assert self.active is not None
        self.active.lend_s, self.active.lent_since = seconds, now
        self.gate.lent(seconds)

    def call_back(self, epoch: int, lent_rank_s: float, forced: bool) -> None:
        """The reclaim's switch starts as ``epoch``, after ``lent_rank_s`` rank-seconds
        lent; ``forced``: the run's call (a stop, a lost rank), not the gate's."""
        assert self.active is not None
        if forced:
            self.gate.force_reclaim()
        self.active.reclaim_epoch = epoch
        self.lent_s += lent_rank_s

    def back(self, seconds: float, rank_lost: bool = False) -> str | None:
        """The reclaim's switch is done in ``seconds``; the stop that waited for it, if
        any (its lend gets no verdict), else the verdict is due at the next request.
        ``rank_lost``: a rank was lost during the lend; the switch waited for its loss to
        be declared, so its seconds are not a reclaim's cost, and the lend gets no verdict."""
        assert self.active is not None
        self.active = None
        stop, self.stop_reason = self.stop_reason, None
        if rank_lost:
            self.gate.force_reclaim()
            self.gate.reclaimed(None, trainer_waited=False)
            return stop
        if stop is not None:
            self.gate.reclaimed(seconds, trainer_waited=False)  # forced: no margin change
            return stop
        self.verdict_due = seconds
        return None

    def stop_after_reclaim(self, reason: str) -> None:
        """A stop asked for while lent: the groups come back first, then its checkpoint."""
        self.stop_reason = reason

    def judge(self, starved_for_fresh: bool) -> None:
        """The trainer's first batch request after a reclaim: ``starved_for_fresh``, it
        found too few fresh samples again (the lend did not pay)."""
        if self.verdict_due is None:
            return
        seconds, self.verdict_due = self.verdict_due, None
        self.gate.reclaimed(seconds, trainer_waited=starved_for_fresh)

    def status(self) -> dict[str, Any]:
        out = self.gate.status()
        out["state"] = (
            "none"
            if self.active is None
            else "reclaiming"
            if self.active.reclaim_epoch is not None
            else "lent"
            if self.active.lend_s is not None
            else "lending"
        )
        if self.active is None:  # back (the gate keeps the lend until its verdict)
            out["lent_now"] = 0
        out["lent_rank_s"] = round(self.lent_s, 3)
        out["refused"] = dict(self.refused)
        out["paid_share"] = round(out["paid"] / out["lends"], 3) if out["lends"] else None
        return out
