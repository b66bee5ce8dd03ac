"""Mode ``colocated_sync`` at rank 0: every rank generates, then every rank trains.

This is the synchronous baseline as verl's hybrid engine runs it. The run alternates two
layouts of the whole world (:meth:`runtime.config.layout.Layout.all_playing`):

1. **Rollout phase.** Every rollout replica generates the samples of the next train
   phase: ``sync_every`` batches of ``b`` (the data plane's ``colocated_sync`` barrier
   hands out no more; a group the sampler rejects is replaced by new work).
2. **Train phase.** Once they are in the buffer and nothing is in flight, every rank
   switches to the trainer (engine asleep, trainer state back on the device) and the
   trainer group, every rank, trains those steps.
3. At the sync point every rank switches back: it loads its trainer's weights into its
   own engine in place (no broadcast: ``runtime/rank/worker.py``), then offloads the
   trainer and wakes the engine.

Held-out evals run inside a rollout phase, on every driver, at the version the phase
serves (runtime/control/eval_work.py ``shared_rounds``): a phase does not end while its
round runs, and after the last step a rollout phase of no training work plays the end's
round, as verl validates between generating and training.

Each phase change is a role switch of every rank, through the same books as a rebalance
(``RoleSwitch`` / ``RoleSwitchDone`` with each phase timed, ``source="phase"``), so its
cost shows in the step's ``transitions`` and in status. Pure logic, like the rest of
``runtime/control``.
"""

from __future__ import annotations

from runtime.config.layout import Role
from runtime.control import eval_work
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.transport import protocol as p
from runtime.transport.states import RunState


def is_colocated(c: Run) -> bool:
    return c.cfg.reflow.policy.colocated


def phase(c: Run) -> Role:
    """The role every rank plays now (colocated runs only)."""
    return Role.ROLLOUT if c.layout.n_trainer_ranks == 0 else Role.TRAINER


def rollout_quota(c: Run) -> int:
    """Samples the current rollout phase generates: the batches of the steps up to the next
    sync point (a run resumed between sync points finishes its interval)."""
    train = c.cfg.train
    assert train.batch_size is not None
    to_sync = train.sync_every - c.step % train.sync_every
    return train.batch_size * min(to_sync, train.steps - c.step)


def rank_share(c: Run, rank: int) -> int:
    """Requests ``rank`` may hold at once in a rollout phase: its even share of the phase's
    quota, as verl splits a batch over its rollout workers (pulled work would otherwise go
    to whichever rank asks first, and the phase would wait on one engine)."""
    drivers = max(1, len(c.layout.groups(Role.ROLLOUT)))
    share = -(-rollout_quota(c) // drivers)
    return max(0, share - c.data.running_at(rank))


def advance(c: Run) -> list[Outgoing]:
    """Change phase when the current one is over: the rollout phase once its quota is in
    the buffer with nothing in flight; the train phase at a sync point, once its step is
    reported and no checkpoint is being written (a checkpoint needs the trainer state on
    the device). Called after every event that can end a phase; idempotent."""
    if not is_colocated(c) or c.state != RunState.RUNNING:
        return []
    if c.rebalance.switching() or c.rebalance.pending is not None:
        return []
    train = c.cfg.train
    evaluating = c.evals is not None and c.evals.active is not None
    if phase(c) is Role.ROLLOUT:
        if c.data.has_outstanding or c.data.n_unused < rollout_quota(c) or evaluating:
            return []
        target = Role.TRAINER
    else:
        trained = c.step > c.phase_started_at_step
        at_sync = c.step % train.sync_every == 0 and c.step < train.steps
        # the last step is trained and its version's round is due: a phase to play it
        end_round = (
            c.step >= train.steps
            and c.evals is not None
            and c.evals.active is not None
            and c.evals.closing
        )
        if not trained or not (at_sync or end_round):
            return []
        if c.batch_in_flight is not None or c.ckpt.busy:
            return []
        target = Role.ROLLOUT
        c.idle.trainer_is("colocated_rollout", c.clock())
        if at_sync:  # a round of the version this phase serves, if one is due
            eval_work.after_sync(c, c.step - train.sync_every)
    c.start_phase()
    c.rebalance.request(c.layout.all_playing(target), source="phase", ratio=target.value)
    return c.apply_pending_layout()


def on_eval_done(c: Run, identity: bytes, msg: p.EvalDone) -> list[Outgoing]:
    """An eval episode came back: its round may be over, and so the phase it held."""
    return eval_work.on_eval_done(c, identity, msg) + advance(c)
