"""Every rank is a :class:`HybridWorker`: it registers with rank 0, plays the role it is
given, heartbeats, and switches roles when the coordinator broadcasts a new layout.

The worker's ZeroMQ socket is a DEALER with the run's CURVE client key. Messages from the
coordinator are validated like any other input; invalid ones are logged and dropped.

Delivery is at least once for what the run cannot lose: every ``SampleDone`` and
``SampleFailed`` is kept until rank 0 acknowledges its sample id (``HeartbeatAck.acked``),
the leader's last ``StepDone`` until a ``HeartbeatAck`` shows that step; both are sent
again while unacknowledged (rank 0 recognises a result it already has). A send that
cannot go out now (no connection: ``zmq.Again``) is not dropped either: it is retried.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TYPE_CHECKING

import zmq

from runtime.config.layout import LayoutChange, group_roles, rollout_drivers
from runtime.config.schema import Config
from runtime.rank.coordinator_link import CoordinatorLink
from runtime.rank.rollout_loop import RolloutSide
from runtime.rank.sides import CannotCheckpoint, RoleSide
from runtime.store import checkpoint
from runtime.store.run_dir import RunPaths, read_json
from runtime.transport import protocol as p
from runtime.transport.auth import CLIENT, load_keypair, secure_client

if TYPE_CHECKING:  # torch is imported only by ranks that join a process group
    from runtime.rank.collective import Collective

log = logging.getLogger(__name__)


class WorkerError(RuntimeError):
    """The rank cannot take part in the run (no coordinator, rejected, lost contact)."""


def wait_for_control(paths: RunPaths, timeout_s: float, attempt: str = "") -> dict:
    """Rank 0 publishes control.json once it listens; other ranks wait for it.

    ``attempt`` names this start of the job (a requeued or resumed run has a new one):
    a control.json left by an earlier attempt is not ours, so we wait for rank 0's."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            control = read_json(paths.control)
            if control.get("attempt", "") != attempt:
                raise ValueError("an earlier attempt's")
            if "failed" in control:
                raise WorkerError(control["failed"])
            return control
        except (FileNotFoundError, ValueError):
            if time.monotonic() > deadline:
                raise WorkerError(
                    f"{paths.control}: rank 0 did not publish its address within {timeout_s:.0f} s"
                ) from None
            time.sleep(0.1)


