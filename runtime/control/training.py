"""Training steps at rank 0: handing out batches, and what a step report changes.

The trainer leader asks for a batch (``BatchRequest``), every trainer rank gets it, the
leader reports the step (``StepDone``). A report is checked against the batch in flight
before it moves the run on: the step's metrics line, the allocator's window, the weight
sync and a pending layout at sync points, a checkpoint every ``train.checkpoint_every``.
"""

from __future__ import annotations

from runtime.config.layout import Role
from runtime.config.schema import DATA_PARALLEL_TRAINERS
from runtime.control import colocation, eval_work, lends, lifecycle, telemetry
from runtime.control.membership import Outgoing
from runtime.control.replay_buffer import Batch
from runtime.control.run import Run
from runtime.data.micro_batches import sample_plans
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.states import RunState


def on_step_done(c: Run, identity: bytes, msg: p.StepDone) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None or c.state != RunState.RUNNING:
        return []
    if msg.rank != 0 or c.layout.role_of(0) != Role.TRAINER:
        c.messages.reject("step_not_from_leader")
        return []
    if msg.step <= c.step:  # a report sent again (its ack was lost): nothing new
        return []
    # The leader trains one batch per step: the report is for the batch in flight, the
    # next step, and the version that step publishes: one more at a sync point, the same
    # otherwise (a forged step would end or skip the run).
    if msg.step != c.step + 1:
        c.messages.reject("bad_step")
        return []
    if c.batch_in_flight is None or msg.batch_id != c.batch_in_flight:
        c.messages.reject("unknown_batch")
        return []
    if msg.policy_version != c.cfg.train.version_at(msg.step):
        c.messages.reject("bad_policy_version")
        return []
    now = c.clock()
    c.open_trainer_window(now)
    # Until its next request the leader reports, and at a sync point broadcasts weights.
    synced = msg.step % c.cfg.train.sync_every == 0 and msg.step < c.cfg.train.steps
    c.idle.trainer_is("weight_sync" if synced else "step_report", now)
    batch = c.data.finish_step(msg.batch_id, msg.step, msg.policy_version)
    c.counters.trained(batch.samples)
    c.rebalance.count_replay_life(batch.samples[: batch.n_unused], msg.step)
    line = telemetry.step_line(c, msg, batch, now)
    problems = c.data.ledger_problems()
    line["ledger_ok"] = not problems
    if problems:  # a bug, not an input: recorded where a user looks, the run goes on
        c.ledger_violated(problems)
        line["ledger_problems"] = problems
    mark(c, now)
    line.update(c.rebalance.take_role_time())
    transitions = c.rebalance.new_transitions()
    if transitions:
        line["transitions"] = transitions
    saved = c.ckpt.take_unreported()
    if saved:
        line["checkpoints"] = saved
    train = c.cfg.train
    if c.auto_rebalance and c.step < train.steps and c.step % train.sync_every == 0:
        decision = c.rebalance.allocate(c.step)
        if decision is not None:
            line["placement"] = decision
    c.reports.step(line, msg.metrics)
    if c.step >= train.steps:
        out = eval_work.final_round(c)  # the last version's eval: the run completes after
        if c.evals is not None and c.evals.closing:
            return out + colocation.advance(c)  # colocated: a rollout phase plays it
        return c.finish(RunState.COMPLETED, f"reached step {c.step}")
    out: list[Outgoing] = []
    if c.step % train.sync_every == 0 and not colocation.is_colocated(c):
        # Weights first: the sync group of the current layout takes part in the
        # broadcast, then a pending layout (if any) regroups everyone.
        out = c.weight_sync() + c.apply_pending_layout()
        eval_work.after_sync(c, c.step - train.sync_every)
    stop = c.ckpt.take_stop_after_step()
    if stop is not None:
        out += lifecycle.checkpoint_then_stop(c, stop)
    elif train.checkpoint_every and c.step % train.checkpoint_every == 0:
        out += lifecycle.request_checkpoint(c, then_stop=None)
    # colocated: back to the rollout phase, each rank syncing in place (after the
    # checkpoint, which needs the trainer state on the device)
    return out + colocation.advance(c)


def mark(c: Run, now: float) -> None:
    stats = c.data.stats()
    c.rebalance.mark(
        c.step,
        now,
        # fresh samples the trainer can use: groups the sampler rejects (uniform
        # rewards under medium_reward) cost rollout time and feed no batch
        produced=stats["delivered"] - stats["evicted"].get("sampler_rejected", 0),
        consumed=c.counters.consumed_total,
        consumed_tokens=c.counters.consumed_tokens,
        # a rank refused work by the run's rules is not generating at capacity: its busy
        # seconds then would read as a slow rank to the allocator; nor is a replica pinned
        # to an eval round, whose episodes feed no batch (counting them moved rollout
        # GPUs away from a trainer that was the bottleneck: a simulated dapo_math run)
        rollout_busy_s=c.members.rollout_busy_s(now, 2 * c.cfg.control.heartbeat_interval_s)
        - c.idle.throttled_busy_s
        - c.idle.rollout_busy["eval"],
        trainer_idle_s=c.data.trainer_idle_s,
        trainer_starved_s=c.idle.trainer_starved_s(now),
        rollout_active_s=c.idle.rollout_active_s,
        rollout_throttled_s=c.idle.rollout_throttled_s(),
    )


