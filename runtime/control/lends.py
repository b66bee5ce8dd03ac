"""Lends at rank 0: the trainer's replica groups generate while the trainer waits.

The gate (:class:`runtime.control.scheduling.lending.LendGate`) decides; this module asks
it at the moments rank 0 knows something new and acts through the layout's books:

1. **Lend.** The trainer leader asked for a batch and none could be made for want of
   fresh samples with rollout unhindered (idle cause ``fresh_short``), between steps,
   with no switch, pending layout, checkpoint or lost rank in the way: if the gate says
   so, every rank becomes a rollout rank at once (``Layout.all_playing``; a new epoch,
   not a change of placement: the allocator's windows go on across it), told by a
   ``Lend``, which moves no group or state: each lent rank's engine loads the published
   policy from its own trainer (runtime/rank/worker.py, ``lend_switch``), so between sync
   points (``sync_every`` > 1) only where the ranks keep a copy of it (not yet after a
   resume between sync points). The trainer's time from the end of that switch is booked
   as ``lent``, a busy cause.
2. **Reclaim.** After every sample that arrives, and at every tick: once the gate says the
   missing fresh samples will be in by the time the groups are back, or a stop waits for
   the trainer, or a rank was lost, the layout the lend left is taken back at once. The
   lent ranks hand their requests in flight over (runtime/control/hand_over.py): each
   goes back to the front of the queue, with what the current policy generated of it for
   the next rollout rank to continue, so nothing is lost; versions and ages are the
   spans' as for any partial rollout. A rank lost while lent: the reclaim leaves it out
   (``gone``) and the live ranks regroup without it once the groups are back, as for any
   lost rank; only a lost leader's replica, or part of a replica group, fails the run.
3. **Verdict.** The trainer's first batch request after the reclaim: no batch for want of
   fresh samples means the lend did not pay (the gate's margin rises).

What a run keeps of its lends (:class:`runtime.control.scheduling.lending.Lends`: the gate,
the fresh-sample rate over the last arrivals, the lend under way) is pure state, held by
the :class:`~runtime.control.run.Run`.
"""

from __future__ import annotations

from runtime.config.layout import Role
from runtime.control import lifecycle
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.control.scheduling.lending import Supply
from runtime.transport.states import RunState


def supply(c: Run) -> Supply:
    """The fresh samples the next batch lacks, and the rate they arrive at."""
    assert c.lends is not None
    return Supply(fresh_needed=c.data.fresh_missing(), fresh_rate=c.lends.arrivals.per_s(c.clock()))


def why_not_now(c: Run) -> str:
    """Why no lend can start now ("" when one can): a lend needs the trainer between steps
    with nothing else moving ranks or holding the trainer state."""
    if c.batch_in_flight is not None:
        return "batch_in_flight"
    if c.rebalance.switching() or c.rebalance.pending is not None:
        return "layout_change"
    if c.ckpt.busy or c.ckpt.stopping or (c.lends is not None and c.lends.stop_reason):
        return "checkpoint"
    if c.members.lost:
        return "lost_ranks"
    if c.layout.n_trainer_ranks % c.cfg.resources.rollout_gpus_per_replica:
        # the trainer ranks do not make whole rollout replicas (lending them would regroup
        # the rollout replicas under way)
        return "replica_sizes"
    if not published_at_hand(c):
        return "no_published_copy"
    if c.lends is not None and c.lends.arrivals.count < 2:
        return "no_rate"  # nothing to predict the wait from yet
    return ""


def published_at_hand(c: Run) -> bool:
    """Whether the trainer ranks hold the published version's weights, which their engines
    load at a lend: at a sync point these are the trainer's own; between sync points, the
    copy each rank keeps at a publish (runtime/engines/torch/published.py), which a run
    resumed between sync points has only from its next one."""
    every = c.cfg.train.sync_every
    if c.step % every == 0:
        return True
    return c.step // every * every >= c.life.resumed_at_step


def maybe_lend(c: Run) -> list[Outgoing]:
    """The trainer leader waits for fresh samples (``fresh_short``): lend its groups now if
    the gate says the wait is worth a round trip."""
    lends = c.lends
    if lends is None or lends.active is not None:
        return []
    why = why_not_now(c)
    if why:
        lends.refuse(why)
        return []
    groups = len(c.layout.groups(Role.TRAINER))
    if not lends.gate.should_lend(supply(c), groups):
        return []
    before = c.layout
    out = c.apply_now(before.all_playing(Role.ROLLOUT), source="lend")
    lends.begin(before, c.layout_epoch)
    c.idle.trainer_is("role_switch", c.clock())
    return out


def sample_arrived(c: Run) -> list[Outgoing]:
    """A sample reached the buffer: the rate moves, and a lend may be over."""
    if c.lends is None:
        return []
    c.lends.arrivals.arrived(c.clock())
    return poll(c)


def _done_s(c: Run, epoch: int) -> float | None:
    """The seconds of layout ``epoch``'s switch once every rank took it up, else None."""
    applied = c.rebalance.applied
    if applied is None or applied.epoch != epoch or applied.done_at is None:
        return None
    return applied.done_at - (applied.applied_at or applied.done_at)


def poll(c: Run) -> list[Outgoing]:
    """Follow a lend under way: its switch done, its reclaim due, its reclaim done."""
    lends = c.lends
    if lends is None or lends.active is None:
        return []
    lend, now = lends.active, c.clock()
    if lend.reclaim_epoch is None:
        if lend.lend_s is None:
            seconds = _done_s(c, lend.lend_epoch)
            if seconds is None:
                return []  # the lend's switch is still under way
            lends.switched_out(seconds, now)
            c.idle.trainer_is("lent", now)
        if c.rebalance.switching():
            return []  # a regroup without a lost rank is under way: after it
        forced = lends.stop_reason is not None or bool(c.members.lost)
        if not forced and not lends.gate.should_reclaim(supply(c)):
            return []
        why = c.without_lost(lend.before)
        if why:  # the leader's replica, or part of one, was lost: it cannot train again
            return c.finish(RunState.FAILED, f"a rank lent to rollout was lost: {why}")
        lent_rank_s = (now - lend.lent_since) * lend.before.n_trainer_ranks
        out = c.apply_now(lend.before, source="reclaim")
        lends.call_back(c.layout_epoch, lent_rank_s, forced)
        c.idle.trainer_is("role_switch", now)
        return out
    seconds = _done_s(c, lend.reclaim_epoch)
    if seconds is None:
        return []  # the reclaim's switch is still under way
    # (no lend starts after a loss: a lost rank now was lost during this lend)
    stop = lends.back(seconds, rank_lost=bool(c.members.lost))
    if stop is not None:  # the groups are back: the stop's checkpoint now
        return lifecycle.checkpoint_then_stop(c, stop)
    # a rank lost while lent: the live ranks regroup without it now (the trainer goes on
    # with its whole replica groups), which the lend's epochs could not
    return c.regroup_without_lost()


def verdict(c: Run, starved_for_fresh: bool) -> None:
    """The trainer's first batch request after a reclaim: ``starved_for_fresh``, it found
    too few fresh samples again (the lend did not pay)."""
    if c.lends is not None:
        c.lends.judge(starved_for_fresh)
