"""The rank-0 coordinator: the run's state machine, and the dispatch of every message.

Pure and synchronous, like vLLM's ``EngineCore``: it never touches a socket or the real
clock. :class:`runtime.transport.server.ControlServer` feeds it frames and sends what it
returns; unit tests and the simulator drive it directly with a fake clock.

The coordinator decides; its parts keep the books:

- :class:`~runtime.control.membership.Membership`: who is registered, who went silent;
- :class:`~runtime.control.data_plane.DataPlane`: requests, samples, the replay buffer;
- :class:`~runtime.control.rebalance.Rebalancer`: the layout, its changes, the allocator;
- :class:`~runtime.control.lifecycle.Checkpoints`: checkpoint and stop sequencing;
- :class:`~runtime.control.scheduling.generation.GenerationScheduler`: concurrency caps
  and routing;
- :mod:`runtime.control.telemetry`: the metrics line, ``reflow status``, the summary.

Run states are :class:`runtime.transport.states.RunState` (its docstring draws them).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from runtime.config.layout import Layout, LayoutError, Role, parse_ratio
from runtime.config.schema import Config
from runtime.control import lifecycle, membership, rollout_work, telemetry, training
from runtime.control.data_plane import DataPlane
from runtime.control.decode_rates import EngineRateProfile
from runtime.control.lifecycle import Checkpoints, SaveCheckpoint
from runtime.control.membership import Membership, Outgoing, WorkerInfo
from runtime.control.rebalance import Rebalancer
from runtime.control.sample_check import RunBounds
from runtime.control.scheduling import WindowStats
from runtime.control.scheduling.concurrency import AimdSettings
from runtime.control.scheduling.generation import GenerationScheduler
from runtime.engines.registry import needs_collective
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState, WorkerState

__all__ = ["Coordinator", "Outgoing", "SaveCheckpoint", "WorkerInfo"]


class Coordinator:
    def __init__(
        self,
        cfg: Config,
        *,
        run: str,
        prompts: Iterator[dict[str, Any]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        save_checkpoint: SaveCheckpoint | None = None,
        vocab_size: int | None = None,
    ) -> None:
        """``vocab_size``: the rollout model's vocabulary, the bound on every token id a
        sample may carry (None: any non-negative id, as for simulated engines)."""
        self.cfg = cfg
        self.run = run
        self.clock = clock
        self.wall = wall
        self.bounds = RunBounds(cfg.model.max_seq_len, vocab_size)
        res, sch = cfg.resources, cfg.scheduler
        assert res.initial_ratio is not None, "config not validated"
        rollout, trainer = parse_ratio(res.initial_ratio)
        layout = Layout.from_ratio(
            rollout,
            trainer,
            world_size=cfg.world_size,
            gpus_per_node=res.gpus_per_node,
            trainer_group_size=res.trainer_gpus_per_replica,
            rollout_group_size=res.rollout_gpus_per_replica,
        )
        self.state = RunState.STARTING
        self.reason = ""
        self.step = 0
        self.policy_version = 0
        self.training_started = False
        self.started_at = clock()
        self.ended_at: float | None = None
        self.attempt = 1  # 1 + the number of resumes of this run
        self.failed_while_training = False
        self.resumed: dict[str, Any] | None = None

        self.members = Membership(cfg.world_size, clock)
        self.data = DataPlane(cfg, prompts if prompts is not None else iter(()), clock)
        sigma = cfg.reflow.sigma if self.data.replay_enabled else 0.0
        self.rebalance = Rebalancer(cfg, layout, clock, sigma)
        self.ckpt = Checkpoints(save_checkpoint, clock)
        self.generation = GenerationScheduler(
            clock,
            AimdSettings(
                min_cap=sch.min_concurrency,
                max_cap=sch.max_concurrency,
                target_util=sch.target_kv_util,
            ),
            interval_s=sch.cap_interval_s,
            adaptive_caps=sch.adaptive_caps,
            token_admission=sch.token_admission,
        )
        self.engine_profile = EngineRateProfile()
        self.counters = telemetry.StepCounters()

        # batches: the one in training, and copies a trainer replica missed
        self.batch_in_flight: int | None = None
        self.batch_sent_at = 0.0
        self.batch_resent = 0
        self.batch_retry: dict[bytes, int] = {}  # trainer identity -> batch id to send again
        self._next_overdue_check = 0.0
        # control-plane accounting
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.undeliverable: Counter[str] = Counter()  # replies no pipe would take, by type
        # reports
        self.last_metrics: dict[str, float] = {}
        self.metrics_log: list[dict[str, Any]] = []  # drained into metrics.jsonl by the server
        self.samples_log: list[dict[str, Any]] = []  # into samples.jsonl (logging.samples)
        self.all_metrics: list[dict[str, Any]] = []
        self.evals: dict[str, float] = {}
        self.lost_ranks: list[dict[str, Any]] = []  # dead rollout ranks the run survived
        self.ledger_violations: list[dict[str, Any]] = []
        on = functools.partial
        self._handlers: dict[type[p.Message], Callable[[bytes, Any], list[Outgoing]]] = {
            # membership
            p.Hello: on(membership.on_hello, self),
            p.Ready: on(membership.on_ready, self),
            p.Heartbeat: on(membership.on_heartbeat, self),
            p.RoleSwitchDone: on(membership.on_switch_done, self),
            p.Bye: on(membership.on_bye, self),
            # rollout work and training steps
            p.WorkRequest: on(rollout_work.on_work_request, self),
            p.SampleDone: on(rollout_work.on_sample_done, self),
            p.SampleFailed: on(rollout_work.on_sample_failed, self),
            p.BatchRequest: on(training.on_batch_request, self),
            p.StepDone: on(training.on_step_done, self),
            p.CheckpointSaved: on(lifecycle.on_checkpoint_saved, self),
            # clients (reflow status / rebalance / allocator / stop)
            p.StatusRequest: self._on_status_request,
            p.RebalanceRequest: self._on_rebalance,
            p.AllocatorRequest: self._on_allocator,
            p.StopRequest: self._on_stop_request,
        }

    # --- what the server, the tests and the simulator read --------------------------------

    @property
    def layout(self) -> Layout:
        return self.rebalance.layout

    @property
    def layout_epoch(self) -> int:
        return self.rebalance.epoch

    @property
    def workers(self) -> dict[int, WorkerInfo]:
        return self.members.workers

    @property
    def auto_rebalance(self) -> bool:
        return self.rebalance.auto

    @property
    def generated_tokens(self) -> int:
        return self.counters.generated_tokens

    @property
    def checkpoint_pending(self) -> dict[str, Any] | None:
        return self.ckpt.pending

    @property
    def checkpoints(self) -> list[dict[str, Any]]:
        return self.ckpt.records

    def status(self) -> dict[str, Any]:
        return telemetry.status(self)

    def summary(self) -> dict[str, Any]:
        return telemetry.summary(self)

    def rollout_idle_ratio(self) -> float:
        return self.members.rollout_idle_ratio()

    # --- input -------------------------------------------------------------------------

    def on_frames(self, identity: bytes, frames: list[bytes]) -> list[Outgoing]:
        """Decode and handle one message; invalid input is counted and dropped.

        The sender is checked before the body is decoded: a peer that is not a registered,
        live rank (a CLI client, a rank before its Hello, a rank declared dead) may send only
        a single small frame, so decoding costs nothing whoever holds the run's key."""
        if self.members.is_anonymous(identity) and (
            len(frames) != 1 or len(frames[0]) > p.MAX_ANONYMOUS_BYTES
        ):
            self.reject("anonymous_too_large")
            return []
        try:
            msg = p.decode(frames)
        except p.ProtocolError:
            self.reject("malformed")
            return []
        return self.handle(identity, msg)

    def handle(self, identity: bytes, msg: p.Message) -> list[Outgoing]:
        handler = self._handlers.get(type(msg))
        if handler is None:  # a valid message that only the coordinator sends
            self.reject("unexpected")
            return []
        return handler(identity, msg)

    def reject(self, category: str) -> None:
        self.rejected[category] += 1

    def known(self, identity: bytes, rank: int) -> WorkerInfo | None:
        """The registered, live worker behind a message, or None (counted) if it is not."""
        w = self.members.sender(identity, rank)
        if isinstance(w, str):
            self.reject(w)
            return None
        self.accepted += 1
        return w

    # --- what the handlers in membership, training and rollout_work call back -------------

    def window(self) -> WindowStats | None:
        """The allocator's view of the last steps (tests and benchmarks read it)."""
        return self.rebalance.window()

    def weight_sync(self) -> list[Outgoing]:
        """Tell the trainer leader and every rollout rank to run the weight broadcast."""
        msg = p.WeightSync(policy_version=self.policy_version, layout_epoch=self.layout_epoch)
        return self.members.send(msg, {0, *self.layout.ranks(Role.ROLLOUT)})

    # --- client requests ---------------------------------------------------------------

    def _on_status_request(self, identity: bytes, msg: p.StatusRequest) -> list[Outgoing]:
        self.accepted += 1
        return [(identity, p.StatusReply(status=self.status()))]

    def _on_rebalance(self, identity: bytes, msg: p.RebalanceRequest) -> list[Outgoing]:
        self.accepted += 1
        if self.state != RunState.RUNNING:
            return [(identity, p.Reply(ok=False, text=f"run is {self.state}, not RUNNING"))]
        try:
            target = self.layout.with_ratio(msg.rollout, msg.trainer)
        except LayoutError as exc:
            return [(identity, p.Reply(ok=False, text=str(exc)))]
        self.rebalance.request(target)
        self.rebalance.allocator.changed(self.step)  # a manual placement restarts the cooldown
        text = f"rebalance to {target.ratio} accepted; applied at the next sync point"
        now = [] if self.training_started else self.apply_pending_layout()
        return [(identity, p.Reply(ok=True, text=text)), *now]

    def _on_allocator(self, identity: bytes, msg: p.AllocatorRequest) -> list[Outgoing]:
        self.accepted += 1
        self.rebalance.auto = msg.auto
        text = f"automatic rebalancing {'on' if msg.auto else 'off'}"
        return [(identity, p.Reply(ok=True, text=text))]

    def _on_stop_request(self, identity: bytes, msg: p.StopRequest) -> list[Outgoing]:
        self.accepted += 1
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
        return lifecycle.buffer_digest(self)

    # --- layout ------------------------------------------------------------------------

    def apply_pending_layout(self) -> list[Outgoing]:
        """Apply a pending layout at a synchronization point.

        Until training has started every moment is a sync point; afterwards the trainer's
        step reports at multiples of ``sync_every`` are.
        """
        alive = self.members.alive()
        if not self.rebalance.apply_pending(w.rank for w in alive):
            return []
        target = self.layout
        for w in alive:
            if w.role != target.role_of(w.rank).value:
                w.state = WorkerState.SWITCHING
                # A rank leaving the rollout pool drops its in-flight generations; their
                # requests go back to the front of the queue, so no sample is lost.
                self.data.worker_gone(w.rank)
                self.generation.worker_left(w.rank)
        roles = [r.value for r in target.roles()]
        return self.members.send(p.RoleSwitch(layout_epoch=self.layout_epoch, roles=roles))

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
            if self._survivable(w):
                # Its work goes back to the front of the queue; the other rollout ranks
                # take it. What it delivered before dying is in the buffer.
                requeued = self.data.worker_gone(w.rank)
                self.generation.worker_left(w.rank)
                self.lost_ranks.append(
                    {"rank": w.rank, "reason": why, "requeued": requeued, "at_step": self.step}
                )
            elif self.state in (RunState.STARTING, RunState.RUNNING):
                out += self.finish(RunState.FAILED, why)
        if self.state == RunState.STARTING and now - self.started_at > ctl.register_timeout_s:
            out += self.finish(
                RunState.FAILED,
                f"only {self.members.n_ready()} of {self.cfg.world_size} ranks became ready "
                f"within {ctl.register_timeout_s:.0f} s",
            )
        if self.state == RunState.RUNNING and not self.training_started:
            out += self.apply_pending_layout()
        if self.state == RunState.RUNNING and now >= self._next_overdue_check:
            out += self._time_out_work(now)
        if self.batch_retry:
            out += training.retry_batches(self)
        if self.ckpt.pending is not None:
            if self.members.leader() is None:
                out += lifecycle.end_checkpoint(self, False, "the trainer leader is gone")
            elif self.ckpt.overdue(now, ctl.checkpoint_timeout_s):
                out += lifecycle.end_checkpoint(
                    self, False, f"no answer within {ctl.checkpoint_timeout_s:.0f} s"
                )
        self.check_ended()
        return out

    def _time_out_work(self, now: float) -> list[Outgoing]:
        """Requests out for longer than ``control.request_timeout_s`` go back to the queue
        (a Work lost on its way, a result lost on its way back, an engine that hangs while
        its rank heartbeats); a batch in training that long without a step report fails
        the run, with the reason (a restart from the checkpoint is the remedy)."""
        ctl = self.cfg.control
        self._next_overdue_check = now + min(1.0, ctl.request_timeout_s / 4)
        for sid, rank in self.data.dispatcher.overdue(now - ctl.request_timeout_s):
            self.data.dispatcher.requeue(sid, rank, "timeout")
            self.generation.finished(sid, None)
        if self.batch_in_flight is not None and now - self.batch_sent_at > ctl.step_timeout_s:
            return self.finish(
                RunState.FAILED,
                f"no step report for batch {self.batch_in_flight} within "
                f"{ctl.step_timeout_s:.0f} s (control.step_timeout_s)",
            )
        return []

    def undelivered(self, identity: bytes, msg: p.Message) -> None:
        """The server could not hand ``msg`` to ``identity`` (no pipe to that peer, or its
        queue full). Work handed out in it goes back to the queue at once; everything else
        is asked for again by the rank (batches, acks) or repeated (heartbeat acks)."""
        self.undeliverable[msg.TYPE] += 1
        rank = self.members.rank_of(identity)
        if isinstance(msg, p.Batch) and rank is not None:
            # Only the leader asks for batches; a trainer replica that missed its copy
            # would leave the leader waiting in the collective: send it again next tick.
            self.batch_retry[identity] = msg.batch_id
        if isinstance(msg, p.Work) and rank is not None:
            for r in reversed(msg.requests):  # each goes to the front: keep their order
                if self.data.dispatcher.requeue(r["sample_id"], rank, "undelivered"):
                    self.generation.finished(r["sample_id"], None)

    def _survivable(self, w: WorkerInfo) -> bool:
        """A dead rank the run can go on without: a rollout rank, other rollout ranks still
        alive, and no process group binding it (a torch.distributed group cannot shrink:
        its next collective would wait for the dead member)."""
        if self.state != RunState.RUNNING or self.layout.role_of(w.rank) != Role.ROLLOUT:
            return False
        if needs_collective(self.cfg):
            return False
        return any(self.layout.role_of(x.rank) == Role.ROLLOUT for x in self.members.alive())

    # --- the end -----------------------------------------------------------------------

    def fail(self, reason: str) -> list[Outgoing]:
        return self.finish(RunState.FAILED, reason)

    def finish(self, state: RunState, reason: str) -> list[Outgoing]:
        if self.state in TERMINAL:
            return []
        # A rank lost or failing mid-training is what a restart from the last checkpoint
        # is for; failing to start (or a bad recipe) would fail the same way again.
        self.failed_while_training = state == RunState.FAILED and self.training_started
        self.state, self.reason = state, reason
        self.ended_at = self.clock()
        return self.members.send(p.Stop(reason=reason))

    def check_ended(self) -> None:
        if self.state == RunState.STOPPING and self.members.all_gone():
            self.state, self.ended_at = RunState.STOPPED, self.clock()

    @property
    def finished(self) -> bool:
        """Terminal, and every rank has left (or the grace period is over)."""
        if self.state not in TERMINAL:
            return False
        assert self.ended_at is not None
        grace_over = self.clock() - self.ended_at > self.cfg.control.stop_grace_s
        return self.members.all_gone() or grace_over
