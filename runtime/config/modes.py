"""The execution modes as policy objects: what each ``reflow.mode`` does, declared once.

Every module that behaves differently by mode asks the run's :class:`ModePolicy`
(``cfg.reflow.policy``, or :func:`policy` for a mode name) rather than comparing mode
names, so that what a mode is lives here and nowhere else (tests/unit/test_mode_policies.py
holds the rest of the code to that). The four modes before ``reflow`` are the baselines
users run elsewhere: ``colocated_sync`` is verl's default hybrid engine (every rank
generates the batch, then every rank trains on it), ``disaggregated_sync`` a barrier on a
rollout:trainer split, ``one_step_off`` that split one interval ahead, ``async`` verl's
fully-async policy (streaming, partial rollout, staleness threshold ``delta``); ``reflow``
adds replay, the allocator and adaptive caps (docs/architecture.md, "Execution modes").

This is the config layer's bottom: it imports nothing of the runtime, so that everything,
runtime/config/schema.py included, may import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModePolicy:
    name: str  # the value of reflow.mode
    # A baseline keeps its placement and fixed concurrency caps (no allocator, no adaptive
    # caps: runtime.config.schema.BASELINE_FIXED): it runs as its own system defines it,
    # so that a comparison with reflow is with the baseline users know.
    baseline: bool
    # No rollout:trainer split: every rank plays both roles in turn (generate, then train),
    # so there is no ratio to set, search or rebalance, and the ranks' process groups and
    # trainer state stay put across the phases.
    colocated: bool
    # Generates batch by batch behind a barrier (a sync interval's batches, then wait for
    # the trainer) rather than streaming requests as slots free up.
    barrier: bool
    # Sync intervals a barrier mode may generate ahead of the trainer, the current one
    # included: 1 waits for each interval to train, 2 generates the next interval while
    # this one trains (one_step_off). 0 for the streaming modes: no interval limit (their
    # admission is the staleness threshold delta instead).
    intervals_ahead: int
    # Replay allowed (reflow.sigma > 0): reflow's own addition; a baseline replaying would
    # no longer be the baseline.
    replay: bool
    # reflow.sigma when the recipe leaves it unset (the replay share of a batch).
    default_sigma: float
    # Rollout takes no new work while a batch trains: in a colocated mode every rank is
    # training then, and no engine is awake to generate.
    rollout_stops_while_training: bool
    # The idle cause a rank refused work at the barrier is booked under (metrics, status,
    # summary.json; runtime/control/idle.py lists them from here); None without a barrier.
    barrier_cause: str | None = None

    def __post_init__(self) -> None:
        # the declared properties must agree, or a mode would half-apply a rule
        if self.barrier != (self.barrier_cause is not None) or self.barrier != (
            self.intervals_ahead > 0
        ):
            raise ValueError(f"mode {self.name}: barrier, barrier_cause and intervals_ahead")
        if self.default_sigma > 0 and not self.replay:
            raise ValueError(f"mode {self.name}: a default sigma without replay")

    def recipe_sets(self) -> list[str]:
        """The ``--set`` overrides that run a recipe written for reflow (a replay share, a
        rollout:trainer split) as this mode: its sigma is kept where the mode replays and
        0 elsewhere, a baseline waits for whole groups (``max_stragglers`` its default), and
        a colocated mode drops the split (every rank plays both roles)."""
        sets = [f"reflow.mode={self.name}", *([] if self.replay else ["reflow.sigma=0"])]
        sets += ["reflow.max_stragglers=null"] if self.baseline else []
        return sets + (["resources.initial_ratio=null"] if self.colocated else [])

    def batches_ahead(self, step: int, sync_every: int, steps: int) -> int:
        """Batches a barrier mode may have generated or in generation ahead of the trainer
        after ``step`` of ``steps`` trained steps: the rest of the current sync interval,
        and ``intervals_ahead - 1`` whole intervals more, never past the run's last step.
        (verl's one-step-off starts interval k+2 once interval k+1 is generated and k
        trained; here k+2 may start while k+1's last samples are still generating, which
        favours the baseline, never reflow.) Before 2026-12-04 the disaggregated baselines
        counted one trainer step as their step: at the DAPO sizing (16 steps per sync) a
        128-GPU rollout side then generated 512 samples at a time and idled 78%."""
        if not self.barrier:
            raise ValueError(f"mode {self.name} streams: it has no batches-ahead limit")
        ahead = sync_every - step % sync_every + (self.intervals_ahead - 1) * sync_every
        return min(ahead, steps - step)


# The mode the reports compare the baselines with (a report's column, not a behaviour).
REFLOW = "reflow"

_ALL = (
    ModePolicy(
        name="colocated_sync",
        baseline=True,
        colocated=True,
        barrier=True,
        intervals_ahead=1,  # the batches of its next train phase (runtime/control/colocation.py)
        replay=False,
        default_sigma=0.0,
        rollout_stops_while_training=True,
        barrier_cause="colocated_sync_barrier",
    ),
    ModePolicy(
        name="disaggregated_sync",
        baseline=True,
        colocated=False,
        barrier=True,
        intervals_ahead=1,
        replay=False,
        default_sigma=0.0,
        rollout_stops_while_training=False,
        barrier_cause="disaggregated_sync_barrier",
    ),
    ModePolicy(
        name="one_step_off",
        baseline=True,
        colocated=False,
        barrier=True,
        intervals_ahead=2,
        replay=False,
        default_sigma=0.0,
        rollout_stops_while_training=False,
        barrier_cause="one_step_off_barrier",
    ),
    ModePolicy(
        name="async",
        baseline=True,
        colocated=False,
        barrier=False,
        intervals_ahead=0,
        replay=False,
        default_sigma=0.0,
        rollout_stops_while_training=False,
    ),
    ModePolicy(
        name=REFLOW,
        baseline=False,
        colocated=False,
        barrier=False,
        intervals_ahead=0,
        replay=True,
        default_sigma=0.5,
        rollout_stops_while_training=False,
    ),
)
# name -> policy, in the order the modes are listed everywhere (recipe reference, reports)
POLICIES: dict[str, ModePolicy] = {p.name: p for p in _ALL}
MODES: tuple[str, ...] = tuple(POLICIES)
BASELINES: tuple[str, ...] = tuple(m for m, p in POLICIES.items() if p.baseline)
# The idle causes of the barrier modes' refusals, in mode order (runtime/control/idle.py).
BARRIER_CAUSES: tuple[str, ...] = tuple(
    p.barrier_cause for p in POLICIES.values() if p.barrier_cause is not None
)
# The mode a recipe runs in when it names none (ReflowConfig.mode's default).
DEFAULT_MODE = REFLOW


def policy(mode: str) -> ModePolicy:
    """The policy of mode ``mode``; a name that is no mode is a ValueError naming them (a
    recipe's own check refuses it earlier, in one line)."""
    try:
        return POLICIES[mode]
    except KeyError:
        raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})") from None
