"""The rank-0 coordinator: the run's state machine, and the dispatch of every message.

Pure and synchronous, like vLLM's ``EngineCore``: it never touches a socket or the real
clock. :class:`runtime.rank.control_server.ControlServer` feeds it frames and sends what it
returns; unit tests and the simulator drive it directly with a fake clock.

The coordinator is the :class:`~runtime.control.run.Run` (what rank 0 knows of the run)
that routes each message to the module that handles its concern and keeps time:

- runtime/control/registration.py: Hello, Ready, Heartbeat, RoleSwitchDone, Bye;
- runtime/control/rollout_work.py: WorkRequest, SampleDone, SampleFailed;
- runtime/control/training.py: BatchRequest, StepDone;
- runtime/control/lifecycle.py: CheckpointSaved, graceful stops, the resume state;
- here: the clients' requests (status, rebalance, allocator, stop) and
  :meth:`Coordinator.tick` (liveness, timeouts, retries);
- runtime/control/telemetry.py: the metrics line, ``reflow status``, the summary.

The books are kept by the run's parts: Membership, DataPlane, Rebalancer, Checkpoints and
the GenerationScheduler. Run states are :class:`runtime.transport.states.RunState` (its
docstring draws them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.config.layout import LayoutError, Role
from runtime.config.schema import DATA_PARALLEL_TRAINERS, needs_collective
from runtime.control import (
    colocation,
    eval_work,
    hand_over,
    lends,
    lifecycle,
    registration,
    rollout_work,
    telemetry,
    training,
)
from runtime.control.checkpoints import PARK_TIMEOUT_S, SaveCheckpoint
from runtime.control.membership import Outgoing, WorkerInfo
from runtime.control.run import Run
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState, WorkerState

__all__ = ["Coordinator", "Outgoing", "SaveCheckpoint", "WorkerInfo"]


class Coordinator(Run):
    """A :class:`Run` that takes messages (:meth:`on_frames`, :meth:`handle`: each type to
    its handler in :data:`HANDLERS`) and time (:meth:`tick`), and answers with messages."""

    # --- what the server, the tests and the simulator read --------------------------------

    def status(self) -> dict[str, Any]:
        return telemetry.status(self)

    def summary(self) -> dict[str, Any]:
        return telemetry.summary(self)

    # --- input -------------------------------------------------------------------------

    def on_frames(self, identity: bytes, frames: list[bytes]) -> list[Outgoing]:
        """Decode and handle one message; invalid input is counted and dropped.

        The sender is checked before the body is decoded: a peer that is not a registered,
        live rank (a CLI client, a rank before its Hello, a rank declared dead) may send only
        a single small frame, so decoding costs nothing whoever holds the run's key."""
        if self.members.is_anonymous(identity) and (
            len(frames) != 1 or len(frames[0]) > p.MAX_ANONYMOUS_BYTES
        ):
            self.messages.reject("anonymous_too_large")
            return []
        try:
            msg = p.decode(frames)
        except p.ProtocolError as exc:
            self.messages.reject("malformed", str(exc))
            return []
        return self.handle(identity, msg)

    def handle(self, identity: bytes, msg: p.Message) -> list[Outgoing]:
        handler = HANDLERS.get(type(msg))
        if handler is None:  # a valid message that only the coordinator sends
            self.messages.reject("unexpected")
            return []
        return handler(self, identity, msg)

    # --- client requests ---------------------------------------------------------------

    def _on_status_request(self, identity: bytes, msg: p.StatusRequest) -> list[Outgoing]:
        self.messages.accept()
        return [(identity, p.StatusReply(status=self.status()))]

    def _on_rebalance(self, identity: bytes, msg: p.RebalanceRequest) -> list[Outgoing]:
        self.messages.accept()
        if self.state != RunState.RUNNING:
            return [(identity, p.Reply(ok=False, text=f"run is {self.state}, not RUNNING"))]
        if colocation.is_colocated(self):
            text = "mode=colocated_sync: every rank plays both roles in turn, there is no split"
            return [(identity, p.Reply(ok=False, text=text))]
        try:
            target = self.layout.with_ratio(msg.rollout, msg.trainer)
        except LayoutError as exc:
            return [(identity, p.Reply(ok=False, text=str(exc)))]
        why = self.without_lost(target)
        if why:
            return [(identity, p.Reply(ok=False, text=why))]
        self.rebalance.request(target)
        self.rebalance.placed_by_hand(self.step)
        text = f"rebalance to {target.ratio} accepted; applied at the next sync point"
        now = [] if self.training_started else self.apply_pending_layout()
        return [(identity, p.Reply(ok=True, text=text)), *now]

    def _on_allocator(self, identity: bytes, msg: p.AllocatorRequest) -> list[Outgoing]:
        self.messages.accept()
        if msg.auto and self.cfg.reflow.policy.baseline:
            text = f"mode={self.cfg.reflow.mode} keeps its placement: no allocator"
            return [(identity, p.Reply(ok=False, text=text))]
        self.rebalance.set_auto(msg.auto)
        text = f"automatic rebalancing {'on' if msg.auto else 'off'}"
        return [(identity, p.Reply(ok=True, text=text))]

    def _on_stop_request(self, identity: bytes, msg: p.StopRequest) -> list[Outgoing]:
        self.messages.accept()
        if self.state in TERMINAL:
            return [(identity, p.Reply(ok=True, text=f"run already {self.state}"))]
        out = self.request_stop(msg.reason or "stop requested")
        return [(identity, p.Reply(ok=True, text="stopping")), *out]

    def request_stop(self, reason: str) -> list[Outgoing]:
        """Graceful stop (CLI, SIGTERM, SIGUSR2): runtime/control/lifecycle.py."""
        return lifecycle.request_stop(self, reason)

    # --- resume (runtime/control/lifecycle.py) -------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return lifecycle.coordinator_state(self)

    def load_state_dict(self, state: dict[str, Any], source: str = "") -> None:
        lifecycle.restore(self, state, source)

    def buffer_digest(self) -> dict[str, Any]:
        """Sample ids and checksums of everything the buffer holds, and the queue."""
        return self.data.digest()

    # --- layout ------------------------------------------------------------------------

    # --- time --------------------------------------------------------------------------

    def tick(self) -> list[Outgoing]:
        now = self.clock()
        ctl = self.cfg.control
        out: list[Outgoing] = []
        for w in self.members.silent(now, ctl.register_timeout_s, ctl.heartbeat_timeout_s):
            why = (
                f"rank {w.rank} ({w.role}, pid {w.pid} on {w.node}) sent no heartbeat "
                f"for {now - w.last_seen:.1f} s"
            )
            if w.waiting_on:
                why += f"; its last beat said: waiting on {w.waiting(now)}"
            out += self.lose_rank(w, why, regroup=False)
        out += self.regroup_without_lost()  # once for every rank lost in this tick
        if self.state == RunState.STARTING and now - self.life.started_at > ctl.register_timeout_s:
            out += self.finish(
                RunState.FAILED,
                f"only {self.members.n_ready()} of {self.cfg.world_size} ranks became ready "
                f"within {ctl.register_timeout_s:.0f} s",
            )
        if self.state == RunState.RUNNING and not self.training_started:
            out += self.apply_pending_layout()
        if self.state == RunState.RUNNING and now >= self._next_overdue_check:
            out += self._time_out_work(now)
        if self.trainer_link.retrying:
            out += training.retry_batches(self, now)
        hand_over.expire(self)
        if self.ckpt.pending is not None and self.ckpt.pending.trainer is not None:
            # the trainer's half is in (ok or not): only the drivers' parked rollouts are
            # awaited, bounded by PARK_TIMEOUT_S, not by the checkpoint timeout
            out += self._wait_for_parked(now)
        elif self.ckpt.pending is not None:
            if self.members.leader() is None:
                out += lifecycle.end_checkpoint(self, False, "the trainer leader is gone")
            elif self.ckpt.overdue(now, ctl.checkpoint_timeout_s):
                out += lifecycle.end_checkpoint(
                    self, False, f"no answer within {ctl.checkpoint_timeout_s:.0f} s"
                )
            else:
                out += self._wait_for_parked(now)
        out += eval_work.tick(self)  # a round past its timeout: a colocated phase may end
        out += colocation.advance(self)
        out += lends.poll(self)
        self.check_ended()
        return out

    def _wait_for_parked(self, now: float) -> list[Outgoing]:
        """A stop's checkpoint waits for the rollout drivers' parked rollouts, bounded."""
        self.ckpt.stop_waiting_for(w.rank for w in self.members if w.gone)  # lost: never will
        return lifecycle.end_when_parked(
            self, give_up=self.ckpt.parking_overdue(now, PARK_TIMEOUT_S)
        )

    def _time_out_work(self, now: float) -> list[Outgoing]:
        """Requests out for longer than ``control.request_timeout_s`` go back to the queue
        (a Work lost on its way, a result lost on its way back, an engine that hangs while
        its rank heartbeats); a batch in training that long without a step report fails
        the run, with the reason (a restart from the checkpoint is the remedy)."""
        ctl = self.cfg.control
        self._next_overdue_check = now + min(1.0, ctl.request_timeout_s / 4)
        for sid in self.data.time_out(now - ctl.request_timeout_s):
            self.generation.finished(sid, None)
        if self.batch_in_flight is not None and self.trainer_link.overdue(now, ctl.step_timeout_s):
            return self.finish(
                RunState.FAILED,
                f"no step report for batch {self.batch_in_flight} within "
                f"{ctl.step_timeout_s:.0f} s (control.step_timeout_s) from the trainer leader "
                f"(trainer ranks {self.layout.ranks(Role.TRAINER)})",
            )
        return []

    def undelivered(self, identity: bytes, msg: p.Message) -> None:
        """The server could not hand ``msg`` to ``identity`` (no pipe to that peer, or its
        queue full). Work handed out in it goes back to the queue at once; everything else
        is asked for again by the rank (batches, acks) or repeated (heartbeat acks)."""
        self.messages.undelivered(msg.TYPE)
        rank = self.members.rank_of(identity)
        if isinstance(msg, p.Batch) and rank is not None:
            # Only the leader asks for batches; a trainer replica that missed its copy
            # would leave the leader waiting in the collective: send it again.
            self.trainer_link.missed(identity, msg.batch_id, self.clock())
        if isinstance(msg, p.Work) and rank is not None:
            for r in reversed(msg.requests):  # each goes to the front: keep their order
                if self.data.requeue(r["sample_id"], rank, "undelivered"):
                    self.generation.finished(r["sample_id"], None)

    def lose_rank(self, w: WorkerInfo, why: str, regroup: bool = True) -> list[Outgoing]:
        """``w`` is dead or hung (marked so by the caller). A rank the run can do without
        is absorbed: its work goes back to the front of the queue for the other rollout
        ranks (what it delivered is in the buffer), and with process groups the live
        ranks regroup without it at once (a new epoch, the same roles, it ``"gone"``).
        Otherwise the run fails with the reason."""
        if not self._survivable(w):
            if self.state in (RunState.STARTING, RunState.RUNNING):
                return self.finish(RunState.FAILED, why)
            return []
        in_groups = w.rank not in self.members.lost  # else: registered again, not taken back
        out = self._drop(w, why)
        if self.layout.role_of(w.rank) == Role.TRAINER:
            # its replica group's other ranks hold shards of a replica that is no more:
            # released from the run with it (the data parallelism is one group narrower)
            group = self.layout.groups(Role.TRAINER)[self.layout.group_index(w.rank)]
            for rank in group:
                partner = self.workers.get(rank)
                if partner is not None and not partner.gone:
                    partner.state = WorkerState.EXITED
                    out += self._drop(
                        partner, f"released: its trainer replica {list(group)} lost rank {w.rank}"
                    )
        if needs_collective(self.cfg) and in_groups:
            self.rebalance.regroup_needed()
            if regroup:
                out += self.regroup_without_lost()
        return out

    def _drop(self, w: WorkerInfo, why: str) -> list[Outgoing]:
        """``w`` leaves the run: its work back to the queue, listed in ``lost_ranks``,
        ``"gone"`` in every later epoch's roles (with process groups), told to stop."""
        requeued = self.data.worker_gone(w.rank)
        self.generation.worker_left(w.rank)
        self.idle.forget(w.rank)
        record = {
            "rank": w.rank,
            "role": self.layout.role_of(w.rank).value,
            "reason": why,
            "requeued": requeued,
            "at_step": self.step,
        }
        self.members.declare_lost(record, out_of_groups=needs_collective(self.cfg))
        self.rebalance.forget(w.rank)  # a switch under way no longer waits for it
        ended = eval_work.rank_lost(self, w.rank)  # its eval round, if pinned: incomplete
        return [(w.identity, p.Stop(reason=f"declared lost: {why}")), *ended]

    def _survivable(self, w: WorkerInfo) -> bool:
        """A dead rank the run can go on without: a rollout rank, the driver of another
        rollout replica still alive, and its replica a single rank when process groups
        bind it (the other ranks of a tensor-parallel replica would be left waiting in
        their engine's collectives: a restart from the checkpoint is the remedy); or a
        trainer rank of a data-parallel trainer outside the leader's replica group (see
        :meth:`_trainer_survivable`). Its process groups are rebuilt without it
        (runtime/rank/collective.py)."""
        if self.state != RunState.RUNNING:
            return False
        if self.layout.role_of(w.rank) == Role.TRAINER:
            return self._trainer_survivable(w)
        if needs_collective(self.cfg) and self.cfg.resources.rollout_gpus_per_replica > 1:
            return False
        if colocation.is_colocated(self):  # every rank is in the one trainer group
            return False
        return any(
            self.layout.role_of(x.rank) == Role.ROLLOUT and self.members.drives(x.rank)
            for x in self.members.alive()
        )

    def _trainer_survivable(self, w: WorkerInfo) -> bool:
        """A lost trainer rank outside the leader's replica group, of a data-parallel
        trainer over process groups: the other replicas carry on without its group (the
        leader's holds the run's state and reports the steps; with it lost, or a trainer
        without process groups, the run fails and restarts from its checkpoint)."""
        if not needs_collective(self.cfg) or self.cfg.engine.trainer not in DATA_PARALLEL_TRAINERS:
            return False
        if colocation.is_colocated(self):  # every rank is in the one trainer group
            return False
        return self.layout.group_index(w.rank) != 0 and self.members.leader() is not None

    def _on_peer_lost(self, identity: bytes, msg: p.PeerLost) -> list[Outgoing]:
        """The leader dropped a receiver from a weight sync: declared lost now (its
        heartbeat may still come: a hung engine, a half-dead process). Only the leader
        may say so, of a receiver of the current epoch's sync."""
        if self.known(identity, msg.rank) is None:
            return []
        target = self.workers.get(msg.peer)
        # a report from an earlier epoch counts while the peer is still a receiver (rank 0
        # may have moved on while the leader was syncing)
        known = msg.layout_epoch <= self.layout_epoch
        if msg.rank != 0 or not known or msg.peer not in self.sync_receivers():
            self.messages.reject("bad_peer_lost")
            return []
        if target is None or target.gone:
            return []
        target.state = WorkerState.DEAD
        why = f"rank {msg.peer} dropped from a weight sync by rank 0: {msg.reason}"
        return self.lose_rank(target, why)

    # --- the end -----------------------------------------------------------------------

    def fail(self, reason: str) -> list[Outgoing]:
        return self.finish(RunState.FAILED, reason)

    @property
    def finished(self) -> bool:
        """Terminal, and every rank has left (or the grace period is over)."""
        if self.state not in TERMINAL:
            return False
        assert self.life.ended_at is not None
        grace_over = self.clock() - self.life.ended_at > self.cfg.control.stop_grace_s
        return self.members.all_gone() or grace_over


Handler = Callable[[Coordinator, bytes, Any], list[Outgoing]]
HANDLERS: dict[type[p.Message], Handler] = {
    # the ranks' own
    p.Hello: registration.on_hello,
    p.Ready: registration.on_ready,
    p.Heartbeat: registration.on_heartbeat,
    p.RoleSwitchDone: registration.on_switch_done,
    p.Bye: registration.on_bye,
    p.PeerLost: Coordinator._on_peer_lost,
    # rollout work and training steps
    p.WorkRequest: rollout_work.on_work_request,
    p.SampleDone: rollout_work.on_sample_done,
    p.SampleFailed: rollout_work.on_sample_failed,
    p.BatchRequest: training.on_batch_request,
    p.StepDone: training.on_step_done,
    p.CheckpointSaved: lifecycle.on_checkpoint_saved,
    p.Parked: hand_over.on_parked,
    p.EvalDone: colocation.on_eval_done,
    # clients (reflow status / rebalance / allocator / stop)
    p.StatusRequest: Coordinator._on_status_request,
    p.RebalanceRequest: Coordinator._on_rebalance,
    p.AllocatorRequest: Coordinator._on_allocator,
    p.StopRequest: Coordinator._on_stop_request,
}
