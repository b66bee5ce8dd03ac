"""Resource allocation between rollout and training (ReFlow Algorithm 1), per step.

Over the last window the coordinator measures fresh samples produced (those the batch
sampler accepts: a group it rejects feeds no batch) and samples consumed, and how much of
the window each pool sat idle. Idle time is time a pool was blocked (the trainer starved
of data, rollout held back by ``B_max`` or staleness), so
the *rates when working* are

    r = produced / (rollout rank-seconds busy)     per rollout rank
    t = consumed / (trainer rank-seconds busy)     per trainer rank

For every feasible placement (whole replica groups: ``n_R = k_R s_R``, ``n_T = k_T s_T``,
``n_R + n_T = W``, at least one group each) the allocator extrapolates production
``P = n_R r`` and consumption ``C = n_T t`` and predicts the fresh-data coverage
``P / C``. The batch rule needs a fresh share of at least ``1 - sigma`` and replay fills
the rest, if staleness lets it; the target is inside that band (below). A fresh sample first
trained at age ``a`` can be replayed in at most ``delta - a`` later batches, so with ``L``
such further batches per fresh sample on average (measured over the window) replay can
fill at most ``L / (1 + L)`` of a batch. A placement with fewer rollout ranks is therefore
judged against ``max(target, 1 / (1 + L))``: with ``delta = 1`` and long generations
that arrive a version old, ``L`` is near 0, and taking rollout ranks away would starve the
trainer that replay cannot feed. A placement with more rollout ranks is judged against
the target only: a short ``L`` measured now is no evidence that more ranks would make
more fresh samples (when staleness admission holds rollout back they add none, and in
simulation that rule moved ranks to rollout and lost throughput in 11 of 24 grid cells).
The placement that lowers ``|log(coverage / target)|`` the most from the current one
wins; it is applied only if it lowers it by ``margin`` and ``cooldown_steps`` have passed
since the last change.

The target is the middle of the band the batch rule allows, ``1 - sigma / 2``, not its
edge ``1 - sigma``: at the edge every fluctuation of the fresh supply leaves a batch short
of its ``b (1 - sigma)`` fresh samples, and in simulation a trainer placed there waited
for data half of the time (Qwen3-8B math at 128 GPUs, delta 1). The rates are linear
extrapolations, which two regimes break (the idle accounting, runtime/control/idle.py,
says when a window is in one): a trainer that waited for data more than ``HELD_UP`` of
the window gets no more ranks (they would wait too); and rollout ranks refused work by
``B_max``, staleness or a batch barrier more than ``HELD_UP`` of their time produce what
those rules let through, not what they could: their rate is no measure of their
capacity, so the allocator moves one group at a time: to the trainer if it is not
waiting for data, and back to rollout if it is (then what may be in flight over how long
a generation takes bounds production, and more rollout ranks shorten each generation).
These rules were written while looking at four simulated cells (Qwen3-8B math at 32 and
128 GPUs, the APPS agent at 16 and 64): they are in-sample there. Without them the
allocator swung Qwen3-8B math at 128 GPUs from 96:32 to 36:92 and back in simulation.
Windows start after the warm-up, the steps that can still train what rollout generated
before the first batch (admission lets it run ``(delta + 1) x sync_every`` steps ahead,
``B_max`` in flight), which say nothing of the rates.

Four rules keep it from sticking or swinging (docs/scheduling.md): the throttled rule
needs no rates, so it runs before the "not enough data" check; a throttled move back to a
placement whose throughput (tokens trained per second over its recent windows, two or
more, on responses of about the current length) is known must have done better there
(hysteresis), and a rate-based move needs two
decisions in a row to agree; and any move must promise enough gain to pay back the
measured role switch over the steps the new placement is kept (payback). A throttled move
promises what the trainer can train on its new ranks: in proportion to them when it did
not wait, and at most its rate while it did not wait when it gives ranks to rollout.
And a trainer that waited over the placement's stay (``WindowStats.stay_starved``) gets no
more ranks on one window in which it did not (the stay).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Placement:
    rollout: int  # ranks
    trainer: int

    @property
    def ratio(self) -> str:
        return f"{self.rollout}:{self.trainer}"


@dataclass(frozen=True)
class WindowStats:
    steps: int
    seconds: float
    produced: int  # fresh samples delivered by rollout and accepted by the sampler
    consumed: int  # samples trained on (fresh + replay)
    rollout_busy_s: float  # rank-seconds the rollout ranks were generating
    trainer_busy_s: float  # rank-seconds the trainer ranks were not waiting for data
    fresh: int = 0  # of ``consumed``, samples trained on for the first time
    # summed over those: later batches each may still join as replay (delta - age, >= 0)
    replay_life: int = 0
    # share of the window the trainer waited for data (runtime/control/idle.py), and share
    # of the rollout ranks' time they were refused work by the run's rules (THROTTLES)
    trainer_starved: float = 0.0
    rollout_throttled: float = 0.0
    # response tokens of ``consumed`` (0: not counted; throughput is then in samples)
    consumed_tokens: int = 0
    # the share of the placement's stay (its windows so far, ``memory_steps`` at most) the
    # trainer waited for data; None while the stay is this window
    stay_starved: float | None = None


@dataclass
class Decision:
    step: int
    current: str
    best: str
    applied: bool
    reason: str
    rollout_rate: float | None = None
    trainer_rate: float | None = None
    target_coverage: float | None = None  # 1 - sigma / 2
    replay_target: float | None = None  # max(target, 1/(1+L)): guards moves to the trainer
    predicted: dict[str, float] | None = None
    window: dict[str, float] | None = None
    # tokens (or samples) trained per second: measured at ``current`` since the run came
    # there, and expected at ``best``
    # (measured there before, or predicted from the rates); None where nothing says
    throughput: float | None = None
    expected: float | None = None
    needed_gain: float | None = None  # the gain a move must promise (payback, hysteresis)

    def as_dict(self) -> dict:
        return asdict(self)


# A trainer that waited for data more than this share of the window gets no more ranks:
# they would wait the same way. A round number, not tuned.
HELD_UP = 0.1


@dataclass(frozen=True)
class Measured:
    """What a placement trained over its windows (tokens, or samples where tokens are not
    counted), in how many seconds and windows, the step of the last one, and the samples
    those tokens were (0 where tokens are not counted)."""

    done: float
    seconds: float
    windows: int
    step: int
    samples: int = 0

    @property
    def throughput(self) -> float:
        return self.done / self.seconds

    def drifted(self, w: WindowStats) -> bool:
        """Whether ``w``'s responses are more than ``LENGTH_DRIFT`` times longer or shorter
        than those this figure was measured on (False where either did not count tokens)."""
        return lengths_drifted(self.done, self.samples, w.consumed_tokens, w.consumed)


def lengths_drifted(tokens_a: float, samples_a: int, tokens_b: float, samples_b: int) -> bool:
    """Whether two spans' mean response lengths (tokens over samples) differ by more than
    ``LENGTH_DRIFT`` either way; False where either span counted no tokens or samples."""
    if min(tokens_a, samples_a, tokens_b, samples_b) <= 0:
        return False
    ratio = (tokens_b / samples_b) / (tokens_a / samples_a)
    return not 1 / LENGTH_DRIFT <= ratio <= LENGTH_DRIFT


# A placement's figure stands for it (hysteresis) only over at least this many windows:
# a single one may be a start-up window (APPS 8B on 32 GPUs: 24:8 measured once while the
# trainer still waited for its first groups read 4% below 28:4, and held the run at 28:4,
# 0.72x async at 24:8).
TRUSTED_WINDOWS = 2

# A placement's figure stands for the responses it was measured on: within this factor of
# their mean length. Tokens per second at a placement do not carry across larger changes,
# because which side binds changes with length (a rollout rank's KV cache holds fewer long
# sequences, so it makes fewer tokens per second). With responses 5x shorter than when 1:3
# was measured rollout-bound, a figure of 1:3 held a synthetic run at 2:2 where its
# trainer was the bound (tests/integration/test_allocator.py). Simulated runs drift at
# most 2.8x over a whole run (math), far less within ``memory_steps``. Round, not tuned.
LENGTH_DRIFT = 2.0


class ProducerConsumerAllocator:
    def __init__(
        self,
        world: int,
        rollout_group: int,
        trainer_group: int,
        sigma: float,
        *,
        cooldown_steps: int = 5,
        margin: float = 0.1,
        min_window_steps: int = 3,
        memory_steps: int | None = None,
        decision_every: int = 1,
    ) -> None:
        self.world, self.s_r, self.s_t = world, rollout_group, trainer_group
        self.target = max(1.0 - sigma / 2, 1e-3)  # the middle of [1 - sigma, 1]
        self.cooldown_steps, self.margin = cooldown_steps, margin
        self.min_window_steps = min_window_steps
        # decisions come at sync points only: a placement is kept at least the cooldown
        # rounded up to whole sync intervals, the horizon a move is paid back over
        self.decision_every = max(decision_every, 1)
        # How long a placement's measured throughput stands for it: the workload drifts
        # (responses grow), so an old figure says less and less, and a placement the
        # rules keep asking for is tried again once it has expired. Twenty cooldowns: a
        # round number, not tuned.
        self.memory_steps = (
            memory_steps if memory_steps is not None else 20 * max(cooldown_steps, 1)
        )
        self.last_change_step: int | None = None
        # the seconds of the last role switch, as measured (None before the first one)
        self.switch_s: float | None = None
        self.measured: dict[Placement, Measured] = {}
        # the best placement the rates chose at the last decision (a rate-based move is
        # made when two decisions in a row agree on it: one window's rates are noisy)
        self._proposed: tuple[Placement, Placement] | None = None
        self.decisions: list[Decision] = []

    def placements(self) -> list[Placement]:
        out = []
        for k_r in range(1, self.world // self.s_r + 1):
            n_r = k_r * self.s_r
            n_t = self.world - n_r
            if n_t >= self.s_t and n_t % self.s_t == 0:
                out.append(Placement(n_r, n_t))
        return out

    def target_for(self, w: WindowStats) -> float:
        """The fresh share to aim at: the target, or more when staleness leaves
        replay less than ``sigma`` of a batch (see the module doc)."""
        if w.fresh <= 0 or self.target >= 1.0:
            return self.target
        life = w.replay_life / w.fresh
        return min(1.0, max(self.target, 1.0 / (1.0 + life)))

    @staticmethod
    def mismatch(p: Placement, r: float, t: float, target: float) -> float:
        return abs(math.log((p.rollout * r) / (p.trainer * t) / target))

    @staticmethod
    def capacity(p: Placement, r: float, t: float, target: float) -> float:
        """Samples per second ``p`` could train: its trainer's rate, or what its rollout
        side's fresh samples can feed when ``target`` of a batch must be fresh."""
        return min(p.trainer * t, p.rollout * r / target)

    def horizon_steps(self) -> int:
        """The fewest steps a new placement is kept: the cooldown, rounded up to whole
        sync intervals (decisions come at sync points only)."""
        every = self.decision_every
        return max(every, -(-self.cooldown_steps // every) * every)

    def needed_gain(self, w: WindowStats) -> float:
        """The relative gain in throughput a move must promise: enough to pay back the
        measured switch time within the fewest steps the new placement is kept
        (``switch_s`` over :meth:`horizon_steps` at this window's step time), and never
        less than ``margin``."""
        if self.switch_s is None or w.steps <= 0:
            return self.margin
        horizon_s = self.horizon_steps() * w.seconds / w.steps
        return max(self.margin, self.switch_s / max(horizon_s, 1e-9))

    def remember(self, step: int, p: Placement, w: WindowStats) -> float:
        """``p``'s throughput: tokens (samples where tokens are not counted) trained per
        second over its windows of the last ``memory_steps`` (what a move back there is
        held to). One window is too noisy to judge by: with windows that cut sync
        intervals differently, APPS 8B on 16 GPUs measured 54, 25, 40 and 21 samples/s at
        one placement in four windows. Tokens, because samples per second fall as
        responses grow: a placement left 40 steps ago looked better than the current one
        for that alone, and the allocator went back. ``w.seconds`` > 0 (:meth:`decide`
        checks)."""
        counted = w.consumed_tokens > 0
        done = w.consumed_tokens if counted else w.consumed
        m = self.measured.get(p)
        if m is None or step - m.step > self.memory_steps or m.drifted(w):
            m = Measured(0.0, 0.0, 0, step)
        self.measured[p] = m = Measured(
            m.done + done,
            m.seconds + w.seconds,
            m.windows + 1,
            step,
            m.samples + (w.consumed if counted else 0),
        )
        return m.throughput

    def measured_at(self, p: Placement, step: int, w: WindowStats) -> float | None:
        """``p``'s figure if it stands for it: recent, over enough windows, and measured on
        responses of about ``w``'s length."""
        m = self.measured.get(p)
        if m is None or step - m.step > self.memory_steps or m.windows < TRUSTED_WINDOWS:
            return None
        return None if m.drifted(w) else m.throughput

    def decide(self, step: int, current: Placement, w: WindowStats) -> Decision:
        """The placement for the next steps (``current`` when nothing should change)."""
        guard = self.target_for(w)
        d = Decision(
            step=step,
            current=current.ratio,
            best=current.ratio,
            applied=False,
            reason="",
            target_coverage=self.target,
            replay_target=guard,
            window=asdict(w),
        )
        self.decisions.append(d)
        # the last decision's rate-based proposal, kept only by a decision that makes it
        # again (two in a row)
        proposed, self._proposed = self._proposed, None
        throttled = w.rollout_throttled > HELD_UP
        starved = w.trainer_starved > HELD_UP
        # A trainer that waited over the placement's stay gets no more ranks on one window
        # in which it did not: at APPS 8B on 16 GPUs (simulated) 8:8's trainer waited
        # 14-48% of every 4-step window but one (8%), which sent the run to 4:12, where it
        # waited 57-71% of its windows.
        waits = starved or (w.stay_starved is not None and w.stay_starved > HELD_UP)
        if w.steps < self.min_window_steps or w.seconds <= 0:
            d.reason = "not enough data in the window"
            return d
        # Rollout held back by the run's rules is judged by those rules, not by its rates:
        # a window where staleness refused it all the time has no rollout rate at all,
        # and before 2026-12-04 that window read as "not enough data" and the allocator
        # never moved (math, Qwen3-32B on 32 GPUs stayed at 24:8).
        rated = w.rollout_busy_s > 0 and w.trainer_busy_s > 0 and w.produced > 0 and w.consumed > 0
        if not throttled and not rated:
            d.reason = "nothing produced or consumed in the window"
            return d
        d.throughput = now = self.remember(step, current, w)
        r = w.produced / w.rollout_busy_s if w.rollout_busy_s > 0 else 0.0
        t = w.consumed / w.trainer_busy_s if w.trainer_busy_s > 0 else 0.0
        d.rollout_rate, d.trainer_rate = (r, t) if rated else (None, None)

        def target(p: Placement) -> float:
            # Taking rollout ranks away must leave what replay cannot fill covered;
            # adding them is judged against 1 - sigma only (see the module doc).
            return guard if p.rollout < current.rollout else self.target

        # Rollout held back by the run's rules has spare capacity its rate does not
        # show: the trainer may take one group more. Held back while the trainer
        # waits too, production is bound by latency (what may be in flight over how
        # long a generation takes): one rollout group more shortens each generation
        # (less batching), a trainer rank more would only wait (module doc).
        side = [
            p
            for p in self.placements()
            if (p.rollout > current.rollout if starved else p.rollout < current.rollout)
        ]
        nearest = min(side, key=lambda p: abs(p.rollout - current.rollout), default=None)

        def allowed(p: Placement) -> bool:
            if p.trainer > current.trainer and waits:
                return False  # more trainer ranks would wait for data too
            return p == nearest if throttled else True

        candidates = [p for p in self.placements() if p == current or allowed(p)]
        if throttled:  # the rates say nothing of rollout's capacity: no extrapolation
            gains = {p: (self.margin if p != current else 0.0) for p in candidates}
        else:
            gains = {
                p: self.mismatch(current, r, t, target(p)) - self.mismatch(p, r, t, target(p))
                for p in candidates
            }
        if rated:
            d.predicted = {p.ratio: (p.rollout * r) / (p.trainer * t) for p in gains}
        best = max(gains, key=lambda p: (gains[p], p == current))
        d.best = best.ratio
        since = None if self.last_change_step is None else step - self.last_change_step
        if best == current or gains[best] < self.margin:
            # the throttled rule's one move was to the trainer, and only the stay held it
            held_by_stay = (
                throttled
                and waits
                and not starved
                and nearest is not None
                and nearest.trainer > current.trainer
            )
            d.reason = (
                f"rollout throttled {w.rollout_throttled:.0%} of its time, but the trainer"
                f" waited {w.stay_starved or 0.0:.0%} of this placement's stay: no group to it"
                if held_by_stay
                else "current placement is within the margin of the best"
            )
            return d
        if not throttled:
            self._proposed = (current, best)
        if since is not None and since < self.cooldown_steps:
            d.reason = f"cooldown: {since} of {self.cooldown_steps} steps since the last change"
            return d
        if not throttled and proposed != (current, best):
            d.reason = f"{best.ratio} proposed by the rates: moved to if the next window agrees"
            return d
        refusal = self._not_worth_it(
            d, step, current, best, w, now, r, t, target, throttled, starved
        )
        if refusal:
            d.reason = refusal
            return d
        d.applied = True
        self._proposed = None
        d.reason = (
            f"coverage {d.predicted[current.ratio]:.2f} -> {d.predicted[best.ratio]:.2f}"
            f" (target {target(best):.2f})"
            if d.predicted is not None and not throttled
            else f"rollout throttled {w.rollout_throttled:.0%} of its time, trainer waited "
            f"{w.trainer_starved:.0%}: one group to the "
            + ("rollout side" if best.rollout > current.rollout else "trainer")
        )
        self.last_change_step = step
        return d

    def _not_worth_it(
        self,
        d: Decision,
        step: int,
        current: Placement,
        best: Placement,
        w: WindowStats,
        now: float,
        r: float,
        t: float,
        target: Callable[[Placement], float],
        throttled: bool,
        starved: bool,
    ) -> str | None:
        """Why a move the rules chose should not be made, or None. When rollout is
        throttled there are no rates to predict from, and a placement measured recently
        is held to what it measured: a move back there must have done better by the
        needed gain (hysteresis: at APPS 14B on 32 GPUs, two throttled-rollout rules
        sent the allocator between 24:8 and 28:4 every cooldown, 10% of trainer time in
        switches). Otherwise the move must promise that gain from the rates, which are
        this window's: a figure measured before the workload changed (responses that
        grew, then shrank) would hold the run where the rates no longer fit."""
        need = d.needed_gain = self.needed_gain(w)
        before = self.measured_at(best, step, w) if throttled else None
        if before is not None:
            d.expected = before
            if before < now * (1 + need):
                return (
                    f"hysteresis: {best.ratio} trained {before:.3g}/s when last measured, "
                    f"{current.ratio} {now:.3g}/s: less than the {need:.0%} a move must gain"
                )
            return None
        if throttled and not starved:
            # the trainer is the bound (rollout has room): it scales with its ranks
            d.expected = now * best.trainer / current.trainer
        elif throttled and best.trainer < current.trainer:
            # The trainer waited, and on fewer ranks it trains at most at the rate it had
            # while it did not wait: a move to rollout that cannot beat the present even
            # so trades the waits for a slower trainer. (APPS 8B on 16 GPUs, simulated:
            # 8:8, its trainer waiting 43% of a window, went to 12:4 and trained 25% less
            # there, then back, then on: 5 moves in 80 steps.)
            busy = 1.0 - w.trainer_starved
            d.expected = now / max(busy, 1e-9) * best.trainer / current.trainer
        elif not throttled and t > 0 and r > 0:
            here = self.capacity(current, r, t, target(current))
            d.expected = now * self.capacity(best, r, t, target(best)) / max(here, 1e-12)
        if d.expected is not None and d.expected < now * (1 + need):
            return (
                f"no payback: {best.ratio} is expected to train {d.expected:.3g}/s "
                f"against {now:.3g}/s, less than the {need:.0%} that pays back a "
                f"{self.switch_s or 0:.0f} s switch within the cooldown"
            )
        return None

    def changed(self, step: int) -> None:
        """A placement change from elsewhere (a manual rebalance) restarts the cooldown."""
        self.last_change_step = step

    def switch_measured(self, seconds: float) -> None:
        """A role switch took ``seconds`` (the next moves must pay it back)."""
        if seconds > 0:
            self.switch_s = seconds
