"""Held-out evals on the rollout engines at rank 0: when a round starts, what the pinned
rollout driver is handed, what its results change (runtime/control/evals.py keeps the
rounds and says why one replica is pinned).

- **When.** At the start of a run (not of a resumed one: its start was evaluated before),
  version 0, once a rollout driver asks for work; after each weight sync that crosses a
  multiple of ``train.eval_every``, the version that sync published; and after the last
  step, whose version a weight sync sends to the rollout drivers for it: the run completes
  once that round ends (complete, or incomplete after ``eval.timeout_s``).
- **Where.** The live rollout driver with the fewest requests out. Its weight syncs are
  held (``WeightSync.hold``) while the round runs, and it gets no training work from the
  round's start until a sync has reached it after the round.
- **What comes back.** ``EvalDone`` per episode, checked by the book; a finished round
  writes its figures into the metrics under the step that published its version
  (``eval/<set>/<figure>``, ``eval_start/...`` for the start's, with ``eval_version``,
  ``eval_s``, ``eval_complete``), into the summary and ``reflow status``.
"""

from __future__ import annotations

from typing import Any

from runtime.control.evals import EvalRecord, EvalTask
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.transport import protocol as p
from runtime.transport.states import RunState


def pick_driver(c: Run) -> int | None:
    """The live rollout driver with the fewest requests out that serves the current
    policy (None: there is none)."""
    ev = c.evals
    assert ev is not None
    version = c.policy_version
    drivers = [r for r in c.sync_receivers() if r not in c.members.lost and ev.serves(r, version)]
    return min(drivers, key=lambda r: (c.data.running_at(r), r), default=None)


def start_round(c: Run, when: str) -> bool:
    """A round of the current policy version, if one is due and a driver can take it (in
    colocated_sync, every driver of the rollout phase it runs in)."""
    ev = c.evals
    if ev is None or not ev.enabled or ev.evaluated(c.policy_version):
        return False
    if shared_rounds(c):
        return ev.start(c.policy_version, c.step, when, None) is not None
    rank = pick_driver(c)
    if rank is None:
        return False
    return ev.start(c.policy_version, c.step, when, rank) is not None


def shared_rounds(c: Run) -> bool:
    """colocated_sync: a round runs in a rollout phase, on every driver. Every rank loads
    each version in place at the phase change, so no replica can be held back at one; the
    phase does not end while its round runs (runtime/control/colocation.py), as verl
    validates between its generation and its training."""
    return c.cfg.reflow.policy.colocated


def at_first_work(c: Run) -> None:
    """Before any step of a run that did not resume: the initial policy's round."""
    ev = c.evals
    first = c.step == 0 and c.life.resumed is None
    if ev is not None and first and not ev.records and ev.active is None:
        start_round(c, "start")


def after_sync(c: Run, previous_sync_step: int) -> None:
    """A weight sync after step ``c.step`` published a version: a round of it if a
    multiple of ``train.eval_every`` lies in ``(previous_sync_step, c.step]``."""
    every = c.cfg.train.eval_every
    if every and c.step // every > previous_sync_step // every:
        start_round(c, "step")


def final_round(c: Run) -> list[Outgoing]:
    """The last step is trained: the run completes after the end's round (``closing``),
    which starts now or, with a round still running, when that one ends."""
    ev = c.evals
    if ev is None or not ev.enabled or ev.evaluated(c.policy_version):
        return []
    ev.closing = True
    return [] if ev.active is not None else begin_end(c)


def begin_end(c: Run) -> list[Outgoing]:
    """The last version to the rollout drivers (the last step syncs none for training;
    a driver that has it drops it) and its round; the run completes if none can run.
    Not while the ranks switch or must regroup without a lost one: the sync would run over
    the groups of before (:func:`tick` begins it once they are done)."""
    ev = c.evals
    assert ev is not None
    if c.rebalance.switching() or c.rebalance.regroup_due:
        return []
    # (colocated: the end's rollout phase loads the last version in place)
    out = [] if shared_rounds(c) else c.weight_sync()
    if start_round(c, "end"):
        return out
    ev.closing = False
    return out + c.finish(RunState.COMPLETED, f"reached step {c.step}")


