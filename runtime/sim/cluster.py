"""A discrete-event simulation of a whole cluster around the real coordinator.

The control plane is not modelled: it is :class:`runtime.control.coordinator.Coordinator` itself
(and through it the replay buffer and sampler, the dispatcher's B_max and staleness
admission, the generation scheduler's AIMD caps and token admission, the producer/consumer
allocator with its cooldown, role switches at sync points), driven with a simulated clock
and fed the same protocol messages the real ranks send. Only the engines are models:
rollout replicas (:mod:`runtime.sim.replica`), trainer replicas (tokens per second per
GPU, plus the old-policy log-prob pass when the recipe recomputes it), weight syncs (fixed
times), role switches (the sum of their phases) and the workload (response lengths
drifting over training, tool calls between turns), from :mod:`runtime.sim.parameters`.

Each simulated rank answers the coordinator as a real one would: a rollout replica's
leader runs the real rollout pull loop (:mod:`runtime.sim.rollout_pool`), asking for work
up to its sequence limit and reporting finished samples; the trainer leader asks for
batches and reports steps after the modelled training time; every rank heartbeats (with
its engine's load) and acknowledges role switches after the switch time. This module is
the event loop and the trainer side; the rollout side lives in the pool.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.config.layout import Role
from runtime.config.schema import Config
from runtime.control.coordinator import Coordinator
from runtime.control.rebalance import LENDS
from runtime.sim.events import EventQueue
from runtime.sim.parameters import ModelProfile, ProfileError, WorkloadProfile
from runtime.sim.rollout_pool import RolloutPool
from runtime.transport import protocol as p


def sim_config(cfg: Config, model: ModelProfile | None = None) -> Config:
    """The recipe as the simulator runs it: no checkpoints, and no timeouts meant for real
    processes (simulated ranks never die); a lending run's first estimate of a lend's cost
    is the model's (``ModelProfile.lend_estimate_s``), as a real run's is the memory plan's."""
    scheduler = cfg.scheduler
    if scheduler.lend_trainer and model is not None:
        scheduler = dataclasses.replace(scheduler, lend_estimate_s=model.lend_estimate_s())
    cfg = dataclasses.replace(
        cfg,
        scheduler=scheduler,
        train=dataclasses.replace(cfg.train, checkpoint_every=0),
        control=dataclasses.replace(
            cfg.control,
            heartbeat_timeout_s=1e12,
            register_timeout_s=1e12,
            checkpoint_timeout_s=1e12,
            # a simulated step of a large model may take longer than a real run allows
            # before it calls the trainer lost (which stopped a run at 0 steps, silently)
            step_timeout_s=1e12,
            stop_grace_s=0.0,
        ),
    )
    return cfg


def sim_eval_prompts(cfg: Config, prompt_ids: list[int]) -> dict[str, list[dict[str, Any]]]:
    """The ``data.eval`` sets as the simulated rank 0 hands them out: ``eval.max_prompts``
    prompts each (the set's file is not read: a set with fewer prompts costs less than
    simulated), of the workload's prompt length. None where the rollout engines play no
    evals (``Config.evals_on_rollout``: the synthetic engines' trainer-side eval is not
    modelled)."""
    if not cfg.evals_on_rollout:
        return {}
    n = cfg.eval.max_prompts
    return {
        name: [{"prompt_ids": prompt_ids, "index": i} for i in range(n)]
        for name in sorted(cfg.data.eval or {})
    }


