"""A discrete-event simulation of a whole cluster around the real coordinator.

The control plane is not modelled: it is :class:`runtime.control.coordinator.Coordinator` itself
(and through it the replay buffer and sampler, the dispatcher's B_max and staleness
admission, the generation scheduler's AIMD caps and token admission, the producer/consumer
allocator with its cooldown, role switches at sync points), driven with a simulated clock
and fed the same protocol messages the real ranks send. Only the engines are models:
rollout replicas (:mod:`runtime.sim.replica`), trainer replicas (tokens per second per
GPU), weight syncs and role switches (fixed times), and the workload (response lengths
drifting over training, tool calls between turns), from :mod:`runtime.sim.parameters`.

Each simulated rank answers the coordinator as a real one would: a rollout replica's
leader runs the real rollout pull loop (:class:`runtime.rank.rollout_loop.RolloutLoop`),
asking for work up to its sequence limit and reporting finished samples; the trainer
leader asks for batches and reports steps after the modelled training time; every rank
heartbeats (with its engine's load) and acknowledges role switches after the switch time.
"""

from __future__ import annotations

import dataclasses
import gc
import heapq
import itertools
import math
import random
import time
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.config.layout import Role
from runtime.config.schema import Config
from runtime.control.coordinator import Coordinator
from runtime.data.sample import Sample
from runtime.rank.rollout_loop import RolloutLoop
from runtime.sim.parameters import ModelProfile, WorkloadProfile
from runtime.sim.replica import RolloutReplica
from runtime.transport import protocol as p


def sim_config(cfg: Config) -> Config:
    """The recipe as the simulator runs it: no checkpoints, and no timeouts meant for real
    processes (simulated ranks never die)."""
    cfg = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, checkpoint_every=0),
        control=dataclasses.replace(
            cfg.control,
            heartbeat_timeout_s=1e12,
            register_timeout_s=1e12,
            checkpoint_timeout_s=1e12,
            stop_grace_s=0.0,
        ),
    )
    return cfg


class SimStalled(RuntimeError):
    """The simulated run stopped making progress (a lost request, a deadlock): a bug in a
    model or in the control plane, which a real run would show as a hang."""


@dataclass
class _Generation:
    """A request in flight on a simulated replica (its pull loop's handle for it)."""

    prompt_blocks: int
    turns: list[int]  # blocks to generate per turn
    version: int  # policy version when dispatched
    group_id: int
    prompt_id: int
    dispatched_at: float
    turn: int = 0
    context: int = 0  # blocks generated in earlier turns


@dataclass
class SimResult:
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    sim_s: float
    real_s: float
    block: int
    rollout_tokens: float
    trained_tokens: float
    rollout_gpu_busy_s: float
    trainer_gpu_busy_s: float
    placements: list[tuple[float, int, str]] = field(default_factory=list)  # (time, step, R:T)