class HybridWorker:
    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        paths: RunPaths,
        cfg: Config,
        make_sides: Callable[[Collective | None], dict[str, RoleSide]],
        make_collective: Callable[[], Collective | None] = lambda: None,
        node: str | None = None,
        on_stop_signal=None,
        attempt: str = "",
    ) -> None:
        self.attempt = attempt
        self.colocated = cfg.reflow.policy.colocated
        self.resume: str | None = None  # checkpoint folder rank 0 resumes from
        self.rank = rank
        self.world_size = world_size
        self.paths = paths
        self.cfg = cfg
        self._make_sides = make_sides
        self._make_collective = make_collective
        self.collective: Collective | None = None
        self.sides: dict[str, RoleSide] = {}
        self.roles: tuple[str, ...] = ()
        self.node = node or socket.gethostname()
        self.role: str | None = None
        self.layout_epoch = 0
        self.stop_reason: str | None = None
        self._signal_reason: str | None = None
        self._on_stop_signal = on_stop_signal
        self.heartbeat_interval = cfg.control.heartbeat_interval_s
        self.last_ack = time.monotonic()
        # unanswered this long after the last send: sent again (acks come with each beat)
        self.link = CoordinatorLink(resend_after_s=5 * cfg.control.heartbeat_interval_s)
        self.rollout_active_s = 0.0
        self.rollout_busy_s = 0.0
        self.waiting_on = ""  # what a blocking call under way waits on (see _waiting)
        self.preempted = False
        self.preempt_handler: object = None

    # --- signals -----------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        # submitit's own USR2 handler (checkpoint + requeue on Slurm) is kept for later:
        # the run saves its checkpoint first, then rank 0 hands over to it.
        self.preempt_handler = signal.getsignal(signal.SIGUSR2)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGUSR2:  # Slurm's warning: preemption or the time limit
            self.preempted = True
        self._signal_reason = f"rank {self.rank} got {signal.Signals(signum).name}"
        if self._on_stop_signal is not None:
            self._on_stop_signal(self._signal_reason)

    # --- main loop ---------------------------------------------------------------------

    def run(self) -> str:
        """Serve until told to stop; returns the coordinator's stop reason."""
        control = wait_for_control(self.paths, self.cfg.control.register_timeout_s, self.attempt)
        self.resume = control.get("resume")
        keys = load_keypair(self.paths.keys, CLIENT)
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, f"rank-{self.rank}-{os.getpid()}".encode())
        sock.setsockopt(zmq.LINGER, 2000)
        secure_client(sock, keys, control["server_public"].encode())
        sock.connect(control["address"])
        self.link.sock = sock
        try:
            self._register()
            try:
                self._serve()
            except WorkerError:
                raise
            except Exception as exc:
                # An engine or collective failure: tell rank 0 why (it fails the run at
                # once instead of waiting for the heartbeat timeout), then leave.
                during = f" while waiting on {self.waiting_on}" if self.waiting_on else ""
                reason = f"rank {self.rank}{during}: {type(exc).__name__}: {exc}"[:1000]
                log.exception("%s", reason)
                self._send(p.Bye(rank=self.rank, reason=reason))
                raise WorkerError(reason) from exc
        finally:
            if self.role is not None:
                self.sides[self.role].deactivate()
            for side in self.sides.values():
                try:
                    side.close()
                except Exception:  # exiting anyway; say why, do not mask the real error
                    log.exception("closing the %s side failed", side.name)
            if self.collective is not None:
                self.collective.close()
            sock.close()
            ctx.term()
        return self.stop_reason or ""

    def _beat(self) -> None:
        self._send(heartbeat(self))

    @contextlib.contextmanager
    def _waiting(self, what: str) -> Iterator[None]:
        """A blocking call ahead: rank 0 hears what it waits on, and for whom, before it
        starts (heartbeats stop while it blocks); a failure inside names it: the label
        stays set when the call raises, for the rank's report of the failure (nothing
        between here and :meth:`run` catches it; code that did would clear it)."""
        self.waiting_on = what[: p.MAX_WAIT_LABEL]
        self._beat()
        yield
        self.waiting_on = ""

    def _send(self, msg: p.Message) -> bool:
        return self.link.send(msg)

    def _register(self) -> None:
        timeout = self.cfg.control.register_timeout_s
        deadline = time.monotonic() + timeout
        hello = p.Hello(rank=self.rank, world_size=self.world_size, node=self.node, pid=os.getpid())
        next_hello = 0.0
        while True:
            now = time.monotonic()
            if now > deadline:
                raise WorkerError(f"rank {self.rank}: no answer from rank 0 within {timeout:.0f} s")
            if self._signal_reason is not None:
                raise WorkerError(f"{self._signal_reason} before registering")
            if now >= next_hello:  # repeat: a HELLO sent before rank 0 listened is not lost
                self._send(hello)
                next_hello = now + 2.0
            msg = self.link.recv(100)
            if isinstance(msg, p.Welcome) and msg.rank == self.rank:
                # Engines are built only once rank 0 knows us, so a rank whose engine cannot
                # start says why (Bye) instead of silently missing the registration.
                try:
                    if len(msg.roles) != self.world_size:
                        raise WorkerError(f"rank 0 sent a layout of {len(msg.roles)} ranks")
                    log.info("rank %d welcomed at layout epoch %d", self.rank, msg.layout_epoch)
                    # The process group first (every rank joins it now), then the engines.
                    self.collective = self._make_collective()
                    if self.collective is not None:
                        self.collective.regroup(msg.layout_epoch, group_roles(self.cfg, msg.roles))
                    self.sides = self._make_sides(self.collective)
                    for side in self.sides.values():
                        side.attach(self._send, self.rank, self._beat)
                    if self.resume:
                        self._restore(self.resume)
                        if self.colocated:  # its engine starts from the base model
                            exported = export_engine_weights(self.sides)
                            if exported is not None:
                                load_in_place(self.sides, *exported)
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    self._send(p.Bye(rank=self.rank, reason=reason))
                    raise WorkerError(f"rank {self.rank}: {reason}") from exc
                self.heartbeat_interval = msg.heartbeat_interval_s
                self.layout_epoch = msg.layout_epoch
                self.roles = tuple(msg.roles)
                self._enter(msg.role)
                self._send(p.Ready(rank=self.rank, role=msg.role, layout_epoch=self.layout_epoch))
                self.last_ack = time.monotonic()
                log.info("rank %d registered as %s", self.rank, msg.role)
                return
            if isinstance(msg, p.Stop):
                raise WorkerError(f"rank {self.rank}: refused by rank 0: {msg.reason}")

    def _restore(self, name: str) -> None:
        """Sides with state (trainers) load it from the checkpoint rank 0 resumes from."""
        info = checkpoint.find(self.paths.checkpoints, name)
        for side in self.sides.values():
            side.restore(info.path)
        log.info("rank %d restored %s (step %d)", self.rank, info.name, info.step)

    def _checkpoint(self, step: int) -> None:
        """Rank 0 asks every trainer rank (us) for its part of checkpoint ``step``: the
        side writes its shards into the staging folder (the leader makes the folder), and
        the leader reports for the group."""
        side = self.sides["trainer"]
        ok, error = False, ""
        try:
            side.save_checkpoint(self.paths.checkpoints, step)
            ok = True
        except CannotCheckpoint:
            error = f"engine.trainer {self.cfg.engine.trainer!r} cannot checkpoint"
        except Exception as exc:  # reported; the run goes on without this checkpoint
            log.exception("checkpoint %d failed", step)
            error = f"{type(exc).__name__}: {exc}"[:1000]
        if side.leader:
            self._send(p.CheckpointSaved(rank=self.rank, step=step, ok=ok, error=error))

    def _enter(self, role: str, phases: dict[str, float] | None = None) -> None:
        """Play ``role``: the side left is offloaded, the side taken woken (timed into
        ``phases`` when given)."""
        if self.role == role:
            return
        start = time.perf_counter()
        if self.role is not None:
            self.sides[self.role].deactivate()
        else:  # first role: the other side starts asleep (vLLM sleep mode on CUDA)
            for name, side in self.sides.items():
                if name != role:
                    side.deactivate()
        woken = time.perf_counter()
        self.sides[role].activate()
        if phases is not None:
            phases["offload"] = woken - start
            phases["wake"] = time.perf_counter() - woken
        self.role = role

    def _switch(self, change: LayoutChange) -> dict[str, float]:
        """Take up a new layout; returns the seconds of each phase (protocol.SWITCH_PHASES).

        Every rank regroups (collectively), then the sides move state: new trainer replicas
        get theirs from the current ones, new rollout ranks the leader's weights."""
        if self.colocated:
            return self._switch_phase(change.after[self.rank])
        phases: dict[str, float] = {}
        if self.role == "rollout" and change.after[self.rank] != "rollout":
            # what runs here goes on elsewhere (runtime/control/hand_over.py); in the
            # switch's duration, in none of its phases
            self.sides["rollout"].hand_over()
        self._enter(change.after[self.rank], phases)
        prepared = time.perf_counter()
        if self.collective is not None:
            self.collective.regroup(change.epoch, change.after)
        regrouped = time.perf_counter()
        self.sides["trainer"].on_layout(change)
        moved = time.perf_counter()
        self.sides["rollout"].on_layout(change)
        loaded = time.perf_counter()
        phases["regroup"] = regrouped - prepared
        phases["state_transfer"] = moved - regrouped
        phases["weight_load"] = loaded - moved
        return phases

    def _switch_phase(self, role: str) -> dict[str, float]:
        """Mode colocated_sync (runtime/control/colocation.py): no group or state moves.
        Back to rollout the rank copies its trainer's new weights to the host (sharded:
        every rank gathers them), offloads the trainer, wakes its engine, loads them."""
        phases: dict[str, float] = {}
        exported = None
        start = time.perf_counter()
        if role == "rollout":
            exported = export_engine_weights(self.sides)
        export_s = time.perf_counter() - start
        self._enter(role, phases)
        start = time.perf_counter()
        if exported is not None:
            load_in_place(self.sides, *exported)
            phases["weight_load"] = export_s + time.perf_counter() - start
        return phases

    def _serve(self) -> None:
        assert self.role is not None
        next_beat = 0.0
        last_tick = time.monotonic()
        asked_stop = False
        lost_after = self.cfg.control.heartbeat_timeout_s
        while self.stop_reason is None:
            now = time.monotonic()
            if now - last_tick > self.heartbeat_interval:
                # We were busy (a long step, an engine call), not listening: that time is
                # not silence from rank 0.
                self.last_ack += now - last_tick
            if self._signal_reason is not None and not asked_stop:
                # Ask rank 0 to stop the whole run; we leave when it says so.
                self._send(p.StopRequest(reason=self._signal_reason))
                asked_stop = True
            if self.role == "rollout":  # for the rollout idle ratio
                dt = now - last_tick
                self.rollout_active_s += dt
                if self.sides["rollout"].state == "busy":
                    self.rollout_busy_s += dt
            last_tick = now
            if now >= next_beat:
                self.link.resend_unacked(now)
                self._beat()
                next_beat = now + self.heartbeat_interval
            if now - self.last_ack > lost_after:
                raise WorkerError(
                    f"rank {self.rank}: lost contact with rank 0 (no answer for {lost_after:.0f} s)"
                )
            self.sides[self.role].step()
            msg = self.link.recv(5 if self.sides[self.role].state == "busy" else 50)
            if msg is not None:
                self._handle(msg)
        self._send(p.Bye(rank=self.rank, reason=self.stop_reason))

    def _handle(self, msg: p.Message) -> None:
        if isinstance(msg, p.HeartbeatAck):
            self.last_ack = time.monotonic()
            self.link.on_ack(msg)
            assert self.role is not None
            self.sides[self.role].on_message(msg)
        elif isinstance(msg, (p.Batch, p.WeightSync, p.Park)):
            assert self.role is not None
            tp = self.cfg.resources.rollout_gpus_per_replica
            with self._waiting(wait_label(msg, self.rank, self.roles, tp)):
                self.sides[self.role].on_message(msg)
        elif isinstance(msg, (p.Work, p.EvalWork, p.BatchWait)):
            assert self.role is not None
            self.sides[self.role].on_message(msg)
        elif isinstance(msg, (p.RoleSwitch, p.Lend)):
            self.last_ack = time.monotonic()
            if len(msg.roles) != self.world_size or msg.layout_epoch <= self.layout_epoch:
                log.warning("ignoring role switch %s", msg)
                return
            start = time.perf_counter()
            old_role = self.role
            change = LayoutChange(msg.layout_epoch, self.roles, tuple(msg.roles))
            lend = isinstance(msg, p.Lend)
            if change.after[self.rank] == p.GONE_ROLE:  # registered again, not taken back
                return follow_gone(self, change, regroup=not lend)
            with self._waiting(wait_label(msg, self.rank, change.after)):
                phases = lend_switch(self, change, msg.lent) if lend else self._switch(change)
            self.layout_epoch, self.roles = msg.layout_epoch, change.after
            took = time.perf_counter() - start
            log.info(
                "epoch %d: %s -> %s in %.3f s (%s)",
                msg.layout_epoch,
                old_role,
                self.role,
                took,
                ", ".join(f"{k} {v:.3f} s" for k, v in phases.items()),
            )
            assert self.role is not None
            self._send(
                p.RoleSwitchDone(
                    rank=self.rank,
                    role=self.role,
                    layout_epoch=self.layout_epoch,
                    duration_s=took,
                    phases=phases,
                )
            )
        elif isinstance(msg, p.Checkpoint):
            with self._waiting(wait_label(msg, self.rank, self.roles)):
                self._checkpoint(msg.step)
        elif isinstance(msg, p.Stop):
            log.info("rank %d stopping: %s", self.rank, msg.reason)
            self.stop_reason = msg.reason
        else:
            log.warning("ignoring unexpected %s", msg.TYPE)


