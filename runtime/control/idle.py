"""Where the idle time goes: every idle second of the trainer and of the rollout ranks
attributed to one cause, for the metrics line, ``reflow status``, ``summary.json`` and the
simulator's report (all read the same book).

Pure bookkeeping with the caller's times; the coordinator tells it what it already knows:

- **Trainer.** The trainer leader is in one state at a time, set when rank 0 answers it:
  training (a batch out, not idle), or idle for a cause. A batch request refused for lack
  of samples is classified when it is refused: too few fresh samples while admission or
  a batch barrier held a rollout rank back (``rollout_held``), too few fresh samples
  with rollout unhindered (``fresh_short``), enough fresh ones but not enough replay to
  fill the batch (``replay_short``: not yet there, or evicted), or a sampler that picked
  fewer (``sampler_short``); from a step report to the next request it is
  ``weight_sync`` at a sync point (the leader broadcasts) and ``step_report`` otherwise;
  ``role_switch`` and ``checkpoint`` while those hold batches back. While its replica
  groups are lent to rollout (runtime/control/lends.py) it is busy generating: the busy
  cause ``lent`` (``TRAINER_BUSY_CAUSES``, reported apart as ``trainer_busy_by_cause``).
- **Rollout.** Each rank reports cumulative active, busy and sync-paused seconds with its
  heartbeat; idle is active minus busy, plus the seconds its engine was paused for a
  weight sync (it holds requests then, but generates nothing). Between two beats, the
  idle seconds go first to ``weight_sync`` (the paused ones), then to the states rank 0
  put the rank in: refused work (``B_max``, ``staleness``, ``no_prompts``, a batch
  barrier, ``concurrency_cap``, ``token_budget``) or ``role_switch``, pro rata when those
  states lasted longer than the idle time; what is left is ``between_turns`` when the rank
  held requests (tool calls, rewards, a hand-off in progress) and ``between_requests``
  when it held none and was refused nothing.
- **Prefill.** A rank's engine prefilling prompts computes: those seconds are busy, not
  idle, and never ``weight_sync`` (the paused seconds are a weight sync's alone). A beat
  may say how many of its busy seconds were prefill (the engine's cumulative
  ``prefill_s``): they are booked as the busy cause ``prefill`` (``ROLLOUT_BUSY_CAUSES``,
  reported apart as ``rollout_busy_by_cause``), so that a prefill stall is seen by name.
- **Tensor-parallel replicas.** With ``rollout_gpus_per_replica > 1`` a replica is one
  engine on several ranks: its driver (first rank) asks for work and heartbeats the
  engine's time, which counts for every rank of the group (rank-seconds, the allocator's
  unit); the other ranks' beats and refusals are not counted (they run no engine and
  would read as idle all along: runtime/rank/tp_member.py).
- **Throttled busy time.** A rank refused work for ``THROTTLES`` but still generating
  something is not running at capacity: those seconds, weighted by the share of its slots
  the refusal left empty, are kept apart, and the allocator does not count them as busy
  (it would read a throttled rank as a slow one).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from runtime.config.layout import is_rollout_driver
from runtime.config.modes import BARRIER_CAUSES

TRAINER_CAUSES = (
    "fresh_short",
    "rollout_held",
    "replay_short",
    "sampler_short",
    "weight_sync",
    "step_report",
    "role_switch",
    "checkpoint",
    "colocated_rollout",  # colocated_sync: every rank generating the next batches
)
ROLLOUT_CAUSES = (
    "B_max",
    "staleness",
    "no_prompts",
    *BARRIER_CAUSES,  # each barrier mode's refusal (runtime/config/modes.py barrier_cause)
    "concurrency_cap",
    "token_budget",
    "weight_sync",
    "role_switch",
    # held for an eval round: the pinned driver with no episode left to hand out, or a
    # driver that serves a round's version until a sync brings it the current one
    "eval_hold",
    "between_turns",
    "between_requests",
)
# Busy time booked by what the engine did, apart from its decoding (not idle): prefill,
# and a driver pinned to a held-out eval round generating for it (runtime/control/evals.py).
ROLLOUT_BUSY_CAUSES = ("prefill", "eval")
# Refusals that hold a rank under its capacity by the run's rules, not its engine's.
THROTTLES = frozenset(
    {
        "B_max",
        "staleness",
        "no_prompts",
        *BARRIER_CAUSES,
    }
)
# The trainer's time that is not idle though it trains nothing: its groups generating.
TRAINER_BUSY_CAUSES = ("lent",)
# The trainer's causes that mean it waited for data.
STARVED = ("fresh_short", "rollout_held", "replay_short", "sampler_short")
# Refusal reasons that mean rollout is held back (the trainer's "rollout_held").
HELD_BACK = THROTTLES - {"no_prompts"}


@dataclass
class _Rank:
    state: str | None = None  # a refusal reason; None: nothing holds it
    since: float = 0.0
    unused: float = 1.0  # share of its slots left empty by the refusal
    spent: Counter[str] = field(default_factory=Counter)  # seconds per state since the beat
    # of those, refused seconds weighted by the share of slots left empty
    spent_unused: Counter[str] = field(default_factory=Counter)
    last: tuple[float, float, float] | None = None  # (active, busy, paused) at the last beat
    last_prefill: float = 0.0  # the engine's cumulative prefill seconds at the last beat


class IdleBook:
    def __init__(self, rollout_group_size: int = 1) -> None:
        if rollout_group_size < 1:
            raise ValueError(f"rollout_group_size must be at least 1, not {rollout_group_size}")
        # a driver's seconds count for its whole replica; the other ranks are left out
        self.rollout_group_size = rollout_group_size
        self.trainer: Counter[str] = Counter()
        self.trainer_busy: Counter[str] = Counter()  # TRAINER_BUSY_CAUSES, seconds
        self._busy_at_window: Counter[str] = Counter()  # of those, before the first step
        self.rollout: Counter[str] = Counter()
        self.rollout_busy: Counter[str] = Counter()  # ROLLOUT_BUSY_CAUSES, rank-seconds
        self.rollout_active_s = 0.0
        self.throttled_busy_s = 0.0
        self._trainer_state: str | None = None
        self._trainer_since = 0.0
        self._ranks: dict[int, _Rank] = {}

    # --- trainer -------------------------------------------------------------------------

    def trainer_is(self, cause: str | None, now: float) -> None:
        """The trainer leader is idle for ``cause`` from ``now`` (None: training; a busy
        cause of ``TRAINER_BUSY_CAUSES``: not idle, booked apart)."""
        if cause is not None and cause not in TRAINER_CAUSES + TRAINER_BUSY_CAUSES:
            raise ValueError(f"unknown trainer idle cause {cause!r}")
        self._close_trainer(now)
        self._trainer_state = cause

    def _close_trainer(self, now: float) -> None:
        state = self._trainer_state
        if state is not None and now > self._trainer_since:
            book = self.trainer_busy if state in TRAINER_BUSY_CAUSES else self.trainer
            book[state] += now - self._trainer_since
        self._trainer_since = max(self._trainer_since, now)

    def trainer_idle(self, now: float) -> Counter[str]:
        """Seconds per cause up to ``now`` (the open interval included)."""
        out = Counter(self.trainer)
        state = self._trainer_state
        if state is not None and state not in TRAINER_BUSY_CAUSES and now > self._trainer_since:
            out[state] += now - self._trainer_since
        return out

    def open_window(self, now: float) -> None:
        """The first step: the busy causes' shares count from here, as the idle ones."""
        self._busy_at_window = self.trainer_busy_s(now)

    def trainer_busy_s(self, now: float) -> Counter[str]:
        """Seconds per busy cause up to ``now`` (the open interval included)."""
        out = Counter(self.trainer_busy)
        state = self._trainer_state
        if state in TRAINER_BUSY_CAUSES and now > self._trainer_since:
            out[state] += now - self._trainer_since
        return out

    # --- rollout -------------------------------------------------------------------------

    def held_back(self) -> bool:
        """Whether a rollout rank's last work request was refused by a rule that holds
        rollout back (B_max, staleness, a batch barrier)."""
        return any(r.state in HELD_BACK for r in self._ranks.values())

    def rank_is(self, rank: int, state: str | None, now: float, unused: float = 1.0) -> None:
        """Rank 0 answered ``rank``: refused for ``state`` (a reason), or None when it got
        all it asked for; ``unused``: the share of the rank's slots the refusal left empty
        (a rank refused one slot of 256 is nearly at capacity)."""
        if state is not None and state not in ROLLOUT_CAUSES:
            raise ValueError(f"unknown rollout idle cause {state!r}")
        if not self.counts(rank):
            return
        r = self._ranks.setdefault(rank, _Rank(since=now))
        if r.state is not None and now > r.since:
            r.spent[r.state] += now - r.since
            r.spent_unused[r.state] += (now - r.since) * r.unused
        r.state, r.since, r.unused = state, max(r.since, now), min(max(unused, 0.0), 1.0)

    def counts(self, rank: int) -> bool:
        """Whether ``rank``'s rollout time is counted: it drives its replica's engine."""
        return is_rollout_driver(rank, self.rollout_group_size)

    def forget(self, rank: int) -> None:
        """The rank left the rollout pool: its next beat starts a fresh interval."""
        self._ranks.pop(rank, None)

    def rank_beat(
        self,
        rank: int,
        now: float,
        active_s: float,
        busy_s: float,
        paused_s: float,
        holding: bool,
        prefill_s: float | None = None,
        evaluating: bool = False,
    ) -> None:
        """A heartbeat's cumulative rollout seconds; ``holding``: the rank has requests
        out; ``prefill_s``: its engine's cumulative prefill seconds, if it says;
        ``evaluating``: the rank is pinned to an eval round (its busy seconds since the
        last beat are the eval's, booked as ``eval``). The interval since its previous beat
        is attributed (module doc); a driver's seconds count once per rank of its replica,
        a member's not at all."""
        if not self.counts(rank):
            return
        r = self._ranks.setdefault(rank, _Rank(since=now))
        self.rank_is(rank, r.state, now, r.unused)  # close the open state at the beat
        prev, r.last = r.last, (active_s, busy_s, paused_s)
        prefill_before, r.last_prefill = r.last_prefill, prefill_s or 0.0
        spent, r.spent = r.spent, Counter()
        spent_unused, r.spent_unused = r.spent_unused, Counter()
        if prev is None:
            return  # the first beat of this rank in the pool: its start is the baseline
        d_active, d_busy, d_paused = (max(0.0, x - y) for x, y in zip(r.last, prev, strict=True))
        if active_s < prev[0]:  # a restarted rank counts from zero again
            d_active, d_busy, d_paused = active_s, busy_s, paused_s
        d_busy = min(d_busy, d_active)
        paused = min(d_paused, d_busy)
        idle = d_active - d_busy
        ranks = self.rollout_group_size  # the replica's ranks share its engine's seconds
        self.rollout_active_s += d_active * ranks
        if evaluating:  # generating for the eval (and the training requests it still ran)
            if d_busy - paused > 0:
                self.rollout_busy["eval"] += (d_busy - paused) * ranks
        elif prefill_s is not None:
            # a new engine's counter starts again from zero
            d_prefill = prefill_s - prefill_before if prefill_s >= prefill_before else prefill_s
            d_prefill = min(max(d_prefill, 0.0), d_busy - paused)  # busy, and not a pause
            if d_prefill > 0:
                self.rollout_busy["prefill"] += d_prefill * ranks
        if paused > 0:
            self.rollout["weight_sync"] += paused * ranks
        explained = sum(spent.values())
        if explained > idle:
            scale = idle / explained
            for state, s in spent.items():
                self.rollout[state] += s * scale * ranks
                if state in THROTTLES:  # generating, at the share of slots it had filled
                    self.throttled_busy_s += spent_unused[state] * (1 - scale) * ranks
        else:
            for state, s in spent.items():
                self.rollout[state] += s * ranks
            rest = idle - explained
            if rest > 0:
                self.rollout["between_turns" if holding else "between_requests"] += rest * ranks

    def rollout_idle_s(self) -> float:
        return sum(self.rollout.values())

    def trainer_starved_s(self, now: float) -> float:
        """Seconds the trainer waited for data (no batch could be made)."""
        idle = self.trainer_idle(now)
        return sum(idle[k] for k in STARVED)

    def rollout_throttled_s(self) -> float:
        """Rollout rank-seconds refused work by the run's rules, idle or generating."""
        return self.throttled_busy_s + sum(self.rollout[k] for k in THROTTLES)

    # --- reporting -----------------------------------------------------------------------

    def report(
        self, now: float, trainer_window: tuple[float, Counter[str]] | None
    ) -> dict[str, Any]:
        """Shares of time by cause: the trainer's over its window (from the first step;
        ``(start, idle at the start)``), the rollout ranks' over their active time."""
        out: dict[str, Any] = {}
        if trainer_window is not None:
            start, at_start = trainer_window
            span = max(now - start, 1e-9)
            idle = self.trainer_idle(now)
            idle.subtract(at_start)
            out["trainer_idle_by_cause"] = _shares(idle, span)
            if self.trainer_busy or self._trainer_state in TRAINER_BUSY_CAUSES:
                busy = self.trainer_busy_s(now)
                busy.subtract(self._busy_at_window)
                out["trainer_busy_by_cause"] = _shares(busy, span)
        active = max(self.rollout_active_s, 1e-9)
        out["rollout_idle_by_cause"] = _shares(self.rollout, active)
        if self.rollout_busy:  # only engines that say what they did
            out["rollout_busy_by_cause"] = _shares(self.rollout_busy, active)
        return out


def _shares(seconds: Counter[str], span: float) -> dict[str, float]:
    shares = {k: round(max(v, 0.0) / span, 4) for k, v in sorted(seconds.items())}
    return {k: v for k, v in shares.items() if v > 0}