def on_batch_request(c: Run, identity: bytes, msg: p.BatchRequest) -> list[Outgoing]:
    if c.known(identity, msg.rank) is None:
        return []
    if c.state != RunState.RUNNING or c.layout.role_of(msg.rank) != Role.TRAINER:
        return [(identity, p.BatchWait(reason=f"run is {c.state}"))]
    if c.step >= c.cfg.train.steps:  # the last step is trained; the end's eval runs
        return [(identity, p.BatchWait(reason="training done: the last eval runs"))]
    if c.batch_in_flight is not None:
        batch = c.data.batches.get(c.batch_in_flight)
        if msg.rank == 0 and msg.last_batch_id != c.batch_in_flight and batch is not None:
            # The leader asks again without having trained the batch in flight: it was
            # lost on the way. Send it again (trainers skip a batch they already have).
            c.trainer_link.sent_again()
            return send_batch(c, identity, batch)
        return [(identity, p.BatchWait(reason="step report pending"))]
    now = c.clock()
    leader = msg.rank == 0
    if c.rebalance.switching():
        if leader:
            c.idle.trainer_is("role_switch", now)
        return [(identity, p.BatchWait(reason="sync point in progress"))]
    if c.ckpt.busy:
        if leader:
            c.idle.trainer_is("checkpoint", now)
        return [(identity, p.BatchWait(reason="checkpoint in progress"))]
    if leader:
        # between steps: a trainer replica group that registered again joins now
        out = c.take_back_rejoined()
        if out:  # the role switch: the batch after it
            c.idle.trainer_is("role_switch", now)
            return [*out, (identity, p.BatchWait(reason="sync point in progress"))]
        # a rank whose eval round is done gets the current version before the next batch
        caught_up = eval_work.catch_up(c)
        if caught_up:
            c.idle.trainer_is("weight_sync", now)
            return [*caught_up, (identity, p.BatchWait(reason="weight sync after an eval"))]
    batch = c.data.next_batch()
    if batch is None:
        lent: list[Outgoing] = []
        if leader:
            cause = starved_by(c)
            # short of fresh samples with rollout unhindered, for the batch's fresh share
            # or for the rest that replay cannot fill: more rollout ranks make them sooner
            lendable = cause == "fresh_short" or (
                cause == "replay_short" and not c.idle.held_back()
            )
            lends.verdict(c, starved_for_fresh=lendable)
            c.idle.trainer_is(cause, now)
            if lendable:
                lent = lends.maybe_lend(c)  # its groups may generate while it waits
        return [*lent, (identity, p.BatchWait(reason="waiting for samples"))]
    if leader:
        lends.verdict(c, starved_for_fresh=False)
    c.idle.trainer_is(None, now)
    c.trainer_link.sent(now)  # the data plane holds it as the batch in flight
    return send_batch(c, identity, batch)


def starved_by(c: Run) -> str:
    """Why no batch could be made, as a trainer idle cause (runtime/control/idle.py)."""
    short = c.data.shortfall
    if short == "fresh":
        return "rollout_held" if c.idle.held_back() else "fresh_short"
    return "replay_short" if short == "replay" else "sampler_short"


def batch_messages(c: Run, batch: Batch) -> dict[int, p.Batch]:
    """The batch message of each trainer rank: a data-parallel trainer's ranks get only
    the samples they train, with the plan they follow (runtime/data/micro_batches.py: the
    micro-batches, and the normalisers of each update); other trainers get the whole
    batch. Split over the epoch's trainer ranks: a lost trainer replica's share goes to
    the others."""
    trainers = c.trainer_ranks()
    if c.cfg.engine.trainer not in DATA_PARALLEL_TRAINERS:
        whole = wire.batch_message(batch)
        return dict.fromkeys(trainers, whole)
    t = c.cfg.train
    parts = sample_plans(batch.samples, t.mini_batches, len(trainers), t.micro_batch_tokens)
    return {
        rank: wire.batch_message(batch, part) for rank, part in zip(trainers, parts, strict=True)
    }


def send_batch(c: Run, identity: bytes, batch: Batch) -> list[Outgoing]:
    # Every trainer rank gets its share of the batch (data parallelism); the leader,
    # which asked, reports the step.
    messages = batch_messages(c, batch)
    out: list[Outgoing] = []
    for rank, msg in messages.items():
        w = c.workers[rank]
        if not w.gone:
            out.append((w.identity, msg))
    # the asker first (the leader)
    return sorted(out, key=lambda x: x[0] != identity)


def retry_batches(c: Run, now: float) -> list[Outgoing]:
    """The copies of the batch in training that trainer ranks missed, due again now."""
    out: list[Outgoing] = []
    for identity, batch_id in c.trainer_link.due(now).items():
        rank = c.members.rank_of(identity)
        batch = c.data.batches.get(batch_id)
        if batch is None or batch_id != c.batch_in_flight or rank is None:
            continue  # trained or abandoned meanwhile
        if c.workers[rank].gone:
            continue
        c.trainer_link.sent_again()
        out.append((identity, batch_messages(c, batch)[rank]))
    return out
