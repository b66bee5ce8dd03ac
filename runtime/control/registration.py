"""What rank 0 does with the ranks' own messages: Hello, Ready, Heartbeat, RoleSwitchDone, Bye.

A rank registers (Hello -> Welcome with its role), says it is ready, heartbeats (its state,
its engine's load for the generation scheduler, acks for the samples it sent), reports a
finished role switch and leaves (Bye). The books are
:class:`runtime.control.membership.Membership`.
"""

from __future__ import annotations

from runtime.config.layout import Role
from runtime.config.schema import needs_collective
from runtime.control import lends
from runtime.control.membership import Outgoing, WorkerInfo
from runtime.control.run import Run
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState, WorkerState


def on_hello(c: Run, identity: bytes, msg: p.Hello) -> list[Outgoing]:
    if msg.world_size != c.cfg.world_size:
        c.messages.reject("wrong_world")
        return []
    if not c.members.may_register(identity, msg.rank):
        c.messages.reject("duplicate_rank")
        return []
    c.messages.accept()
    if c.state in TERMINAL or c.state == RunState.STOPPING:
        return [(identity, p.Stop(reason=f"run is {c.state}"))]
    if msg.rank in c.members.lost and needs_collective(c.cfg):
        why = cannot_rejoin(c, msg.rank)
        if why:
            return [(identity, p.Stop(reason=f"rank {msg.rank} was lost; {why}"))]
        c.members.start_rejoining(msg.rank)  # "gone" until the epoch that takes it back
    role = c.layout.role_of(msg.rank).value
    c.members.register(identity, msg, role, c.layout_epoch)
    welcome = p.Welcome(
        rank=msg.rank,
        role=role,
        layout_epoch=c.layout_epoch,
        heartbeat_interval_s=c.cfg.control.heartbeat_interval_s,
        roles=c.epoch_roles(),  # a rejoining rank makes none of this epoch's groups
    )
    return [(identity, welcome)]


def cannot_rejoin(c: Run, rank: int) -> str:
    """Why lost ``rank`` cannot register again now ("" if it can). A rollout rank of a
    running run rejoins at the next epoch, getting the current weights with the rest of
    the pool. A trainer rank (only a data-parallel trainer's, outside the leader's replica
    group, is ever lost: :meth:`Coordinator._trainer_survivable`) rejoins once every rank
    of its replica group has registered again and is ready, between two steps
    (:meth:`Run.ready_to_rejoin`): they receive the trainer state from the replicas that
    stayed (runtime/engines/torch/shard_handoff.py)."""
    if c.state != RunState.RUNNING:
        return f"the run is {c.state}"
    if c.layout.role_of(rank) == Role.ROLLOUT and c.cfg.resources.rollout_gpus_per_replica > 1:
        return "a rank of a tensor-parallel rollout replica cannot rejoin the run yet"
    return ""


def on_ready(c: Run, identity: bytes, msg: p.Ready) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    w.role, w.layout_epoch, w.state = msg.role, msg.layout_epoch, WorkerState.IDLE
    if msg.rank in c.members.rejoining:  # engines up: the next epoch takes it back
        return c.take_back_rejoined()
    if c.state == RunState.STARTING and c.members.all_ready():
        c.start_running()
        if c.policy_version > 0 and not c.cfg.reflow.policy.colocated:
            # Resumed: the rollout engines start from the base model; the leader
            # restored the checkpoint's weights and broadcasts them before any work.
            # (Colocated ranks load their own restored weights before they are ready.)
            return c.weight_sync()
    return []


def on_heartbeat(c: Run, identity: bytes, msg: p.Heartbeat) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    if w.state == WorkerState.SWITCHING and msg.layout_epoch == c.layout_epoch:
        # A rank reports RoleSwitchDone before its next beat; a beat from the new epoch
        # while we still wait means that report was lost: the beat stands in for it.
        switched(c, w, msg.role, msg.layout_epoch, None)
    if w.state not in (WorkerState.STARTING, WorkerState.SWITCHING):
        w.state, w.role, w.layout_epoch = WorkerState(msg.state), msg.role, msg.layout_epoch
    w.rollout_time = (msg.rollout_active_s, msg.rollout_busy_s)
    w.beat_at = now = c.clock()
    if msg.waiting_on != w.waiting_on:
        w.waiting_on, w.waiting_since = msg.waiting_on, now
    if msg.role == Role.ROLLOUT.value and c.layout.role_of(msg.rank) == Role.ROLLOUT:
        c.generation.observe(msg.rank, msg.engine)
        c.engine_profile.observe(msg.rank, now, msg.engine)
        holding = c.data.running_at(msg.rank) > 0
        c.idle.rank_beat(
            msg.rank,
            now,
            msg.rollout_active_s,
            msg.rollout_busy_s,
            msg.rollout_paused_s,
            holding,
            prefill_s=msg.engine.get("prefill_s"),  # an engine that says (the simulator's)
            evaluating=c.evals is not None and c.evals.pinned == msg.rank,
        )
    else:
        c.engine_profile.forget(msg.rank)
    acked, w.to_ack = w.to_ack[: p.MAX_IDS], w.to_ack[p.MAX_IDS :]  # the rest next beat
    ack = p.HeartbeatAck(step=c.step, policy_version=c.policy_version, acked=acked)
    return [(identity, ack)]


def on_switch_done(c: Run, identity: bytes, msg: p.RoleSwitchDone) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    switched(c, w, msg.role, msg.layout_epoch, msg.duration_s, msg.phases)
    return lends.poll(c)  # a lend's switch may be done


def switched(
    c: Run,
    w: WorkerInfo,
    role: str,
    epoch: int,
    duration_s: float | None,
    phases: dict[str, float] | None = None,
) -> None:
    w.role, w.layout_epoch, w.state = role, epoch, WorkerState.IDLE
    c.rebalance.switched(w.rank, epoch, duration_s, phases)


def on_bye(c: Run, identity: bytes, msg: p.Bye) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    w.state = WorkerState.EXITED
    if c.state in (RunState.STARTING, RunState.RUNNING):
        return c.finish(RunState.FAILED, f"rank {msg.rank} left: {msg.reason}")
    c.check_ended()
    return []