def follow_gone(w: HybridWorker, change: LayoutChange, regroup: bool = True) -> None:
    """An epoch that leaves ``w`` out: it registered again after it was lost and is not
    taken back yet (rank 0 waits for no report from it). It is in none of the epoch's
    groups and keeps its role; only its view of the layout follows, which the epoch that
    takes it back plans the state moves from, as every other rank does. (A lend's epoch
    makes no groups: ``regroup`` False.)"""
    if w.collective is not None and regroup:
        w.collective.regroup(change.epoch, change.after)  # makes no group here
    w.layout_epoch, w.roles = change.epoch, change.after
    log.info("epoch %d: rank %d not taken back yet (gone in it)", change.epoch, w.rank)


def lend_switch(w: HybridWorker, change: LayoutChange, lent: bool) -> dict[str, float]:
    """A lend or its reclaim (runtime/control/lends.py, ``Lend``); returns the seconds of
    each phase. No process group changes: the trainer's groups and its state stay with
    its ranks (offloaded as in any switch), and no sync point falls inside a lend, so the
    sync pairs of the layout before serve again after it. A lent trainer rank's engine
    loads the published policy from its own trainer side, as colocated_sync's does; back,
    it hands over what it was generating, as any rank leaving the rollout pool does."""
    phases: dict[str, float] = {}
    role = change.after[w.rank]
    if role == w.role:
        return phases  # a rollout rank before and after: its engine goes on
    if lent:
        start = time.perf_counter()
        exported = w.sides["trainer"].lend_weights()  # collective over the trainer group
        export_s = time.perf_counter() - start
        w._enter(role, phases)
        if exported is not None:
            start = time.perf_counter()
            load_in_place(w.sides, *exported)
            phases["weight_load"] = export_s + time.perf_counter() - start
    else:
        w.sides["rollout"].hand_over()
        w._enter(role, phases)
    return phases


