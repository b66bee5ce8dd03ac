"""Moving ranks between the roles: the layout, its changes, and the allocator's windows.

A change of layout is requested (``reflow rebalance``, or the producer/consumer allocator
at a sync point), waits as the *pending* layout, is applied at the next synchronization
point (right after a weight sync) and is done when every live rank has switched. The
allocator decides from windows of cumulative counters marked at each training step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from runtime.config.layout import Layout, parse_ratio
from runtime.config.schema import ReflowConfig, SchedulerConfig, TrainConfig
from runtime.control.replay_buffer import version_of
from runtime.control.scheduling import Placement, ProducerConsumerAllocator, WindowStats
from runtime.control.scheduling.allocator import lengths_drifted
from runtime.data.sample import Sample

# The sources of a lend's two switches (runtime/control/lends.py).
LENDS = ("lend", "reclaim")


@dataclass
class SwitchRecord:
    epoch: int
    ratio: str
    requested_at: float
    applied_at: float | None = None
    done_at: float | None = None
    waiting_for: set[int] = field(default_factory=set)
    durations: dict[int, float] = field(default_factory=dict)
    # rank -> seconds per phase of its switch (protocol.SWITCH_PHASES)
    phases: dict[int, dict[str, float]] = field(default_factory=dict)
    # manual (reflow rebalance), auto (the allocator), phase (colocated_sync), lend and
    # reclaim (a waiting trainer's groups generating: runtime/control/lends.py), lost_rank
    # and rank_rejoined (the live ranks regrouping)
    source: str = "manual"
    reported: bool = False  # its duration went into metrics.jsonl

    def as_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "ratio": self.ratio,
            "applied": self.applied_at is not None,
            "duration_s": (
                round(self.done_at - self.applied_at, 3)
                if self.done_at is not None and self.applied_at is not None
                else None
            ),
            "max_rank_switch_s": max(self.durations.values(), default=None),
            "phases_max_s": self.phases_max(),
            "source": self.source,
        }

    def phases_max(self) -> dict[str, float]:
        """Each phase's longest time over the ranks: the switch waits for the slowest."""
        out: dict[str, float] = {}
        for phases in self.phases.values():
            for name, seconds in phases.items():
                out[name] = round(max(out.get(name, 0.0), seconds), 4)
        return out


@dataclass
class Mark:
    """Cumulative counters at a training step: the allocator's windows are differences."""

    step: int
    time: float
    epoch: int
    produced: int
    consumed: int
    fresh: int
    replay_life: int
    rollout_busy_s: float
    trainer_idle_s: float
    trainer_starved_s: float = 0.0  # the trainer waiting for data (runtime/control/idle.py)
    rollout_active_s: float = 0.0  # rollout rank-seconds, and of those refused by THROTTLES
    rollout_throttled_s: float = 0.0
    consumed_tokens: int = 0


class RoleTime:
    """Rank-seconds of each role between two training steps, from the layout over time: a
    rank counts for its role, or as ``switching`` while its switch is under way; and which
    ranks played each role. Makes "who did what" a number for every mode (a colocated run
    should show every rank in both roles)."""

    def __init__(self, now: float) -> None:
        self.since = now
        self.seconds: dict[str, float] = {}
        self.ranks: dict[str, set[int]] = {}
        self._reset()

    def _reset(self) -> None:
        self.seconds = {"rollout": 0.0, "trainer": 0.0, "switching": 0.0}
        self.ranks = {"rollout": set(), "trainer": set()}

    def restart(self, now: float) -> None:
        """Count from ``now`` (the run starts: registration and engine start-up left out)."""
        self.since = now
        self._reset()

    def add(
        self, now: float, layout: Layout, moving: Iterable[int], lost: Iterable[int] = ()
    ) -> None:
        """The time since the last call, spent in ``layout`` with ``moving`` switching (a
        ``lost`` rank plays no role)."""
        dt, self.since = max(0.0, now - self.since), max(self.since, now)
        moving, lost = set(moving), set(lost)
        for rank, role in enumerate(layout.roles()):
            if rank in lost:
                continue
            if rank in moving:
                self.seconds["switching"] += dt
            else:
                self.seconds[role.value] += dt
                self.ranks[role.value].add(rank)

    def take(
        self, now: float, layout: Layout, moving: Iterable[int], lost: Iterable[int] = ()
    ) -> dict[str, Any]:
        self.add(now, layout, moving, lost)
        out = {
            "rank_seconds": {k: round(v, 4) for k, v in self.seconds.items()},
            "ranks_by_role": {k: sorted(v) for k, v in self.ranks.items()},
        }
        self._reset()
        return out


