"""What rank 0 knows of a run, and the few moves every message handler makes.

:class:`Run` is the coordinator's state: the run's own (state, step, policy version), its
parts' books (:class:`~runtime.control.membership.Membership`,
:class:`~runtime.control.data_plane.DataPlane`,
:class:`~runtime.control.rebalance.Rebalancer`,
:class:`~runtime.control.checkpoints.Checkpoints`, the generation scheduler), the batch in
flight and the reports. The handlers (registration, rollout_work, training, lifecycle)
take a ``Run``; :class:`runtime.control.coordinator.Coordinator` is the ``Run`` that
dispatches messages to them and keeps time.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.config.feasibility import replay_route_shape
from runtime.config.layout import Layout, Role, initial_layout, ranks_with, rollout_drivers
from runtime.config.schema import Config
from runtime.control.checkpoints import Checkpoints, SaveCheckpoint
from runtime.control.data_plane import DataPlane
from runtime.control.decode_rates import EngineRateProfile
from runtime.control.evals import EvalRecord, EvalRounds
from runtime.control.idle import IdleBook
from runtime.control.membership import Membership, Outgoing, WorkerInfo
from runtime.control.message_book import MessageBook
from runtime.control.rebalance import Rebalancer
from runtime.control.reward_watch import ZeroRewardWatch
from runtime.control.run_life import RunLife
from runtime.control.sample_check import RunBounds
from runtime.control.scheduling import WindowStats
from runtime.control.scheduling.concurrency import AimdSettings
from runtime.control.scheduling.generation import GenerationScheduler
from runtime.control.scheduling.lending import Lends
from runtime.control.trainer_link import TrainerLink
from runtime.data.sample import Sample
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState, WorkerState

# How long rank 0 waits for a driver that left the rollout pool to report what it had
# generated (runtime/control/hand_over.py) before its requests go back from their prompts:
# an abort and a grace for tool calls on the rank, as for a stop's parked rollouts.
HAND_OVER_TIMEOUT_S = 20.0


@dataclass
class StepCounters:
    """Running totals between and across steps, for the metrics line and the summary."""

    generated_tokens: int = 0  # tokens of every accepted trajectory
    tokens_at_last_step: int = 0  # generated_tokens at the previous step
    tokens_at_first_step: int = 0
    reward_sum: float = 0.0  # of the samples delivered since the last step
    delivered: int = 0
    consumed_total: int = 0
    # response tokens of those (the allocator's windows: per second they drift less than
    # samples while responses grow; differences only, so not kept across a resume)
    consumed_tokens: int = 0
    zero_reward: ZeroRewardWatch = field(default_factory=ZeroRewardWatch)

    def delivered_sample(self, reward: float, n_tokens: int) -> None:
        self.reward_sum += reward
        self.delivered += 1
        self.generated_tokens += n_tokens

    def trained(self, samples: list[Sample]) -> None:
        """A step trained these samples."""
        self.consumed_total += len(samples)
        self.consumed_tokens += sum(t.n_valid for t in samples)

    def restore(self, consumed_total: int, generated_tokens: int) -> None:
        """The totals of a resumed run, as its checkpoint saved them."""
        self.consumed_total = consumed_total
        self.generated_tokens = self.tokens_at_last_step = generated_tokens


@dataclass
class RunReports:
    """What the run reports as it goes: each step's metrics line (``new_lines``, drained
    into metrics.jsonl by the server; ``lines``, kept for the summary), the samples'
    lines (``logging.samples``), the leader's last trainer metrics, every eval figure,
    and the ledger's violations (a bug, recorded where a user looks)."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    new_lines: list[dict[str, Any]] = field(default_factory=list)
    new_samples: list[dict[str, Any]] = field(default_factory=list)
    last_metrics: dict[str, float] = field(default_factory=dict)
    evals: dict[str, float] = field(default_factory=dict)
    ledger_violations: list[dict[str, Any]] = field(default_factory=list)

    def step(self, line: dict[str, Any], metrics: dict[str, float]) -> None:
        """A step's metrics line, its trainer metrics and evals."""
        self.new_lines.append(line)
        self.lines.append(line)
        self.last_metrics = dict(metrics)
        self.evals.update({k: v for k, v in metrics.items() if k.startswith("eval")})

    def eval_round(self, record: EvalRecord) -> None:
        """An eval round on the rollout engines ended: its metrics line, under the step
        that published the version it measured (the start's figures as ``eval_start/``,
        as the trainer-side path names them), and its figures for the summary."""
        figures = (
            {"eval_start/" + k.removeprefix("eval/"): v for k, v in record.figures.items()}
            if record.when == "start"
            else dict(record.figures)
        )
        self.evals.update(figures)
        self.new_lines.append(
            {
                "step": record.step,
                "eval_version": record.version,
                "eval_s": round(record.seconds, 3),
                "eval_complete": record.complete,
                "eval_missing": record.missing,
                **({"eval_reason": record.reason} if record.reason else {}),
                **figures,
            }
        )

    def drain(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The metrics and samples lines since the last call (the server writes them)."""
        out = self.new_lines, self.new_samples
        self.new_lines, self.new_samples = [], []
        return out


class Run:
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
        eval_prompts: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        """``vocab_size``: the rollout model's vocabulary, the bound on every token id a
        sample may carry (None: any non-negative id, as for simulated engines).
        ``eval_prompts``: the ``data.eval`` sets' prompts, rendered, when the rollout
        engines play them (``Config.evals_on_rollout``; None: no eval rounds)."""
        self.cfg = cfg
        self.run = run
        self.clock = clock
        self.wall = wall
        self.bounds = RunBounds(cfg.model.max_seq_len, vocab_size, replay_route_shape(cfg))
        sch = cfg.scheduler
        layout = initial_layout(cfg)
        # state, reason, start and end, attempt: changed by the methods below alone
        self.life = RunLife(started_at=clock())
        self.phase_started_at_step = 0  # colocated_sync: the step its current phase began at

        rollout_group = cfg.resources.rollout_gpus_per_replica
        self.members = Membership(cfg.world_size, clock, rollout_group)
        self.data = DataPlane(
            cfg.reflow,
            cfg.train,
            cfg.algorithm.group_size,
            prompts if prompts is not None else iter(()),
            clock,
        )
        self.rebalance = Rebalancer(
            layout, cfg.scheduler, cfg.train, cfg.reflow, clock, lost=lambda: self.members.lost
        )
        self.ckpt = Checkpoints(save_checkpoint, clock)
        # the trainer's groups generating while it waits (scheduler.lend_trainer)
        self.lends = Lends(sch, clock) if sch.lend_trainer else None
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
        self.counters = StepCounters()
        # idle seconds by cause, trainer and rollout (a rollout replica's by its driver)
        self.idle = IdleBook(rollout_group)
        # (time, trainer idle by cause) at the first step: the trainer's idle window
        self.trainer_window: tuple[float, Counter[str]] | None = None

        # the batch in training (the data plane's): when it went out, copies sent again
        self.trainer_link = TrainerLink()
        self._next_overdue_check = 0.0
        self.messages = MessageBook()  # taken, refused by category, undeliverable replies
        self.reports = RunReports()
        # held-out eval rounds on a pinned rollout replica (runtime/control/eval_work.py)
        self.evals = (
            EvalRounds(eval_prompts, cfg.eval.k, cfg.eval.solved_at, cfg.eval.timeout_s, clock)
            if eval_prompts
            else None
        )

    # --- read by the handlers, the server, the tests and the simulator -----------------

    # Step, policy version and the batch in training have one owner, the data plane, whose
    # methods keep them consistent (a step ends its batch, and publishes at a sync point):
    # read here, never written.
    @property
    def step(self) -> int:
        return self.data.step

    @property
    def policy_version(self) -> int:
        return self.data.policy_version

    @property
    def batch_in_flight(self) -> int | None:
        return self.data.batch_in_flight

    @property
    def training_started(self) -> bool:
        """A step has been trained (in this attempt or before the resume)."""
        return self.step > 0

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

    def rollout_idle_ratio(self) -> float:
        """Share of the rollout ranks' active time idle (sync pauses included), from the
        idle book; before it has two beats of a rank, from the raw heartbeat totals."""
        if self.idle.rollout_active_s > 0:
            return self.idle.rollout_idle_s() / self.idle.rollout_active_s
        return self.members.rollout_idle_ratio()

    def trainer_idle_ratio(self, now: float) -> float:
        """Share of the trainer's time since the first step idle, for any cause."""
        if self.trainer_window is None:
            return 0.0
        start, at_start = self.trainer_window
        idle = sum(self.idle.trainer_idle(now).values()) - sum(at_start.values())
        return max(0.0, idle) / max(now - start, 1e-9)

    @property
    def state(self) -> RunState:
        return self.life.state

    @property
    def reason(self) -> str:
        return self.life.reason

    # --- the run's state: every change here --------------------------------------------

    def _enter(self, state: RunState, reason: str | None = None) -> None:
        self.life.enter(state, self.clock(), reason)

    def start_running(self) -> None:
        """Every rank is ready: the run starts (rank-seconds by role count from here)."""
        assert self.state == RunState.STARTING
        self._enter(RunState.RUNNING)
        self.rebalance.start_counting_roles()

    def stop_now(self, reason: str) -> list[Outgoing]:
        """Tell every rank to leave (after a checkpoint, or when there is none to take)."""
        if self.state in TERMINAL or self.state == RunState.STOPPING:
            return []
        self._enter(RunState.STOPPING, reason)
        return self.members.send(p.Stop(reason=reason))

    def finish(self, state: RunState, reason: str) -> list[Outgoing]:
        if self.state in TERMINAL:
            return []
        self.life.fail_or_end(state, self.clock(), reason, trained=self.training_started)
        assert self.life.ended_at is not None
        self.idle.trainer_is(None, self.life.ended_at)  # the trainer's time ends with the run
        return self.members.send(p.Stop(reason=reason))

    def check_ended(self) -> None:
        if self.state == RunState.STOPPING and self.members.all_gone():
            self._enter(RunState.STOPPED)

    def explain(self, reason: str) -> None:
        """Say what the run is doing (a stop waiting for its checkpoint), state unchanged."""
        self.life.reason = reason

    def amend_reason(self, note: str) -> None:
        """After the run ended: add to its reason (a restart, say)."""
        self.life.reason += note

    def resumed_from(self, attempt: int, evals: dict[str, float], brief: dict[str, Any]) -> None:
        """This run goes on from a checkpoint of attempt ``attempt - 1``."""
        self.life.resume(attempt, brief)
        self.reports.evals = dict(evals)

    # --- the moves every handler makes ------------------------------------------------

    def open_trainer_window(self, now: float) -> None:
        """The first step: trainer idle counts from here (before, the pools warm up)."""
        if self.trainer_window is None:
            self.trainer_window = (now, self.idle.trainer_idle(now))
            self.idle.open_window(now)

    def ledger_violated(self, problems: list[str]) -> None:
        self.reports.ledger_violations.append({"step": self.step, "problems": problems})

    def start_phase(self) -> None:
        """colocated_sync: a phase begins at this step (runtime/control/colocation.py)."""
        self.phase_started_at_step = self.step

    def known(self, identity: bytes, rank: int) -> WorkerInfo | None:
        """The registered, live worker behind a message, or None (counted) if it is not."""
        w = self.members.sender(identity, rank)
        if isinstance(w, str):
            self.messages.reject(w)
            return None
        self.messages.accept()
        return w

    def window(self) -> WindowStats | None:
        """The allocator's view of the last steps (tests and benchmarks read it)."""
        return self.rebalance.window()

    def weight_sync_ranks(self) -> list[int]:
        """Who takes part in a weight sync: every rank of the first trainer replica group
        (rank 0 streams the weights; a sharded trainer's other ranks gather the full
        tensors with it, bucket by bucket) and the driver of every rollout replica (its
        engine reloads all its tensor-parallel shards; the other ranks of the replica run
        no engine: runtime/rank/tp_member.py)."""
        first_trainer = self.layout.groups(Role.TRAINER)[0]
        return [*first_trainer, *self.sync_receivers()]

    def sync_receivers(self) -> list[int]:
        """The rollout drivers of the current layout that are still in the run."""
        return rollout_drivers(self.epoch_roles(), self.cfg.resources.rollout_gpus_per_replica)

    def epoch_roles(self) -> list[str]:
        """Every rank's role in the current layout, ``"gone"`` for a rank lost to the run
        (it is in no process group of later epochs)."""
        return [
            p.GONE_ROLE if rank in self.members.lost else role.value
            for rank, role in enumerate(self.layout.roles())
        ]

    def weight_sync(self) -> list[Outgoing]:
        """Tell the ranks of :meth:`weight_sync_ranks` to run the weight broadcast; a
        rollout driver pinned to an eval round takes part and keeps its weights."""
        ranks = self.weight_sync_ranks()
        pinned = self.evals.pinned if self.evals is not None else None
        others = [r for r in ranks if r != pinned]
        if self.evals is not None:
            self.evals.synced(others)
        out = self.members.send(
            p.WeightSync(policy_version=self.policy_version, layout_epoch=self.layout_epoch),
            others,
        )
        if pinned in ranks:  # it takes part in the broadcast and keeps its weights
            held = p.WeightSync(
                policy_version=self.policy_version, layout_epoch=self.layout_epoch, hold=True
            )
            out += self.members.send(held, [pinned])
        return out

    def regroup_without_lost(self) -> list[Outgoing]:
        """A new epoch of the same layout once a rank is lost, so the live ranks rebuild
        their process groups without it: at once, unless a switch is under way or a
        rebalance is pending (that one's epoch leaves it out too; then nothing more)."""
        rb = self.rebalance
        if not rb.regroup_due or rb.switching() or self.state != RunState.RUNNING:
            return []
        if self.lends is not None and self.lends.active is not None:
            # a lend's epoch makes no groups: its reclaim comes first, then this regroup
            # (runtime/control/lends.py)
            return []
        if rb.pending is None:
            source = "rank_rejoined" if self.ready_to_rejoin() else "lost_rank"
            rb.request(self.layout, source=source, force=True)
        if rb.pending.ratio != self.layout.ratio and self.training_started:
            return []  # a user's rebalance: applied at the next sync point, as always
        return self.apply_pending_layout()

    def ready_to_rejoin(self) -> set[int]:
        """The lost ranks that registered again that the next epoch takes back: their
        engines are up (Ready), and a trainer rank only with every rank of its replica group
        (a group trains whole or not at all) and between steps, with no checkpoint under way
        (the batch in flight was split over the trainer ranks without it; a checkpoint is
        written by the trainer ranks it was asked of)."""
        if not self.members.rejoining:  # the usual case, asked at every leader's batch request
            return set()
        ready = {
            w.rank
            for w in self.members.alive()
            if w.rank in self.members.rejoining and w.state != WorkerState.STARTING
        }
        between_steps = self.batch_in_flight is None and not self.ckpt.busy
        trainers = self.layout.groups(Role.TRAINER)
        return {
            rank
            for rank in ready
            if self.layout.role_of(rank) != Role.TRAINER
            or (between_steps and ready.issuperset(trainers[self.layout.group_index(rank)]))
        }

    def take_back_rejoined(self) -> list[Outgoing]:
        """A new epoch now if it would take a rejoined rank back. Else a trainer rank waits
        for the rest of its replica group, or for the leader's next batch request (between
        steps: runtime/control/training.py calls this again then)."""
        if not self.ready_to_rejoin():
            return []
        self.rebalance.regroup_needed()
        return self.regroup_without_lost()

    def trainer_ranks(self) -> list[int]:
        """The trainer ranks of the current epoch: the layout's, less those lost."""
        return ranks_with(self.epoch_roles(), Role.TRAINER.value)

    def without_lost(self, target: Layout) -> str:
        """Why ``target`` cannot be taken with the ranks lost so far ("" if it can): each
        trainer replica group is whole or wholly lost (a lost trainer group stays out of
        the data parallelism wherever the boundary is), the leader's is whole, and some
        live rank drives a rollout replica."""
        lost_ranks = self.members.lost
        if not lost_ranks:
            return ""
        for i, group in enumerate(target.groups(Role.TRAINER)):
            lost = [r for r in group if r in lost_ranks]
            if lost and (i == 0 or len(lost) < len(group)):
                return f"ranks {lost} were lost: trainer replica {list(group)} cannot train"
        size = self.cfg.resources.rollout_gpus_per_replica
        live = [r for r in target.ranks(Role.ROLLOUT) if r not in lost_ranks]
        if not rollout_drivers(
            [Role.ROLLOUT.value if r in live else "x" for r in range(target.world_size)], size
        ):
            return "no live rank would drive a rollout replica"
        return ""

    def apply_pending_layout(self) -> list[Outgoing]:
        """Apply a pending layout at a synchronization point.

        Until training has started every moment is a sync point; afterwards the trainer's
        step reports at multiples of ``sync_every`` are.
        """
        alive = self.members.alive()
        pending = self.rebalance.pending
        if pending is not None and self.without_lost(pending):  # e.g. the allocator's pick
            self.rebalance.drop_pending(self.without_lost(pending))
            return []
        forced = self.rebalance.force_next
        if not self.rebalance.apply_pending(w.rank for w in alive):
            return []
        # ...and takes back the lost ranks that registered again and are ready
        self.members.take_back(self.ready_to_rejoin(), self.step)
        return self.switch_roles(forced)

    def apply_now(self, target: Layout, source: str) -> list[Outgoing]:
        """A lend or its reclaim (runtime/control/lends.py): ``target`` taken at once."""
        self.rebalance.apply_now(target, source, (w.rank for w in self.members.alive()))
        return self.switch_roles(forced=False, lend=source == "lend")

    def hands_over(self, rank: int) -> bool:
        """Whether ``rank`` reports what it generated when it leaves the rollout pool: a
        driver, outside colocated_sync (whose rollout phase is on-policy: whatever is still
        out at its end is generated again under the new weights)."""
        return self.members.drives(rank) and not self.cfg.reflow.policy.colocated

    def switch_roles(self, forced: bool, lend: bool | None = None) -> list[Outgoing]:
        """Every live rank told the layout just applied; a rank leaving the rollout pool
        gives its requests back first. ``forced``: a regroup of the same roles. ``lend``:
        a lend (True) or its reclaim (False), which move no group or state (``Lend``)."""
        alive = self.members.alive()
        target = self.layout
        roles = self.epoch_roles()
        for w in alive:
            if roles[w.rank] == p.GONE_ROLE:
                # registered again, not taken back: in no group of this epoch, nothing to
                # switch (it may still be starting its engines); the switch waits not for it
                self.rebalance.forget(w.rank)
                continue
            if forced and w.role == target.role_of(w.rank).value:
                # no role changes: a beat of the new epoch may stand in for its report
                w.state = WorkerState.SWITCHING
                continue
            if w.role != target.role_of(w.rank).value:
                w.state = WorkerState.SWITCHING
                if w.role == Role.ROLLOUT.value and self.hands_over(w.rank):
                    # A driver leaving the rollout pool parks what it generates and reports
                    # it (runtime/control/hand_over.py): its requests stay out there until
                    # then and go back to the queue carrying it, for another rank to
                    # continue. Nothing is lost if the report never comes: they go back
                    # from their prompts after the bound.
                    self.data.await_hand_over(w.rank, self.clock() + HAND_OVER_TIMEOUT_S)
                elif not self.data.handing_over(w.rank):
                    # Its requests go back to the front of the queue, so no sample is lost.
                    # (One back in the pool before its hand-over came keeps awaiting it:
                    # the report, or its bound, settles the requests it held when it left.)
                    self.data.worker_gone(w.rank)
                self.generation.worker_left(w.rank)
                # its rollout time starts again at its first beat in the new role
                self.idle.forget(w.rank)
        if lend is None:
            return self.members.send(p.RoleSwitch(layout_epoch=self.layout_epoch, roles=roles))
        return self.members.send(p.Lend(layout_epoch=self.layout_epoch, roles=roles, lent=lend))