class SimCluster:
    def __init__(
        self,
        cfg: Config,
        model: ModelProfile,
        workload: WorkloadProfile,
        *,
        seed: int = 0,
        block: int = 16,
        heartbeat_s: float = 30.0,
        max_seqs: int | None = None,
        stall_s: float = 86_400.0,
    ) -> None:
        self.cfg = sim_config(cfg)
        self.model, self.workload = model, workload
        self.lengths = workload.lengths
        self.block = block
        self.heartbeat_s = heartbeat_s
        self.max_seqs = max_seqs or cfg.engine.max_num_seqs  # per rollout replica
        self.seed = seed
        # One stream, drawn in event order: the event order is deterministic, so is a run.
        self.rng = random.Random(seed)
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[..., None], tuple]] = []
        self._seq = itertools.count()
        self.coord = Coordinator(
            self.cfg, run="sim", prompts=self._prompts(), clock=self._clock, wall=self._clock
        )
        self.world = self.cfg.world_size
        self.ident = [f"rank-{r}".encode() for r in range(self.world)]
        self._rank_of = {identity: r for r, identity in enumerate(self.ident)}
        self.roles: list[str] = []
        self.epoch = 0
        self.replicas: dict[int, RolloutReplica] = {}  # leader rank -> replica
        self.loops: dict[int, RolloutLoop[_Generation]] = {}  # leader rank -> its pull loop
        self._replica_event: dict[int, int] = {}  # leader -> token of its scheduled event
        # Leaders whose last work request got nothing (B_max, staleness, a barrier, the
        # token budget), oldest first. They ask again when something that lifts those
        # limits happens: a step (all), a delivery (the oldest one), the periodic tick.
        self._blocked: dict[int, None] = {}
        self.version = 0
        self.trainer_busy_until = 0.0
        self.trainer_waiting = False
        self._available_seen = 0
        self._last_step_at = 0.0
        self._last_batch_id = -1  # the newest batch the simulated leader trained
        self.stall_s = stall_s
        self._stale_at: int | None = None  # see _stale_limited
        self.trainer_busy_s = 0.0
        self.trained_blocks = 0
        self.rollout_active: list[float] = [0.0] * self.world
        self.rollout_busy: list[float] = [0.0] * self.world
        self._last_account = 0.0
        self._accounted: dict[int, float] = {}
        self.finished = False
        self.placements: list[tuple[float, int, str]] = []
        self._arrays: dict[int, tuple[array, array]] = {}
        self._handlers: dict[type, Callable[[int, Any], None]] = {
            p.Work: self._on_work,
            p.Batch: self._on_batch,
            p.BatchWait: self._on_batch_wait,
            p.WeightSync: self._on_weight_sync,
            p.RoleSwitch: self._on_role_switch,
            p.Stop: self._on_stop,
        }
        prompt_blocks = max(1, workload.prompt_tokens // block)
        self._prompt_ids = [0] * prompt_blocks

    # --- plumbing ----------------------------------------------------------------------

    def _clock(self) -> float:
        return self.now

    def _at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (t, next(self._seq), fn, args))

    def _prompts(self) -> Iterator[dict[str, Any]]:
        for i in itertools.count():
            yield {"prompt_ids": self._prompt_ids, "index": i}

    def _send(self, rank: int, msg: p.Message) -> bool:
        for identity, out in self.coord.handle(self.ident[rank], msg):
            self._deliver(self._rank_of[identity], out)
        return True

    def _progress(self) -> float:
        return self.coord.step / max(self.cfg.train.steps, 1)

    # --- coordinator -> ranks ----------------------------------------------------------

    def _deliver(self, rank: int, msg: p.Message) -> None:
        handler = self._handlers.get(type(msg))
        if handler is not None:  # Welcome, HeartbeatAck, Checkpoint (off here): nothing
            handler(rank, msg)

    def _on_batch_wait(self, rank: int, msg: p.BatchWait) -> None:
        self.trainer_waiting = True

    def _on_stop(self, rank: int, msg: p.Stop) -> None:
        self.finished = True

    def _on_work(self, rank: int, msg: p.Work) -> None:
        replica, loop = self.replicas.get(rank), self.loops.get(rank)
        if replica is None or loop is None:
            return
        requests = loop.take(msg, self.now)
        if not msg.requests:
            # Nothing now (B_max, staleness, a barrier): real ranks ask again a moment
            # later; here the blocked ones ask when something that lifts those limits
            # happens (a step, a delivery, the periodic tick).
            self._blocked[rank] = None
            return
        self._blocked.pop(rank, None)
        n_turns, prompt_blocks = self.workload.turns, len(self._prompt_ids)
        progress = self._progress()
        for req in requests:
            total = self.lengths.draw(self.rng, progress)
            per = [max(1, total // n_turns // self.block)] * n_turns
            loop.running[req.sample_id] = _Generation(
                prompt_blocks=prompt_blocks,
                turns=per,
                version=msg.policy_version,
                group_id=req.group_id,
                prompt_id=req.prompt_id,
                dispatched_at=self.now,
            )
            replica.submit(req.sample_id, prompt_blocks, per[0])
        self._replica_events(rank, replica)

    def _on_batch(self, rank: int, msg: p.Batch) -> None:
        if rank != 0:
            return
        self.trainer_waiting = False
        blocks = sum(s["n_valid"] for s in msg.samples)
        gpus = self.coord.layout.n_trainer_ranks
        seconds = blocks * self.block / (self.model.train_tok_s * gpus)
        start = max(self.now, self.trainer_busy_until)
        self.trainer_busy_until = start + seconds
        self.trainer_busy_s += seconds * gpus
        self.trained_blocks += blocks
        self._at(self.trainer_busy_until, self._step_done, msg.batch_id)

    def _step_done(self, batch_id: int) -> None:
        self._last_step_at = self.now
        self._last_batch_id = batch_id
        if self.coord.auto_rebalance:  # rollout busy time up to now: the allocator's window
            self._heartbeat_all(rollout_only=True)
        step = self.coord.step + 1
        self._send(
            0,
            p.StepDone(
                rank=0,
                step=step,
                policy_version=step,
                batch_id=batch_id,
                metrics={"step_time_s": 0.0},
            ),
        )
        if self.coord.layout.ratio != (self.placements[-1][2] if self.placements else ""):
            self.placements.append((self.now, self.coord.step, self.coord.layout.ratio))
        self._retry_blocked()  # a step is what most limits wait for
        self._ask_batch()

    def _ask_batch(self) -> None:
        if self.finished or self.now < self.trainer_busy_until:
            return
        if self.roles and self.roles[0] != Role.TRAINER.value:
            return
        self.trainer_waiting = False
        self._send(0, p.BatchRequest(rank=0, last_batch_id=self._last_batch_id))

    def _on_weight_sync(self, rank: int, msg: p.WeightSync) -> None:
        self.version = max(self.version, msg.policy_version)
        if rank == 0:  # the leader broadcasts: its next step starts after the sync
            self.trainer_busy_until = max(self.trainer_busy_until, self.now) + (
                self.model.weight_sync_s
            )
            self._at(self.trainer_busy_until, self._ask_batch)
        replica = self.replicas.get(rank)
        if replica is not None:
            replica.stall(self.now, self.model.weight_sync_s)  # held, resumed after
            self._schedule(rank)

    def _on_role_switch(self, rank: int, msg: p.RoleSwitch) -> None:
        if rank == 0:  # once per switch: rebuild the replicas of the new layout
            self._apply_layout(msg)
        self._at(self.now + self.model.switch_s, self._switch_done, rank, msg.layout_epoch)

    def _switch_done(self, rank: int, epoch: int) -> None:
        self._send(
            rank,
            p.RoleSwitchDone(
                rank=rank,
                role=self.roles[rank],
                layout_epoch=epoch,
                duration_s=self.model.switch_s,
            ),
        )
        if rank == 0:
            self._ask_batch()
        if rank in self.replicas:
            self._ask_work(rank)

    def _apply_layout(self, msg: p.RoleSwitch) -> None:
        self._account()
        self.roles, self.epoch = list(msg.roles), msg.layout_epoch
        leaders = {g[0] for g in self.coord.layout.groups(Role.ROLLOUT)}
        for gone in set(self.replicas) - leaders:
            # the coordinator requeued its requests; whatever it was generating is dropped
            del self.replicas[gone]
            self.loops.pop(gone).drop()
            self._replica_event.pop(gone, None)
            self._accounted.pop(gone, None)
            self._blocked.pop(gone, None)
        for new in leaders - set(self.replicas):
            replica = self._new_replica(new)
            replica.t = replica.frozen_until = self.now + self.model.switch_s

    def _new_replica(self, leader: int) -> RolloutReplica:
        """A rollout replica led by ``leader``, with the leader's pull loop."""
        replica = RolloutReplica(self.model, block=self.block, max_seqs=self.max_seqs)
        loop: RolloutLoop[_Generation] = RolloutLoop(leader, retry_s=0.0)
        loop.attach(lambda msg: self._send(leader, msg), leader)
        self.replicas[leader], self.loops[leader] = replica, loop
        return replica

    # --- rollout events ----------------------------------------------------------------

    def _schedule(self, leader: int) -> None:
        replica = self.replicas.get(leader)
        if replica is None:
            return
        t = replica.next_event()
        token = next(self._seq)
        self._replica_event[leader] = token
        if t < math.inf:
            self._at(max(t, self.now), self._replica_tick, leader, token)

    def _replica_tick(self, leader: int, token: int) -> None:
        replica = self.replicas.get(leader)
        if replica is None or self._replica_event.get(leader) != token:
            return  # superseded by a later schedule, or the replica is gone
        for sid in replica.on_event(self.now):
            self._turn_finished(leader, sid)
        if self._stale_limited():
            self._blocked.setdefault(leader, None)
        elif leader not in self._blocked:  # blocked ones wait for a step or a delivery
            self._ask_work(leader)
        self._schedule(leader)

    def _turn_finished(self, leader: int, sid: int) -> None:
        loop = self.loops[leader]
        s = loop.running.get(sid)
        if s is None:
            return
        s.context += s.turns[s.turn]
        s.turn += 1
        if s.turn < len(s.turns):  # a tool call, then the next turn on the same replica
            delay = self.workload.tool_s(self.rng)
            self._at(self.now + delay, self._next_turn, leader, sid)
            return
        del loop.running[sid]
        n = s.context
        # Held across a weight sync (runtime/rank/rollout_loop.py, Spans): modelled as half
        # way through, which is all rank 0 looks at (the spans' versions).
        v = s.version
        spans = [(v, 0, n)] if self.version <= v else [(v, 0, n // 2), (self.version, n // 2, n)]
        reward = float(self.rng.random() < self.workload.reward_p(self._progress()))
        tokens, logprobs = self._arrays_of(n)
        loop.finished(
            Sample(
                sample_id=sid,
                group_id=s.group_id,
                prompt_id=s.prompt_id,
                versions=spans,
                prompt_token_ids=self._prompt_ids,  # rank 0 checks it was its prompt
                token_ids=tokens,
                logprobs=logprobs,
                n_valid=n,
                reward=reward,
                worker=leader,
                started_at=s.dispatched_at,
                finished_at=self.now,
            )
        )
        loop.flush()
        if self._blocked and not self._stale_limited():
            # a slot under B_max is free now: the longest-waiting asks
            oldest = next(iter(self._blocked))
            del self._blocked[oldest]
            self._ask_work(oldest)
        if self.trainer_waiting and self._groups_arrived():
            self._ask_batch()

    def _groups_arrived(self) -> bool:
        """Whether a group became available since the trainer last asked. Only a whole
        group can make a batch possible; asking after every sample cost a fifth of a run."""
        n = self.coord.data.buffer.transitions["finished->available"]
        if n == self._available_seen:
            return False
        self._available_seen = n
        return True

    def _next_turn(self, leader: int, sid: int) -> None:
        replica, loop = self.replicas.get(leader), self.loops.get(leader)
        s = loop.running.get(sid) if loop is not None else None
        if replica is None or s is None:
            return
        replica.advance(self.now)
        replica.submit(sid, s.prompt_blocks + s.context, s.turns[s.turn])
        self._replica_events(leader, replica)

    def _replica_events(self, leader: int, replica: RolloutReplica) -> None:
        """Bring a replica to now after new work: what finishes at this very instant (its
        tick was due now but had not run yet) must be reported, not dropped."""
        for sid in replica.on_event(self.now):
            self._turn_finished(leader, sid)
        self._schedule(leader)

    def _settled_groups(self) -> int:
        t = self.coord.data.buffer.transitions
        return t["finished->available"] + t["finished->evicted"]

    def _stale_limited(self) -> bool:
        """Whether the last work request was refused by staleness admission and nothing
        that lifts it has happened since. Its bound counts buffered + outstanding samples,
        which a delivery does not change: only a step (a batch consumed, a new version) or
        a group leaving the buffer does. Asking again after every delivery while it holds
        was nine in ten of all work requests at 128 GPUs."""
        if self._stale_at is not None and self._stale_at != self._settled_groups():
            self._stale_at = None
        return self._stale_at is not None

    def _retry_blocked(self) -> None:
        self._stale_at = None
        for leader in list(self._blocked):
            if self._stale_limited():  # the rest would be refused the same way
                break
            self._blocked.pop(leader, None)
            self._ask_work(leader)

    def _ask_work(self, leader: int) -> None:
        replica = self.replicas.get(leader)
        if replica is None or self.finished:
            return
        blocked = self.coord.data.dispatcher.blocked
        refused = blocked["staleness"]
        asked = self.loops[leader].pull(self.max_seqs - replica.outstanding, self.now)
        if asked and blocked["staleness"] != refused:
            self._stale_at = self._settled_groups()

    def _arrays_of(self, n: int) -> tuple[array, array]:
        """Token ids and log-probs of a response of ``n`` blocks (their values never matter;
        typed arrays go onto the wire as they are)."""
        b = self._arrays.get(n)
        if b is None:
            b = self._arrays[n] = (array("i", [0] * n), array("f", [-1.0] * n))
        return b

    # --- heartbeats --------------------------------------------------------------------

    def _account(self) -> None:
        """Rollout active/busy seconds per rank since the last call (for the heartbeats)."""
        dt = self.now - self._last_account
        self._last_account = self.now
        size = self.cfg.resources.rollout_gpus_per_replica
        for leader, replica in self.replicas.items():
            replica.advance(self.now)
            busy = replica.busy_s - self._accounted.get(leader, 0.0)
            self._accounted[leader] = replica.busy_s
            for r in range(leader, leader + size):
                self.rollout_active[r] += dt
                self.rollout_busy[r] += busy

    def _heartbeat_all(self, rollout_only: bool = False) -> None:
        self._account()
        for r in range(self.world):
            role = self.roles[r] if self.roles else "trainer"
            if rollout_only and role != "rollout":
                continue
            replica = self.replicas.get(r)
            self._send(
                r,
                p.Heartbeat(
                    rank=r,
                    role=role,
                    state="busy" if replica is not None and replica.running else "idle",
                    layout_epoch=self.epoch,
                    rollout_active_s=self.rollout_active[r],
                    rollout_busy_s=self.rollout_busy[r],
                    engine=replica.stats() if replica is not None else {},
                ),
            )

    def _periodic(self) -> None:
        if self.finished:
            return
        if self.now - self._last_step_at > self.stall_s:
            raise SimStalled(
                f"no training step for {self.now - self._last_step_at:.0f} simulated seconds "
                f"at step {self.coord.step} (state {self.coord.state}, "
                f"{len(self.coord.data.dispatcher.outstanding)} requests outstanding)"
            )
        # Rollout ranks only: their engine load feeds the caps and the router. A trainer
        # rank's heartbeat only says it is alive, which simulated ranks always are; the
        # trainers were a fifth of all messages at 128 GPUs.
        self._heartbeat_all(rollout_only=True)
        self._retry_blocked()
        for identity, out in self.coord.tick():
            self._deliver(self._rank_of[identity], out)
        self._ask_batch()
        self._at(self.now + self.heartbeat_s, self._periodic)

    # --- run ---------------------------------------------------------------------------

    def run(self, max_sim_s: float = 1e9) -> SimResult:
        # Millions of short-lived messages, and a buffer of long-lived samples that every
        # full pass of the cycle collector walks again: with the default thresholds the
        # collector took a tenth of a long run. Nothing here builds cycles worth chasing.
        thresholds = gc.get_threshold()
        gc.set_threshold(200_000, 50, 100)
        try:
            return self._run(max_sim_s)
        finally:
            gc.set_threshold(*thresholds)

    def _run(self, max_sim_s: float) -> SimResult:
        started = time.perf_counter()
        for r in range(self.world):
            out = self.coord.handle(
                self.ident[r], p.Hello(rank=r, world_size=self.world, node="sim", pid=r + 1)
            )
            (_, welcome) = out[0]
            assert isinstance(welcome, p.Welcome)
            self.roles = list(welcome.roles)
        for g in self.coord.layout.groups(Role.ROLLOUT):
            self._new_replica(g[0])
        for r in range(self.world):
            self._send(r, p.Ready(rank=r, role=self.roles[r], layout_epoch=0))
        for leader in list(self.replicas):
            self._ask_work(leader)
        self._ask_batch()
        self._at(self.heartbeat_s, self._periodic)
        while self._events and not self.finished:
            t, _, fn, args = heapq.heappop(self._events)
            if t > max_sim_s:
                break
            self.now = max(self.now, t)
            fn(*args)
        self._heartbeat_all()  # the rollout time of the last stretch, for the idle ratio
        summary = self.coord.summary()
        return SimResult(
            summary=summary,
            metrics=list(self.coord.metrics_log),
            sim_s=self.now,
            real_s=time.perf_counter() - started,
            block=self.block,
            rollout_tokens=self.coord.generated_tokens * self.block,
            trained_tokens=self.trained_blocks * self.block,
            rollout_gpu_busy_s=sum(self.rollout_busy),
            trainer_gpu_busy_s=self.trainer_busy_s,
            placements=self.placements,
        )