class SimStalled(RuntimeError):
    """The simulated run stopped making progress (a lost request, a deadlock): a bug in a
    model or in the control plane, which a real run would show as a hang."""


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
    weight_syncs: int = 0  # the weight syncs the trainer leader paid
    weight_sync_s: float = 0.0  # the seconds of one (the model's, a LoRA run's adapter sync)
    weight_sync_bytes: float | None = None  # one sync's bytes, where the model's size is known
    rollout_gpus_per_replica: int = 1  # the GPUs an eval round's pinned replica holds
    eval_episodes_per_round: int = 0  # every set's prompts x (1 greedy + eval.k sampled)


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
        self.cfg = sim_config(cfg, model)
        self.model, self.workload = model, workload
        self.colocated = self.cfg.reflow.policy.colocated
        if self.colocated and (model.colocated_sync_s is None or model.wake_s is None):
            raise ProfileError(
                f"model {model.name}: mode colocated_sync needs colocated_sync_s and wake_s"
            )
        self._colocated_sync_s = model.colocated_sync_s or 0.0
        self._wake_s = model.wake_s or 0.0
        # A step's forward + backward, and before it the old-policy log-prob pass (a
        # forward over the batch) when the recipe has the trainer recompute them
        recompute = self.cfg.algorithm.recompute_old_logprobs
        self._step_factor = 1.0 + (model.logprob_fraction if recompute else 0.0)
        self._roles_before: list[str] = []  # the layout a role switch leaves
        self.block = block
        self.heartbeat_s = heartbeat_s
        self.seed = seed
        self.events = EventQueue()
        self._prompt_ids = [0] * max(1, workload.prompt_tokens // block)
        self.coord = Coordinator(
            self.cfg,
            run="sim",
            prompts=self._prompts(),
            clock=self.events.clock,
            wall=self.events.clock,
            eval_prompts=sim_eval_prompts(self.cfg, self._prompt_ids),
        )
        self.world = self.cfg.world_size
        self.ident = [f"rank-{r}".encode() for r in range(self.world)]
        self._rank_of = {identity: r for r, identity in enumerate(self.ident)}
        self.roles: list[str] = []
        self.epoch = 0
        # the layout epoch each rank has taken up: a rank still switching beats from the
        # one before (a beat from the new epoch stands in for a lost RoleSwitchDone, and
        # would end its switch early at rank 0)
        self.rank_epoch = [0] * self.world
        # One stream, drawn in event order: the event order is deterministic, so is a run.
        self.pool = RolloutPool(
            self.events,
            self.coord,
            self._send,
            model,
            workload,
            rng=random.Random(seed),
            eval_rng=random.Random(f"evals-{seed}"),
            block=block,
            max_seqs=max_seqs or cfg.engine.max_num_seqs,  # per rollout replica
            world=self.world,
            gpus_per_replica=self.cfg.resources.rollout_gpus_per_replica,
            prompt_ids=self._prompt_ids,
            progress=self._progress,
            on_delivered=self._on_delivered,
        )
        self.trainer_busy_until = 0.0
        self.trainer_waiting = False
        self._available_seen = 0
        self._last_step_at = 0.0
        self._last_batch_id = -1  # the newest batch the simulated leader trained
        self.stall_s = stall_s
        self.trainer_busy_s = 0.0
        self.trained_blocks = 0
        self.weight_syncs = 0
        self.finished = False
        self.placements: list[tuple[float, int, str]] = []
        self._handlers: dict[type, Callable[[int, Any], None]] = {
            p.Work: self.pool.on_work,
            p.EvalWork: self.pool.on_eval_work,
            p.Batch: self._on_batch,
            p.BatchWait: self._on_batch_wait,
            p.WeightSync: self._on_weight_sync,
            p.RoleSwitch: self._on_role_switch,
            p.Lend: self._on_role_switch,  # (its phases are a lend's: _switch_s)
            p.Stop: self._on_stop,
        }

    # --- plumbing ----------------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.events.now

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
        self.finished = self.pool.stopped = True

    def _on_batch(self, rank: int, msg: p.Batch) -> None:
        if rank != 0:
            return
        self.trainer_waiting = False
        # the whole batch's tokens: a data-parallel trainer's leader carries only its share
        whole = [n for u in msg.updates for n in u["n_valid"]] if msg.updates else None
        blocks = sum(whole if whole is not None else (s["n_valid"] for s in msg.samples))
        gpus = self.coord.layout.n_trainer_ranks
        seconds = blocks * self.block / (self.model.train_tok_s * gpus) * self._step_factor
        start = max(self.now, self.trainer_busy_until)
        self.trainer_busy_until = start + seconds
        self.trainer_busy_s += seconds * gpus
        self.trained_blocks += blocks
        self.events.at(self.trainer_busy_until, self._step_done, msg.batch_id)

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
                policy_version=self.cfg.train.version_at(step),
                batch_id=batch_id,
                metrics={"step_time_s": 0.0},
            ),
        )
        if self.coord.layout.ratio != (self.placements[-1][2] if self.placements else ""):
            self.placements.append((self.now, self.coord.step, self.coord.layout.ratio))
        self.pool.retry_blocked()  # a step is what most limits wait for
        self._ask_batch()

    def _ask_batch(self) -> None:
        if self.finished or self.now < self.trainer_busy_until:
            return
        if self.roles and self.roles[0] != Role.TRAINER.value:
            return
        self.trainer_waiting = False
        self._send(0, p.BatchRequest(rank=0, last_batch_id=self._last_batch_id))

    def _on_delivered(self) -> None:
        """A sample reached rank 0: a waiting trainer asks again once a group is whole."""
        if self.trainer_waiting and self._groups_arrived():
            self._ask_batch()

    def _groups_arrived(self) -> bool:
        """Whether a group became available since the trainer last asked. Only a whole
        group can make a batch possible; asking after every sample cost a fifth of a run."""
        n = self.coord.data.groups_settled()[0]
        if n == self._available_seen:
            return False
        self._available_seen = n
        return True

    def _on_weight_sync(self, rank: int, msg: p.WeightSync) -> None:
        if rank == 0:  # the leader broadcasts: its next step starts after the sync
            self.weight_syncs += 1
            self.trainer_busy_until = max(self.trainer_busy_until, self.now) + (
                self.model.weight_sync_s
            )
            self.events.at(self.trainer_busy_until, self._ask_batch)
        self.pool.on_weight_sync(rank, msg.policy_version)

    def _switch_s(self, rank: int, roles: list[str]) -> tuple[float, dict[str, float]]:
        """One rank's switch time and its phases. A colocated phase change: to the trainer,
        the engine sleeps and the trainer wakes (one wake); back to rollout, the in-place
        weight sync then the engine's wake (the published colocated figures,
        cluster-profile sec. 11). Any other switch: the model's ``switch_s`` if it gives
        one, else the sum of the rank's phases (``ModelProfile.switch_phases``: offload,
        wake, regroup, state transfer, weight load, by the direction it switches)."""
        if self.colocated:
            if roles[0] == Role.TRAINER.value:
                return self._wake_s, {"wake": self._wake_s}
            return self._colocated_sync_s + self._wake_s, {
                "weight_load": self._colocated_sync_s,
                "wake": self._wake_s,
            }
        before = self._roles_before[rank] if self._roles_before else roles[rank]
        applied = self.coord.rebalance.applied
        if applied is not None and applied.source in LENDS:
            phases = self.model.lend_phases(before, roles[rank])
            return sum(phases.values()), phases
        if self.model.switch_s is not None:
            return self.model.switch_s, {}
        phases = self.model.switch_phases(before, roles[rank])
        return sum(phases.values()), phases

    def _on_role_switch(self, rank: int, msg: p.RoleSwitch | p.Lend) -> None:
        roles = list(msg.roles)
        if msg.layout_epoch != self.epoch:  # the first rank told of this layout
            self._roles_before, self.roles, self.epoch = self.roles, roles, msg.layout_epoch
            # new replicas generate once their leader's switch is done (a leader of a
            # replica led by a rollout rank before is kept, not frozen)
            leaders = {g[0] for g in self.coord.layout.groups(Role.ROLLOUT)}
            new = leaders - set(self.pool.replicas)
            frozen = max((self._switch_s(r, roles)[0] for r in new), default=0.0)
            self.pool.relayout(leaders, frozen_for=frozen)
        seconds, phases = self._switch_s(rank, roles)
        self.events.at(
            self.now + seconds, self._switch_done, rank, msg.layout_epoch, seconds, phases
        )

    def _switch_done(self, rank: int, epoch: int, seconds: float, phases: dict[str, float]) -> None:
        self.rank_epoch[rank] = max(self.rank_epoch[rank], epoch)
        self._send(
            rank,
            p.RoleSwitchDone(
                rank=rank,
                role=self.roles[rank],
                layout_epoch=epoch,
                duration_s=seconds,
                phases=phases,
            ),
        )
        if rank == 0:
            self._ask_batch()
        if rank in self.pool.replicas:
            self.pool.ask_work(rank)

    # --- heartbeats --------------------------------------------------------------------

    def _heartbeat_all(self, rollout_only: bool = False) -> None:
        self.pool.account()
        for r in range(self.world):
            role = self.roles[r] if self.roles else "trainer"
            if rollout_only and role != "rollout":
                continue
            replica = self.pool.replicas.get(r)
            self._send(
                r,
                p.Heartbeat(
                    rank=r,
                    role=role,
                    state="busy" if replica is not None and replica.running else "idle",
                    layout_epoch=self.rank_epoch[r],
                    rollout_active_s=self.pool.rollout_active[r],
                    rollout_busy_s=self.pool.rollout_busy[r],
                    engine=replica.stats() if replica is not None else {},
                    rollout_paused_s=self.pool.rollout_paused[r],
                ),
            )

    def _periodic(self) -> None:
        if self.finished:
            return
        if self.now - self._last_step_at > self.stall_s:
            raise SimStalled(
                f"no training step for {self.now - self._last_step_at:.0f} simulated seconds "
                f"at step {self.coord.step} (state {self.coord.state}, "
                f"{self.coord.data.n_outstanding} requests outstanding)"
            )
        # Rollout ranks only: their engine load feeds the caps and the router. A trainer
        # rank's heartbeat only says it is alive, which simulated ranks always are; the
        # trainers were a fifth of all messages at 128 GPUs.
        self._heartbeat_all(rollout_only=True)
        self.pool.retry_blocked()
        for identity, out in self.coord.tick():
            self._deliver(self._rank_of[identity], out)
        self._ask_batch()
        self.events.at(self.now + self.heartbeat_s, self._periodic)

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
            self.pool.add(g[0])
        for r in range(self.world):
            self._send(r, p.Ready(rank=r, role=self.roles[r], layout_epoch=0))
        self.pool.ask_all()
        self._ask_batch()
        self.events.at(self.heartbeat_s, self._periodic)
        self.events.run(until=max_sim_s, done=lambda: self.finished)
        self._heartbeat_all()  # the rollout time of the last stretch, for the idle ratio
        summary = self.coord.summary()
        return SimResult(
            summary=summary,
            metrics=list(self.coord.reports.lines),
            sim_s=self.now,
            real_s=time.perf_counter() - started,
            block=self.block,
            rollout_tokens=self.coord.generated_tokens * self.block,
            trained_tokens=self.trained_blocks * self.block,
            rollout_gpu_busy_s=sum(self.pool.rollout_busy),
            trainer_gpu_busy_s=self.trainer_busy_s,
            placements=self.placements,
            weight_syncs=self.weight_syncs,
            weight_sync_s=self.model.weight_sync_s,
            rollout_gpus_per_replica=self.cfg.resources.rollout_gpus_per_replica,
            eval_episodes_per_round=(
                sum(self.coord.evals.sets.values()) * (1 + self.cfg.eval.k)
                if self.coord.evals is not None
                else 0
            ),
        )