class Rebalancer:
    """The current layout, the pending one, the switch records and the allocator."""

    def __init__(
        self,
        layout: Layout,
        sch: SchedulerConfig,
        train: TrainConfig,
        rf: ReflowConfig,
        clock: Callable[[], float],
        lost: Callable[[], AbstractSet[int]] = frozenset,
    ):
        """Its own sections of the run's config: ``scheduler``, ``train`` and ``reflow``;
        the world and the replica sizes come with the layout. ``lost``: the run's lost
        ranks now (membership owns them; they play no role)."""
        self.clock = clock
        self.layout = layout
        self._previous = layout  # the layout before the current one (moving ranks)
        self.role_time = RoleTime(clock())
        self.epoch = 0
        # bumped by every change of placement but a lend and its reclaim: the allocator's
        # windows span a lend (the lent ranks' samples are the placement's supply)
        self.placement_epoch = 0
        self.pending: Layout | None = None
        self._pending_record: SwitchRecord | None = None
        self._applied: SwitchRecord | None = None  # the newest layout applied
        # apply the pending layout as a new epoch even if its split is the current one (a
        # rank was lost: the live ranks regroup without it)
        self.force_next = False
        self.regroup_due = False  # a rank was lost: the live ranks regroup without it
        self._lost = lost
        self.switches: list[SwitchRecord] = []
        self.auto = sch.auto_rebalance
        self.allocator = ProducerConsumerAllocator(
            layout.world_size,
            layout.rollout_group_size,
            layout.trainer_group_size,
            sigma=rf.replay_share,
            cooldown_steps=sch.cooldown_steps,
            margin=sch.rebalance_margin,
            min_window_steps=min(3, sch.window_steps),
            decision_every=train.sync_every,  # allocate() runs at sync points
        )
        self._window_steps = sch.window_steps
        # the first steps train what rollout made before the first batch: admission lets
        # it run (delta + 1) x sync_every steps ahead, with up to B_max in flight
        assert rf.B_max is not None and train.batch_size is not None
        self._warmup_steps = max(
            math.ceil(rf.B_max / train.batch_size),
            train.last_step_for(0, rf.delta),
        )
        self._delta = rf.delta
        self._version_of = version_of(rf.age_from)  # as the buffer counts ages
        self._train = train
        self._marks: list[Mark] = []
        # the marks of the current placement from its first window on, the allocator's
        # memory at most: its stay, over which the allocator also judges the trainer's waits
        self._stay: list[Mark] = []
        self._stay_steps = self.allocator.memory_steps
        self.fresh_total = 0  # samples trained on for the first time
        self.replay_life_total = 0  # later batches those could still join (delta - age)

    # --- requests ------------------------------------------------------------------------

    def resume(self, layout: Layout | None, auto: bool, step: int) -> None:
        """A resumed run: the layout it was saved in (None: keep this one), whether the
        allocator was on, and the step it goes on from (the allocator's cooldown counts
        from there)."""
        if layout is not None:
            self.layout = self._previous = layout
        self.auto = auto
        self.allocator.changed(step)

    def set_auto(self, on: bool) -> None:
        """The allocator on or off (``reflow rebalance --auto``)."""
        self.auto = on

    def regroup_needed(self) -> None:
        """A rank was lost (or is ready to come back): the live ranks regroup."""
        self.regroup_due = True

    def request(
        self,
        target: Layout,
        source: str = "manual",
        ratio: str | None = None,
        force: bool = False,
    ) -> None:
        """``target`` pending, for the next sync point; ``force``: a new epoch even if its
        split is the current one (the live ranks regroup without a lost rank; a request
        after it keeps that)."""
        self.pending = target
        self.force_next = self.force_next or force
        self._pending_record = SwitchRecord(
            epoch=self.epoch + 1,
            ratio=ratio or target.ratio,
            requested_at=self.clock(),
            source=source,
        )
        self.switches.append(self._pending_record)

    def switching(self) -> bool:
        """A layout applied and not yet taken up by every rank."""
        applied = self._applied
        return applied is not None and applied.done_at is None

    def apply_pending(self, alive: Iterable[int]) -> bool:
        """Make the pending layout current (at a sync point), waiting for the ``alive``
        ranks to take it up; False when there is nothing to broadcast."""
        if self.pending is None or self.switching():
            return False
        self._count_role_time()
        target, self.pending = self.pending, None
        record, self._pending_record = self._pending_record, None
        assert record is not None
        forced, self.force_next = self.force_next, False
        if target == self.layout and not forced:
            record.applied_at = record.done_at = self.clock()
            record.epoch = self.epoch
            return False
        self.regroup_due = False  # this epoch leaves every lost rank out
        self.placement_epoch += 1
        self._take(target, record, alive)
        return True

    def apply_now(self, target: Layout, source: str, alive: Iterable[int]) -> None:
        """A lend or its reclaim: ``target`` current at once, as a new epoch, whatever the
        step (a pending layout stays pending for its sync point). The allocator's windows
        go on across it (``placement_epoch`` is unchanged)."""
        if self.switching():
            raise RuntimeError(f"a {source} while epoch {self.epoch} is still being taken up")
        self._count_role_time()
        record = SwitchRecord(
            epoch=self.epoch + 1, ratio=target.ratio, requested_at=self.clock(), source=source
        )
        self.switches.append(record)
        self._take(target, record, alive)

    def _take(self, target: Layout, record: SwitchRecord, alive: Iterable[int]) -> None:
        self.epoch += 1
        self._previous, self.layout = self.layout, target
        record.epoch, record.applied_at = self.epoch, self.clock()
        record.waiting_for = set(alive)
        self._applied = record

    def start_counting_roles(self) -> None:
        """The run starts: rank-seconds by role count from now (not the start-up)."""
        self.role_time.restart(self.clock())

    def placed_by_hand(self, step: int) -> None:
        """A user's rebalance was accepted: the allocator's cooldown starts again."""
        self.allocator.changed(step)

    def drop_pending(self, why: str) -> None:
        """The pending layout cannot be taken any more (a rank it needs was lost)."""
        self.pending, self.force_next = None, False
        record, self._pending_record = self._pending_record, None
        assert record is not None
        record.applied_at = record.done_at = None
        record.source = f"{record.source}, dropped: {why}"

    def forget(self, rank: int) -> None:
        """``rank`` is lost: a switch under way stops waiting for it."""
        current = self._applied
        if current is not None and current.done_at is None and rank in current.waiting_for:
            current.waiting_for.discard(rank)
            if not current.waiting_for and current.applied_at is not None:
                self._count_role_time()
                current.done_at = self.clock()

    @property
    def applied(self) -> SwitchRecord | None:
        """The newest layout applied (taken up by every rank once its ``done_at`` is set)."""
        return self._applied

    def switched(
        self,
        rank: int,
        epoch: int,
        duration_s: float | None,
        phases: dict[str, float] | None = None,
    ) -> None:
        current = self._applied
        if current is not None and current.epoch == epoch:
            current.waiting_for.discard(rank)
            if duration_s is not None:
                current.durations[rank] = duration_s
            if phases:
                current.phases[rank] = dict(phases)
            if not current.waiting_for and current.done_at is None:
                self._count_role_time()  # up to now the moved ranks were switching
                current.done_at = self.clock()
                if current.applied_at is not None and current.source not in LENDS:
                    # the next moves must pay this back (a lend's cost is the gate's)
                    self.allocator.switch_measured(current.done_at - current.applied_at)

    def _moving(self) -> list[int]:
        return self._previous.moved_ranks(self.layout) if self.switching() else []

    def _count_role_time(self) -> None:
        self.role_time.add(self.clock(), self.layout, self._moving(), self._lost())

    def take_role_time(self) -> dict[str, Any]:
        """Rank-seconds by role since the last call (one call per training step)."""
        return self.role_time.take(self.clock(), self.layout, self._moving(), self._lost())

    def new_transitions(self) -> list[dict[str, Any]]:
        """Layout changes finished since the last call, for the step's metrics line."""
        out = []
        for record in self.switches:
            if record.done_at is not None and record.applied_at is not None and not record.reported:
                record.reported = True
                out.append(
                    {
                        "ratio": record.ratio,
                        "source": record.source,
                        "duration_s": round(record.done_at - record.applied_at, 4),
                        "phases_max_s": record.phases_max(),
                    }
                )
        return out

    # --- the allocator -------------------------------------------------------------------

    def count_replay_life(self, fresh: list[Sample], step: int) -> None:
        """How much replay the fresh samples of step ``step``'s batch can still supply:
        each may join the later batches up to ``TrainConfig.last_step_for`` its oldest
        version (the allocator keeps rollout ranks that replay could not replace)."""
        last = self._train.last_step_for
        self.fresh_total += len(fresh)
        self.replay_life_total += sum(
            max(0, last(self._version_of(t), self._delta) - step) for t in fresh
        )

    def mark(
        self,
        step: int,
        now: float,
        produced: int,
        consumed: int,
        rollout_busy_s: float,
        trainer_idle_s: float,
        trainer_starved_s: float = 0.0,
        rollout_active_s: float = 0.0,
        rollout_throttled_s: float = 0.0,
        consumed_tokens: int = 0,
    ) -> None:
        self._marks.append(
            Mark(
                step=step,
                time=now,
                epoch=self.placement_epoch,
                produced=produced,
                consumed=consumed,
                fresh=self.fresh_total,
                replay_life=self.replay_life_total,
                rollout_busy_s=rollout_busy_s,
                trainer_idle_s=trainer_idle_s,
                trainer_starved_s=trainer_starved_s,
                rollout_active_s=rollout_active_s,
                rollout_throttled_s=rollout_throttled_s,
                consumed_tokens=consumed_tokens,
            )
        )
        del self._marks[: -(self._window_steps + 1)]
        last = self._marks[-1]
        if self._stay and self._stay[0].epoch != last.epoch:
            self._stay = []
        if last.step >= self._warmup_steps:
            self._stay.append(last)
            while last.step - self._stay[0].step > self._stay_steps:
                del self._stay[0]
            self._restart_a_drifted_stay()

    def _restart_a_drifted_stay(self) -> None:
        """Start the stay again at the window when the window's responses are more than
        ``LENGTH_DRIFT`` times longer or shorter than the stay's before it: waits on other
        lengths say nothing of this placement now. A synthetic run whose responses grew 8x
        and shrank back stayed at 2:2 with its trainer the bound: the waits of the long
        responses were most of its stay (tests/integration/test_allocator.py, CI)."""
        window = self._window_marks()
        if not window or self._stay[0].step >= window[0].step:
            return
        first, start, last = self._stay[0], window[0], window[-1]
        if lengths_drifted(
            start.consumed_tokens - first.consumed_tokens,
            start.consumed - first.consumed,
            last.consumed_tokens - start.consumed_tokens,
            last.consumed - start.consumed,
        ):
            self._stay = [m for m in self._stay if m.step >= start.step]

    def _window_marks(self) -> list[Mark]:
        """The marks of the current window: the current layout's after the warm-up."""
        last = self._marks[-1]
        return [m for m in self._marks if m.epoch == last.epoch and self._warmup_steps <= m.step]

    def window(self) -> WindowStats | None:
        """Rates over the last ``window_steps`` steps of the current layout."""
        last = self._marks[-1]
        same = self._window_marks()[:-1]
        if not same or self.switching():
            return None
        first = same[0]
        dt = last.time - first.time
        idle = last.trainer_idle_s - first.trainer_idle_s
        return WindowStats(
            steps=last.step - first.step,
            seconds=dt,
            produced=last.produced - first.produced,
            consumed=last.consumed - first.consumed,
            rollout_busy_s=last.rollout_busy_s - first.rollout_busy_s,
            trainer_busy_s=self.layout.n_trainer_ranks * max(dt - idle, 0.0),
            fresh=last.fresh - first.fresh,
            replay_life=last.replay_life - first.replay_life,
            trainer_starved=(last.trainer_starved_s - first.trainer_starved_s) / max(dt, 1e-9),
            rollout_throttled=(last.rollout_throttled_s - first.rollout_throttled_s)
            / max(last.rollout_active_s - first.rollout_active_s, 1e-9),
            consumed_tokens=last.consumed_tokens - first.consumed_tokens,
            stay_starved=self._stay_starved(first, last),
        )

    def _stay_starved(self, window_first: Mark, last: Mark) -> float | None:
        """The share of the current placement's stay the trainer waited for data, or None
        while the stay is no longer than the window."""
        stay = self._stay[0] if self._stay else None
        if stay is None or stay.step >= window_first.step or stay.epoch != last.epoch:
            return None
        return (last.trainer_starved_s - stay.trainer_starved_s) / max(last.time - stay.time, 1e-9)

    def allocate(self, step: int) -> dict[str, Any] | None:
        """One allocator decision at a sync point; a chosen placement becomes the pending
        layout, applied right after this step's weight sync like a manual rebalance."""
        if self.pending is not None or self.switching():
            return None
        w = self.window()
        if w is None:
            return None
        current = Placement(self.layout.n_rollout_ranks, self.layout.n_trainer_ranks)
        d = self.allocator.decide(step, current, w)
        if d.applied:
            rollout, trainer = parse_ratio(d.best)
            self.request(self.layout.with_ratio(rollout, trainer), source="auto", ratio=d.best)
        return d.as_dict()

    def status(self) -> dict[str, Any]:
        return {
            "rollout_gpus": self.layout.n_rollout_ranks,
            "trainer_gpus": self.layout.n_trainer_ranks,
            "epoch": self.epoch,
            "pending": self.pending.ratio if self.pending is not None else None,
            "switching": self.switching(),
        }