def work_for(c: Run, rank: int, slots: int) -> p.Message | None:
    """The answer to a work request of ``rank`` when evals decide it: episodes for the
    pinned driver, nothing once the last step is trained (None: training work as
    usual)."""
    ev = c.evals
    if ev is None:
        return None
    r = ev.active
    if r is not None and r.rank is None:  # a colocated phase's round: an even share each
        drivers = max(1, len(c.sync_receivers()))
        share = -(-r.n_tasks // drivers) - sum(1 for h in r.holders.values() if h == rank)
        tasks = ev.take(rank, min(slots, share)) if share > 0 else []
        if tasks:
            c.idle.rank_is(rank, None, c.clock(), 0.0)
            return p.EvalWork(
                round_id=r.round_id,
                policy_version=r.version,
                tasks=[task_record(ev.prompt_of(t), t) for t in tasks],
            )
    if ev.pinned == rank:
        r = ev.active
        assert r is not None
        tasks = ev.take(rank, slots)
        c.idle.rank_is(rank, None if tasks else "eval_hold", c.clock(), 0.0)
        return p.EvalWork(
            round_id=r.round_id,
            policy_version=r.version,
            tasks=[task_record(ev.prompt_of(t), t) for t in tasks],
        )
    if ev.closing:
        c.idle.rank_is(rank, "eval_hold", c.clock())
        return p.Work(policy_version=c.policy_version, requests=[])
    return None


def catch_up(c: Run) -> list[Outgoing]:
    """A weight sync for a rank whose round is done and that still serves its round's
    version, at a point that allows one: the trainer between steps at a sync point (its
    weights are the published version), no switch under way. Every driver takes part; those
    that have the version drop it."""
    ev = c.evals
    if ev is None:
        return []
    ev.drivers_now(c.sync_receivers())
    if not ev.behind(c.policy_version) or c.policy_version < 1:
        return []
    if c.batch_in_flight is not None or c.rebalance.switching():
        return []
    if c.step % c.cfg.train.sync_every or c.step >= c.cfg.train.steps:
        return []
    return c.weight_sync()


def task_record(prompt: dict[str, Any], t: EvalTask) -> p.EvalTaskRecord:
    return {"task_id": t.task_id, "set_name": t.set_name, "prompt": prompt, "sample": t.sample}


def on_eval_done(c: Run, identity: bytes, msg: p.EvalDone) -> list[Outgoing]:
    if c.known(identity, msg.rank) is None or c.evals is None:
        return []
    result = c.evals.finished(
        msg.rank, msg.round_id, msg.task_id, msg.reward, msg.policy_version, msg.reason
    )
    if result is False:
        c.messages.reject("eval_result")
        return []
    return ended(c, result) if isinstance(result, EvalRecord) else []


def tick(c: Run) -> list[Outgoing]:
    """A round past its timeout, or whose rank no longer drives a rollout replica (a
    layout change took it), ends incomplete."""
    ev = c.evals
    if ev is None:
        return []
    record = ev.tick()
    if record is None and ev.pinned is not None and ev.pinned not in c.sync_receivers():
        record = ev.abandon(f"rank {ev.pinned} left the rollout pool")
    if record is not None:
        return ended(c, record)
    if ev.closing and ev.active is None and c.state == RunState.RUNNING:
        return begin_end(c)  # deferred by a switch or a regroup
    return []


def stopping(c: Run) -> None:
    """The run stops after a checkpoint: the round in flight ends incomplete now ("the run
    stopped"), so that the checkpoint keeps its record. Left running, it could end after
    the checkpoint took the book: in the metrics, but lost to the resumed run (seen in the
    resume test), whose policy is past its version and never evaluates it again."""
    ev = c.evals
    if ev is None or ev.active is None:
        return
    record = ev.abandon("the run stopped")
    if record is not None:
        c.reports.eval_round(record)
    ev.closing = False  # (an end's round: the run stops instead of completing)


def rank_lost(c: Run, rank: int) -> list[Outgoing]:
    if c.evals is None:
        return []
    record = c.evals.rank_lost(rank)
    # (the end's round, if it is due, waits for the regroup the loss calls for: tick)
    return ended(c, record, begin_end_now=False) if record is not None else []


def ended(c: Run, record: EvalRecord, begin_end_now: bool = True) -> list[Outgoing]:
    """A round ended: its figures into the metrics and the reports; the end's round
    completes the run."""
    c.reports.eval_round(record)
    ev = c.evals
    assert ev is not None
    if not ev.closing or c.state != RunState.RUNNING:
        return []
    if not ev.evaluated(c.policy_version):  # a round the last step found running ended
        return begin_end(c) if begin_end_now else []
    ev.closing = False
    return c.finish(RunState.COMPLETED, f"reached step {c.step}")