def heartbeat(w: HybridWorker) -> p.Heartbeat:
    """The rank's heartbeat now: liveness, rollout times, engine load, and any wait ahead."""
    assert w.role is not None
    side = w.sides.get("rollout")
    engine = w.sides["rollout"].engine_stats() if w.role == "rollout" else {}
    # seconds paused for weight syncs while busy: a pause with nothing in the engine held
    # nothing (both totals only grow, so does their min)
    paused = side.paused_s if isinstance(side, RolloutSide) else 0.0
    return p.Heartbeat(
        rank=w.rank,
        role=w.role,
        state=w.sides[w.role].state,
        layout_epoch=w.layout_epoch,
        rollout_active_s=w.rollout_active_s,
        rollout_busy_s=w.rollout_busy_s,
        engine=engine,
        rollout_paused_s=min(paused, w.rollout_busy_s),
        # a blocking call's label, else what the active side waits for between calls
        waiting_on=w.waiting_on or w.sides[w.role].waiting_on,
    )


def wait_label(msg: p.Message, rank: int, roles: Sequence[str], rollout_group_size: int = 1) -> str:
    """What handling ``msg`` makes this rank wait on, and for whom (the ranks it joins)."""
    trainers = [r for r, role in enumerate(roles) if role == "trainer"]
    if isinstance(msg, p.Batch):
        return f"training batch {msg.batch_id} with trainer ranks {trainers}"
    if isinstance(msg, p.WeightSync):
        if rank == 0:  # the leader sends to each replica's driving rank
            peers = f"to rollout ranks {rollout_drivers(roles, rollout_group_size)}"
        elif rank in trainers:  # a sharded trainer's ranks gather with the leader
            peers = "gathering with rank 0"
        else:
            peers = "from rank 0"
        return f"weight sync of version {msg.policy_version} {peers}"
    if isinstance(msg, (p.RoleSwitch, p.Lend)):
        live = [r for r, role in enumerate(roles) if role != p.GONE_ROLE]
        what = "role switch" if isinstance(msg, p.RoleSwitch) else "lend"
        return f"{what} to layout epoch {msg.layout_epoch} with ranks {live}"
    if isinstance(msg, p.Checkpoint):
        return f"checkpoint of step {msg.step} with trainer ranks {trainers}"
    if isinstance(msg, p.Park):
        return f"its requests in flight, cut off for the checkpoint of step {msg.step}"
    return msg.TYPE


def export_engine_weights(sides: dict[str, RoleSide]) -> tuple[int, object] | None:
    """Mode colocated_sync: the trainer side's weights of its version, for this rank's own
    engine (None: a trainer side with no weights to give)."""
    return sides["trainer"].engine_weights()


def load_in_place(sides: dict[str, RoleSide], version: int, weights: object) -> None:
    sides["rollout"].load_in_place(version, weights)


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
