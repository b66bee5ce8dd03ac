"""The rank-0 coordinator's logic: run state machine, registration, heartbeats, layout.

Pure and synchronous, like vLLM's ``EngineCore``: it never touches a socket or the real
clock. :class:`runtime.transport.server.ControlServer` feeds it frames and sends what it
returns; unit tests and the simulator drive it directly with a fake clock.

Run states::

    STARTING -> RUNNING -> COMPLETED        (train.steps reached)
        |          |-----> STOPPING -> STOPPED   (reflow stop, SIGTERM, SIGUSR2)
        '----------'-----> FAILED            (lost rank, registration timeout)

Checkpoints (``train.checkpoint_every`` and before a graceful stop) are taken at a step
boundary: no batch is handed out while one is pending; the trainer leader writes its state
(``Checkpoint`` -> ``CheckpointSaved``), then the injected ``save_checkpoint`` writes this
object's :meth:`state_dict` next to it and seals the folder (runtime/store/checkpoint.py).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.config.layout import Layout, LayoutError, Role, parse_ratio
from runtime.config.schema import Config
from runtime.control.data_plane import DataPlane
from runtime.control.decode_rates import EngineRateProfile
from runtime.control.replay_buffer import Batch
from runtime.control.sample_check import RunBounds, sample_problem
from runtime.control.scheduling import Placement, ProducerConsumerAllocator, WindowStats
from runtime.control.scheduling.concurrency import AimdSettings
from runtime.control.scheduling.generation import GenerationScheduler
from runtime.data.sample import Request, trajectory_digest
from runtime.engines.registry import needs_collective
from runtime.transport import frames as wire
from runtime.transport import protocol as p

Outgoing = tuple[bytes, p.Message]
# (step, policy_version, coordinator state) -> where it was saved; raises on failure
SaveCheckpoint = Callable[[int, int, dict[str, Any]], str]
STATE_FORMAT = 1
TERMINAL = ("COMPLETED", "STOPPED", "FAILED")
GONE = ("dead", "exited")


@dataclass
class WorkerInfo:
    rank: int
    node: str
    pid: int
    identity: bytes
    role: str
    state: str = "starting"
    layout_epoch: int = 0
    last_seen: float = 0.0
    rollout_time: tuple[float, float] = (0.0, 0.0)  # cumulative (active, busy) seconds
    beat_at: float = 0.0  # when rollout_time arrived
    failures_in_a_row: int = 0  # generations that failed since its last delivered sample
    to_ack: list[int] = field(default_factory=list)  # sample ids for its next HeartbeatAck


@dataclass
class SwitchRecord:
    epoch: int
    ratio: str
    requested_at: float
    applied_at: float | None = None
    done_at: float | None = None
    waiting_for: set[int] = field(default_factory=set)
    durations: dict[int, float] = field(default_factory=dict)
    source: str = "manual"  # manual (reflow rebalance) or auto (the allocator)
    reported: bool = False  # its duration went into metrics.jsonl


@dataclass
class _Mark:
    """Cumulative counters at a training step: the allocator's windows are differences."""

    step: int
    time: float
    epoch: int
    produced: int
    consumed: int
    fresh: int
    replay_life: int
    rollout_busy_s: float
    trainer_idle_s: float


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
        self.bounds = RunBounds(cfg.model.max_seq_len, vocab_size)
        self._save_checkpoint = save_checkpoint
        self.run = run
        self.clock = clock
        self.wall = wall
        res = cfg.resources
        assert res.initial_ratio is not None, "config not validated"
        rollout, trainer = parse_ratio(res.initial_ratio)
        self.layout = Layout.from_ratio(
            rollout,
            trainer,
            world_size=cfg.world_size,
            gpus_per_node=res.gpus_per_node,
            trainer_group_size=res.trainer_gpus_per_replica,
            rollout_group_size=res.rollout_gpus_per_replica,
        )
        self.layout_epoch = 0
        self.pending_layout: Layout | None = None
        self.switches: list[SwitchRecord] = []
        self.state = "STARTING"
        self.reason = ""
        self.step = 0
        self.policy_version = 0
        self.training_started = False
        self.last_metrics: dict[str, float] = {}
        self.workers: dict[int, WorkerInfo] = {}
        self._rank_of: dict[bytes, int] = {}  # socket identity -> registered rank
        self._next_overdue_check = 0.0
        self.ledger_violations: list[dict[str, Any]] = []
        self.undeliverable: Counter[str] = Counter()  # replies no pipe would take, by type
        self._batch_retry: dict[bytes, int] = {}  # trainer identity -> batch id to send again
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self.started_at = clock()
        self.ended_at: float | None = None
        self.data = DataPlane(cfg, prompts if prompts is not None else iter(()), clock)
        self.batch_in_flight: int | None = None
        self.batch_sent_at = 0.0
        self.batch_resent = 0
        sch = cfg.scheduler
        self.auto_rebalance = sch.auto_rebalance
        self.allocator = ProducerConsumerAllocator(
            cfg.world_size,
            res.rollout_gpus_per_replica,
            res.trainer_gpus_per_replica,
            sigma=cfg.reflow.sigma if self.data.replay_enabled else 0.0,
            cooldown_steps=sch.cooldown_steps,
            margin=sch.rebalance_margin,
            min_window_steps=min(3, sch.window_steps),
        )
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
        self._marks: list[_Mark] = []
        self.lost_ranks: list[dict[str, Any]] = []
        self.generated_tokens = 0  # tokens of every accepted trajectory
        self._tokens_at_first_step = 0  # dead rollout ranks the run survived
        self._consumed_total = 0
        self._fresh_total = 0  # samples trained on for the first time
        self._replay_life_total = 0  # later batches those could still join (delta - age)
        self.engine_profile = EngineRateProfile()
        self._delivered_rewards: list[float] = [0.0, 0]  # sum, count since the last step
        self._tokens_at_last_step = 0  # generated_tokens at the previous step
        self.metrics_log: list[dict[str, Any]] = []  # drained into metrics.jsonl by the server
        self.samples_log: list[dict[str, Any]] = []  # into samples.jsonl (logging.samples)
        self._all_metrics: list[dict[str, Any]] = []
        self._idle_at_first_step = 0.0
        self.evals: dict[str, float] = {}
        self.attempt = 1  # 1 + the number of resumes of this run
        self.failed_while_training = False
        self.resumed: dict[str, Any] | None = None
        self.checkpoint_pending: dict[str, Any] | None = None  # step, requested_at, then_stop
        self._stop_after_step: str | None = None  # a stop waiting for the batch in training
        self.checkpoints: list[dict[str, Any]] = []  # saved and failed, in order
        self._unreported_checkpoints: list[dict[str, Any]] = []
        self._handlers: dict[type[p.Message], Callable[[bytes, Any], list[Outgoing]]] = {
            p.Hello: self._on_hello,
            p.Ready: self._on_ready,
            p.Heartbeat: self._on_heartbeat,
            p.RoleSwitchDone: self._on_switch_done,
            p.StepDone: self._on_step_done,
            p.WorkRequest: self._on_work_request,
            p.SampleDone: self._on_sample_done,
            p.BatchRequest: self._on_batch_request,
            p.SampleFailed: self._on_sample_failed,
            p.Bye: self._on_bye,
            p.StatusRequest: self._on_status_request,
            p.RebalanceRequest: self._on_rebalance,
            p.AllocatorRequest: self._on_allocator,
            p.StopRequest: self._on_stop_request,
            p.CheckpointSaved: self._on_checkpoint_saved,
        }

    # --- input -------------------------------------------------------------------------

    def on_frames(self, identity: bytes, frames: list[bytes]) -> list[Outgoing]:
        """Decode and handle one message; invalid input is counted and dropped.

        The sender is checked before the body is decoded: a peer that is not a registered,
        live rank (a CLI client, a rank before its Hello, a rank declared dead) may send only
        a single small frame, so decoding costs nothing whoever holds the run's key."""
        rank = self._rank_of.get(identity)
        anonymous = rank is None or self.workers[rank].state in GONE
        if anonymous and (len(frames) != 1 or len(frames[0]) > p.MAX_ANONYMOUS_BYTES):
            self.reject("anonymous_too_large")
            return []
        try:
            msg = p.decode(frames)
        except p.ProtocolError as exc:
            self.reject("malformed", str(exc))
            return []
        return self.handle(identity, msg)

    def handle(self, identity: bytes, msg: p.Message) -> list[Outgoing]:
        handler = self._handlers.get(type(msg))
        if handler is None:  # a valid message that only the coordinator sends
            self.reject("unexpected", msg.TYPE)
            return []
        out = handler(identity, msg)
        return out

    def reject(self, category: str, detail: str = "") -> None:
        self.rejected[category] += 1

    def _known(self, identity: bytes, rank: int) -> WorkerInfo | None:
        """The registered, live worker behind a message, or None (counted) if it is not. A
        rank declared dead stays dead: it must register again (Hello)."""
        w = self.workers.get(rank)
        if w is None or w.identity != identity:
            self.reject("unknown_sender")
            return None
        if w.state in GONE:
            self.reject("dead_sender")
            return None
        self.accepted += 1
        w.last_seen = self.clock()
        return w

    # --- worker messages ---------------------------------------------------------------

    def _on_hello(self, identity: bytes, msg: p.Hello) -> list[Outgoing]:
        if msg.world_size != self.cfg.world_size:
            self.reject("wrong_world")
            return []
        old = self.workers.get(msg.rank)
        if old is not None and old.identity != identity and old.state not in GONE:
            self.reject("duplicate_rank")
            return []
        if self.state in TERMINAL or self.state == "STOPPING":
            self.accepted += 1
            return [(identity, p.Stop(reason=f"run is {self.state}"))]
        self.accepted += 1
        role = self.layout.role_of(msg.rank).value
        if old is not None:
            self._rank_of.pop(old.identity, None)
        self._rank_of[identity] = msg.rank
        self.workers[msg.rank] = WorkerInfo(
            rank=msg.rank,
            node=msg.node,
            pid=msg.pid,
            identity=identity,
            role=role,
            layout_epoch=self.layout_epoch,
            last_seen=self.clock(),
        )
        welcome = p.Welcome(
            rank=msg.rank,
            role=role,
            layout_epoch=self.layout_epoch,
            heartbeat_interval_s=self.cfg.control.heartbeat_interval_s,
            roles=[r.value for r in self.layout.roles()],
        )
        return [(identity, welcome)]

    def _on_ready(self, identity: bytes, msg: p.Ready) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        w.role, w.layout_epoch, w.state = msg.role, msg.layout_epoch, "idle"
        if self.state == "STARTING" and self._all_ready():
            self.state = "RUNNING"
            if self.policy_version > 0:
                # Resumed: the rollout engines start from the base model; the leader
                # restored the checkpoint's weights and broadcasts them before any work.
                return self._weight_sync()
        return []

    def _all_ready(self) -> bool:
        return len(self.workers) == self.cfg.world_size and all(
            w.state not in ("starting", *GONE) for w in self.workers.values()
        )

    def _on_heartbeat(self, identity: bytes, msg: p.Heartbeat) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        if w.state == "switching" and msg.layout_epoch == self.layout_epoch:
            # A rank reports RoleSwitchDone before its next beat; a beat from the new epoch
            # while we still wait means that report was lost: the beat stands in for it.
            self._switched(w, msg.role, msg.layout_epoch, None)
        if w.state not in ("starting", "switching"):
            w.state, w.role, w.layout_epoch = msg.state, msg.role, msg.layout_epoch
        w.rollout_time = (msg.rollout_active_s, msg.rollout_busy_s)
        w.beat_at = self.clock()
        if msg.role == Role.ROLLOUT.value and self.layout.role_of(msg.rank) == Role.ROLLOUT:
            self.generation.observe(msg.rank, msg.engine)
            self.engine_profile.observe(msg.rank, self.clock(), msg.engine)
        else:
            self.engine_profile.forget(msg.rank)
        acked, w.to_ack = w.to_ack[: p.MAX_IDS], w.to_ack[p.MAX_IDS :]  # the rest next beat
        ack = p.HeartbeatAck(step=self.step, policy_version=self.policy_version, acked=acked)
        return [(identity, ack)]

    def _on_switch_done(self, identity: bytes, msg: p.RoleSwitchDone) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        self._switched(w, msg.role, msg.layout_epoch, msg.duration_s)
        return []

    def _switched(self, w: WorkerInfo, role: str, epoch: int, duration_s: float | None) -> None:
        w.role, w.layout_epoch, w.state = role, epoch, "idle"
        current = self.switches[-1] if self.switches else None
        if current is not None and current.epoch == epoch:
            current.waiting_for.discard(w.rank)
            if duration_s is not None:
                current.durations[w.rank] = duration_s
            if not current.waiting_for and current.done_at is None:
                current.done_at = self.clock()

    def _on_step_done(self, identity: bytes, msg: p.StepDone) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None or self.state != "RUNNING":
            return []
        if msg.rank != 0 or self.layout.role_of(0) != Role.TRAINER:
            self.reject("step_not_from_leader")
            return []
        if msg.step <= self.step:  # a report sent again (its ack was lost): nothing new
            return []
        # The leader trains one batch per step: the report is for the batch in flight, the
        # next step, and one policy version on (a forged step would end or skip the run).
        if msg.step != self.step + 1:
            self.reject("bad_step")
            return []
        if self.batch_in_flight is None or msg.batch_id != self.batch_in_flight:
            self.reject("unknown_batch")
            return []
        if not self.policy_version <= msg.policy_version <= self.policy_version + 1:
            self.reject("bad_policy_version")
            return []
        self.training_started = True
        now = self.clock()
        line: dict[str, Any] = {
            "step": msg.step,
            "policy_version": msg.policy_version,
            "attempt": self.attempt,
        }
        if msg.batch_id >= 0:
            batch = self.data.finish_step(msg.batch_id, msg.policy_version)
            self.batch_in_flight = None
            self._consumed_total += len(batch.samples)
            self._count_replay_life(batch)
            line.update(
                batch_unused=batch.n_unused,
                batch_replay=batch.n_replay,
                max_sample_age=batch.max_age,
                reward_mean=sum(t.reward for t in batch.samples) / len(batch.samples),
                # rewards that crashed or timed out (scored 0, recorded by the agent)
                reward_failures=sum(
                    1 for t in batch.samples if t.extra.get("info", {}).get("reward_error")
                ),
                tokens=sum(t.n_valid for t in batch.samples),
            )
        reward_sum, delivered = self._delivered_rewards
        if delivered:  # every group, before a sampler drops any: the policy's own reward
            line["rollout_reward_mean"] = reward_sum / delivered
            line["rollout_samples"] = int(delivered)
            # their mean response length: the trend the allocator reacts to
            line["rollout_response_tokens"] = round(
                (self.generated_tokens - self._tokens_at_last_step) / delivered, 2
            )
        self._tokens_at_last_step = self.generated_tokens
        self._delivered_rewards = [0.0, 0]
        line.update(
            wall_s=round(now - self.started_at, 4),
            trainer_idle_s=round(self.data.trainer_idle_s, 4),
            layout=self.layout.ratio,
            **{k: v for k, v in msg.metrics.items() if k not in line},
        )
        if not self._all_metrics:
            self._idle_at_first_step = self.data.trainer_idle_s
            self._tokens_at_first_step = self.generated_tokens
        self.step, self.policy_version = msg.step, msg.policy_version
        problems = self.data.ledger_problems()
        line["ledger_ok"] = not problems
        if problems:  # a bug, not an input: recorded where a user looks, the run goes on
            self.ledger_violations.append({"step": self.step, "problems": problems})
            line["ledger_problems"] = problems
        self._mark(now)
        for record in self.switches:  # transitions finished since the last step
            if record.done_at is not None and record.applied_at is not None and not record.reported:
                record.reported = True
                line.setdefault("transitions", []).append(
                    {
                        "ratio": record.ratio,
                        "source": record.source,
                        "duration_s": round(record.done_at - record.applied_at, 4),
                    }
                )
        if self._unreported_checkpoints:
            line["checkpoints"], self._unreported_checkpoints = self._unreported_checkpoints, []
        decision = None
        if (
            self.auto_rebalance
            and self.step < self.cfg.train.steps
            and self.step % self.cfg.train.sync_every == 0
        ):
            decision = self._allocate()
            if decision is not None:
                line["placement"] = decision
        self.metrics_log.append(line)
        self._all_metrics.append(line)
        self.last_metrics = dict(msg.metrics)
        self.evals.update({k: v for k, v in msg.metrics.items() if k.startswith("eval_")})
        if self.step >= self.cfg.train.steps:
            return self._finish("COMPLETED", f"reached step {self.step}")
        out: list[Outgoing] = []
        if self.step % self.cfg.train.sync_every == 0:
            # Weights first: the sync group of the current layout takes part in the
            # broadcast, then a pending layout (if any) regroups everyone.
            out = self._weight_sync() + self._maybe_apply_layout()
        every = self.cfg.train.checkpoint_every
        if self._stop_after_step is not None:
            reason, self._stop_after_step = self._stop_after_step, None
            out += self._checkpoint_then_stop(reason)
        elif every and self.step % every == 0:
            out += self._request_checkpoint(then_stop=None)
        return out

    # --- allocation --------------------------------------------------------------------

    def _rollout_busy_s(self, now: float) -> float:
        """Rollout rank-seconds busy up to ``now``. The ranks report theirs with each
        heartbeat; a rank busy at its last one is counted busy since (up to two intervals),
        so that windows of a few seconds are not off by a heartbeat interval per rank."""
        cap = 2 * self.cfg.control.heartbeat_interval_s
        total = 0.0
        for w in self.workers.values():
            total += w.rollout_time[1]
            if w.state == "busy" and w.role == Role.ROLLOUT.value:
                total += min(max(now - w.beat_at, 0.0), cap)
        return total

    def _mark(self, now: float) -> None:
        stats = self.data.stats()
        self._marks.append(
            _Mark(
                step=self.step,
                time=now,
                epoch=self.layout_epoch,
                # fresh samples the trainer can use: groups the sampler rejects (uniform
                # rewards under medium_reward) cost rollout time and feed no batch
                produced=stats["delivered"] - stats["evicted"].get("sampler_rejected", 0),
                consumed=self._consumed_total,
                fresh=self._fresh_total,
                replay_life=self._replay_life_total,
                rollout_busy_s=self._rollout_busy_s(now),
                trainer_idle_s=self.data.trainer_idle_s,
            )
        )
        del self._marks[: -(self.cfg.scheduler.window_steps + 1)]

    def window(self) -> WindowStats | None:
        """Rates over the last ``window_steps`` steps of the current layout."""
        last = self._marks[-1]
        same = [m for m in self._marks if m.epoch == last.epoch and m.step < last.step]
        if not same or self._switch_in_progress():
            return None
        first = same[0]
        dt = last.time - first.time
        idle = last.trainer_idle_s - first.trainer_idle_s
        return WindowStats(
            steps=last.step - first.step,
            seconds=dt,
            produced=last.produced - first.produced,
            consumed=last.consumed - first.consumed,
            rollout_busy_s=last.rollout_busy_s - first.rollout_busy_s,
            trainer_busy_s=self.layout.n_trainer_ranks * max(dt - idle, 0.0),
            fresh=last.fresh - first.fresh,
            replay_life=last.replay_life - first.replay_life,
        )

    def _count_replay_life(self, batch: Batch) -> None:
        """How much replay the batch's fresh samples can still supply: each may join the
        later batches of versions up to ``oldest_version + delta`` (the allocator keeps
        rollout ranks that replay could not replace)."""
        fresh = batch.samples[: batch.n_unused]
        delta = self.cfg.reflow.delta
        self._fresh_total += len(fresh)
        self._replay_life_total += sum(max(0, delta - t.age(batch.policy_version)) for t in fresh)

    def _allocate(self) -> dict[str, Any] | None:
        """One allocator decision at a sync point; a chosen placement becomes the pending
        layout, applied right after this step's weight sync like a manual rebalance."""
        if self.pending_layout is not None or self._switch_in_progress():
            return None
        w = self.window()
        if w is None:
            return None
        current = Placement(self.layout.n_rollout_ranks, self.layout.n_trainer_ranks)
        d = self.allocator.decide(self.step, current, w)
        if d.applied:
            rollout, trainer = parse_ratio(d.best)
            self.pending_layout = self.layout.with_ratio(rollout, trainer)
            self.switches.append(
                SwitchRecord(
                    epoch=self.layout_epoch + 1,
                    ratio=d.best,
                    requested_at=self.clock(),
                    source="auto",
                )
            )
        return d.as_dict()

    def _weight_sync(self) -> list[Outgoing]:
        """Tell the trainer leader and every rollout rank to run the weight broadcast."""
        msg = p.WeightSync(policy_version=self.policy_version, layout_epoch=self.layout_epoch)
        members = {0, *self.layout.ranks(Role.ROLLOUT)}
        return [
            (w.identity, msg)
            for w in self.workers.values()
            if w.rank in members and w.state not in GONE
        ]

    def _on_work_request(self, identity: bytes, msg: p.WorkRequest) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        requests = []
        if self.state == "RUNNING" and self.layout.role_of(msg.rank).value == "rollout":
            gen = self.generation
            running = self.data.dispatcher.running_at(msg.rank)
            slots = gen.grant(msg.rank, msg.slots, running)
            if slots < msg.slots:
                self.data.dispatcher.blocked["concurrency_cap"] += 1

            def admit(r: Request) -> bool:
                prompt_ids = r.prompt.get("prompt_ids") or ()
                return gen.admit(msg.rank, r.sample_id, r.group_id, len(prompt_ids))

            for r in self.data.request_work(msg.rank, slots, admit) if slots else []:
                requests.append(
                    {
                        "sample_id": r.sample_id,
                        "group_id": r.group_id,
                        "prompt_id": r.prompt_id,
                        "prompt": r.prompt,
                    }
                )
        return [(identity, p.Work(policy_version=self.policy_version, requests=requests))]

    def _on_sample_done(self, identity: bytes, msg: p.SampleDone) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        # Whatever becomes of it, rank 0 has decided: the rank may forget it (sending it
        # again would not change the decision).
        w.to_ack.append(msg.sample_id)
        t = wire.trajectory(msg)
        entry = self.data.dispatcher.outstanding.get(t.sample_id)
        if entry is not None and entry[1] == msg.rank:
            why = sample_problem(
                token_ids=t.token_ids,
                logprobs=t.logprobs,
                versions=t.versions,
                extra=t.extra,
                reward=t.reward,
                ids=(t.group_id, t.prompt_id),
                request=entry[0],
                policy_version=self.policy_version,
                bounds=self.bounds,
            )
            if why is not None:
                self.data.refuse(t.sample_id, msg.rank, why)
                self.generation.finished(t.sample_id, None)
                return []
        if not self.data.deliver(t):
            return []
        self.workers[msg.rank].failures_in_a_row = 0
        self._delivered_rewards[0] += t.reward
        self._delivered_rewards[1] += 1
        self.generated_tokens += len(t.token_ids)
        self.generation.finished(t.sample_id, len(t.token_ids))
        if self.cfg.logging.samples:
            self.samples_log.append(
                {
                    "sample_id": t.sample_id,
                    "group_id": t.group_id,
                    "rank": msg.rank,
                    "reward": t.reward,
                    "n_valid": t.n_valid,
                    "versions": [list(v) for v in t.versions],
                    "prompt_ids": t.extra.get("prompt_ids", []),
                    "token_ids": list(t.token_ids),
                    "loss_mask": t.extra.get("loss_mask"),
                    "info": t.extra.get("info", {}),
                }
            )
        return []

    def _on_sample_failed(self, identity: bytes, msg: p.SampleFailed) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        w.to_ack.append(msg.sample_id)
        if not self.data.failed(msg.sample_id, msg.rank):
            return []
        self.generation.finished(msg.sample_id, None)
        # The sample is requeued. An engine that fails every generation (a model it cannot
        # serve) would requeue forever; past a limit the run fails and says why.
        w.failures_in_a_row += 1
        limit = self.cfg.control.max_generation_failures
        if limit and w.failures_in_a_row >= limit and self.state not in TERMINAL:
            return self._finish(
                "FAILED",
                f"rank {msg.rank}: {w.failures_in_a_row} generations in a row failed, "
                f"last: {msg.reason}",
            )
        return []

    def _on_batch_request(self, identity: bytes, msg: p.BatchRequest) -> list[Outgoing]:
        if self._known(identity, msg.rank) is None:
            return []
        if self.state != "RUNNING" or self.layout.role_of(msg.rank).value != "trainer":
            return [(identity, p.BatchWait(reason=f"run is {self.state}"))]
        if self.batch_in_flight is not None:
            batch = self.data.batches.get(self.batch_in_flight)
            if msg.rank == 0 and msg.last_batch_id != self.batch_in_flight and batch is not None:
                # The leader asks again without having trained the batch in flight: it was
                # lost on the way. Send it again (trainers skip a batch they already have).
                self.batch_resent += 1
                return self._send_batch(identity, batch)
            return [(identity, p.BatchWait(reason="step report pending"))]
        if self._switch_in_progress():
            return [(identity, p.BatchWait(reason="sync point in progress"))]
        if self.checkpoint_pending is not None or self._stop_after_step is not None:
            return [(identity, p.BatchWait(reason="checkpoint in progress"))]
        batch = self.data.next_batch()
        if batch is None:
            return [(identity, p.BatchWait(reason="waiting for samples"))]
        self.batch_in_flight = batch.batch_id
        self.batch_sent_at = self.clock()
        return self._send_batch(identity, batch)

    def _send_batch(self, identity: bytes, batch: Batch) -> list[Outgoing]:
        # Every trainer rank gets the batch and trains on its shard (data parallelism);
        # the leader, which asked, reports the step.
        out = wire.batch_message(batch)
        trainers = set(self.layout.ranks(Role.TRAINER))
        return [(identity, out)] + [
            (w.identity, out)
            for w in self.workers.values()
            if w.rank in trainers and w.identity != identity and w.state not in GONE
        ]

    def _on_bye(self, identity: bytes, msg: p.Bye) -> list[Outgoing]:
        w = self._known(identity, msg.rank)
        if w is None:
            return []
        w.state = "exited"
        if self.state in ("STARTING", "RUNNING"):
            return self._finish("FAILED", f"rank {msg.rank} left: {msg.reason}")
        self._check_ended()
        return []

    # --- client requests ---------------------------------------------------------------

    def _on_status_request(self, identity: bytes, msg: p.StatusRequest) -> list[Outgoing]:
        self.accepted += 1
        return [(identity, p.StatusReply(status=self.status()))]

    def _on_rebalance(self, identity: bytes, msg: p.RebalanceRequest) -> list[Outgoing]:
        self.accepted += 1
        if self.state != "RUNNING":
            return [(identity, p.Reply(ok=False, text=f"run is {self.state}, not RUNNING"))]
        try:
            target = self.layout.with_ratio(msg.rollout, msg.trainer)
        except LayoutError as exc:
            return [(identity, p.Reply(ok=False, text=str(exc)))]
        self.pending_layout = target
        self.switches.append(
            SwitchRecord(epoch=self.layout_epoch + 1, ratio=target.ratio, requested_at=self.clock())
        )
        self.allocator.changed(self.step)  # a manual placement restarts the cooldown
        text = f"rebalance to {target.ratio} accepted; applied at the next sync point"
        now = [] if self.training_started else self._maybe_apply_layout()
        return [(identity, p.Reply(ok=True, text=text)), *now]

    def _on_allocator(self, identity: bytes, msg: p.AllocatorRequest) -> list[Outgoing]:
        self.accepted += 1
        self.auto_rebalance = msg.auto
        text = f"automatic rebalancing {'on' if msg.auto else 'off'}"
        return [(identity, p.Reply(ok=True, text=text))]

    def _on_stop_request(self, identity: bytes, msg: p.StopRequest) -> list[Outgoing]:
        self.accepted += 1
        if self.state in TERMINAL:
            return [(identity, p.Reply(ok=True, text=f"run already {self.state}"))]
        out = self.request_stop(msg.reason or "stop requested")
        return [(identity, p.Reply(ok=True, text="stopping")), *out]

    def request_stop(self, reason: str) -> list[Outgoing]:
        """Graceful stop (CLI, SIGTERM, SIGUSR2): a checkpoint of the current step first
        (after the batch in training, if any), then every rank is told to leave."""
        if self.state in TERMINAL or self.state == "STOPPING":
            return []
        if self._stop_after_step is not None or (
            self.checkpoint_pending is not None and self.checkpoint_pending["then_stop"]
        ):
            return []  # already on its way
        if self.state == "RUNNING" and self.training_started:
            self.reason = f"stopping after a checkpoint: {reason}"
            if self.batch_in_flight is not None:
                self._stop_after_step = reason
                return []
            return self._checkpoint_then_stop(reason)
        return self._stop_now(reason)

    def _stop_now(self, reason: str) -> list[Outgoing]:
        if self.state in TERMINAL or self.state == "STOPPING":
            return []
        self.state, self.reason = "STOPPING", reason
        return self._broadcast(p.Stop(reason=reason))

    # --- checkpoints -------------------------------------------------------------------

    def _leader(self) -> WorkerInfo | None:
        w = self.workers.get(0)
        return w if w is not None and w.state not in GONE else None

    def _checkpoint_then_stop(self, reason: str) -> list[Outgoing]:
        last = self.checkpoints[-1] if self.checkpoints else None
        if last is not None and last["step"] == self.step and last["ok"]:
            return self._stop_now(reason)  # this step is saved already
        if self.checkpoint_pending is not None:  # one is being written: stop after it
            self.checkpoint_pending["then_stop"] = reason
            return []
        out = self._request_checkpoint(then_stop=reason)
        return out if self.checkpoint_pending is not None else self._stop_now(reason)

    def _request_checkpoint(self, then_stop: str | None) -> list[Outgoing]:
        leader = self._leader()
        if self._save_checkpoint is None or leader is None or self.checkpoint_pending:
            return []
        self.checkpoint_pending = {
            "step": self.step,
            "requested_at": self.clock(),
            "then_stop": then_stop,
        }
        return [(leader.identity, p.Checkpoint(step=self.step))]

    def _on_checkpoint_saved(self, identity: bytes, msg: p.CheckpointSaved) -> list[Outgoing]:
        if self._known(identity, msg.rank) is None:
            return []
        pending = self.checkpoint_pending
        if msg.rank != 0 or pending is None or msg.step != pending["step"]:
            self.reject("unexpected_checkpoint")
            return []
        return self._end_checkpoint(msg.ok, msg.error)

    def _end_checkpoint(self, trainer_ok: bool, error: str) -> list[Outgoing]:
        pending = self.checkpoint_pending
        assert pending is not None
        self.checkpoint_pending = None
        record: dict[str, Any] = {
            "step": pending["step"],
            "policy_version": self.policy_version,
            "ok": False,
        }
        if not trainer_ok:
            record["error"] = f"trainer: {error}"
        else:
            assert self._save_checkpoint is not None
            try:
                record["path"] = self._save_checkpoint(
                    pending["step"], self.policy_version, self.state_dict()
                )
                record["ok"] = True
            except Exception as exc:  # disk full, permissions: the run goes on without it
                record["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        record["took_s"] = round(self.clock() - pending["requested_at"], 3)
        self.checkpoints.append(record)
        self._unreported_checkpoints.append(record)  # into the next step's metrics line
        if pending["then_stop"] is not None:
            return self._stop_now(pending["then_stop"])
        return []

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs from rank 0 (between batches only)."""
        return {
            "format": STATE_FORMAT,
            "run": self.run,
            "attempt": self.attempt,
            "step": self.step,
            "policy_version": self.policy_version,
            "layout": [self.layout.n_rollout_ranks, self.layout.n_trainer_ranks],
            "data": self.data.state_dict(),
            "consumed_total": self._consumed_total,
            "generated_tokens": self.generated_tokens,
            "evals": dict(self.evals),
            "auto_rebalance": self.auto_rebalance,
            "saved_at": self.wall(),
        }

    def load_state_dict(self, state: dict[str, Any], source: str = "") -> None:
        """Continue a run from :meth:`state_dict` (before any rank registers)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"coordinator state format {state.get('format')!r}")
        assert not self.workers, "restore before the ranks register"
        rollout, trainer = state["layout"]
        self.layout = self.layout.with_ratio(rollout, trainer)
        self.data.load_state_dict(state["data"])
        self.step = int(state["step"])
        self.policy_version = int(state["policy_version"])
        self.training_started = self.step > 0
        self.attempt = int(state["attempt"]) + 1
        self._consumed_total = int(state["consumed_total"])
        self.generated_tokens = int(state["generated_tokens"])
        self._tokens_at_last_step = self.generated_tokens
        self.evals = dict(state["evals"])
        self.auto_rebalance = bool(state["auto_rebalance"])
        self.allocator.changed(self.step)
        self.resumed = {
            "from": source,
            "step": self.step,
            "policy_version": self.policy_version,
            "buffer": self.buffer_digest(),
        }

    def buffer_digest(self) -> dict[str, Any]:
        """Sample ids and checksums of everything the buffer holds, and the queue."""
        held = sorted(self.data.buffer.samples(), key=lambda t: t.sample_id)
        return {
            "samples": {str(t.sample_id): trajectory_digest(t) for t in held},
            "pending": [r.sample_id for r in self.data.dispatcher.pending],
            "prompts_drawn": self.data.dispatcher._next_prompt,
        }

    def fail(self, reason: str) -> list[Outgoing]:
        return self._finish("FAILED", reason)

    # --- layout ------------------------------------------------------------------------

    def _switch_in_progress(self) -> bool:
        return (
            bool(self.switches)
            and self.switches[-1].applied_at is not None
            and (self.switches[-1].done_at is None)
        )

    def _maybe_apply_layout(self) -> list[Outgoing]:
        """Apply a pending layout at a synchronization point.

        Until training has started every moment is a sync point; afterwards the trainer's
        step reports at multiples of ``sync_every`` are.
        """
        if self.pending_layout is None or self._switch_in_progress():
            return []
        target, self.pending_layout = self.pending_layout, None
        record = self.switches[-1]
        if target == self.layout:
            record.applied_at = record.done_at = self.clock()
            record.epoch = self.layout_epoch
            return []
        self.layout_epoch += 1
        self.layout = target
        record.epoch, record.applied_at = self.layout_epoch, self.clock()
        alive = [w for w in self.workers.values() if w.state not in GONE]
        record.waiting_for = {w.rank for w in alive}
        for w in alive:
            if w.role != target.role_of(w.rank).value:
                w.state = "switching"
                # A rank leaving the rollout pool drops its in-flight generations; their
                # requests go back to the front of the queue, so no sample is lost.
                self.data.worker_gone(w.rank)
                self.generation.worker_left(w.rank)
        roles = [r.value for r in target.roles()]
        return self._broadcast(p.RoleSwitch(layout_epoch=self.layout_epoch, roles=roles))

    # --- time --------------------------------------------------------------------------

    def tick(self) -> list[Outgoing]:
        now = self.clock()
        out: list[Outgoing] = []
        for w in self.workers.values():
            # A rank starting its engines (model build, engine start) is silent for a
            # while; it gets the registration budget, not the heartbeat timeout.
            timeout = (
                self.cfg.control.register_timeout_s
                if w.state == "starting"
                else self.cfg.control.heartbeat_timeout_s
            )
            if w.state not in GONE and now - w.last_seen > timeout:
                w.state = "dead"
                why = (
                    f"rank {w.rank} ({w.role}, pid {w.pid} on {w.node}) sent no heartbeat "
                    f"for {now - w.last_seen:.1f} s"
                )
                if self._survivable(w):
                    # Its work goes back to the front of the queue; the other rollout
                    # ranks take it. What it delivered before dying is in the buffer.
                    requeued = self.data.worker_gone(w.rank)
                    self.generation.worker_left(w.rank)
                    self.lost_ranks.append(
                        {"rank": w.rank, "reason": why, "requeued": requeued, "at_step": self.step}
                    )
                elif self.state in ("STARTING", "RUNNING"):
                    out += self._finish("FAILED", why)
        if self.state == "STARTING" and now - self.started_at > self.cfg.control.register_timeout_s:
            ready = sum(w.state not in ("starting", *GONE) for w in self.workers.values())
            out += self._finish(
                "FAILED",
                f"only {ready} of {self.cfg.world_size} ranks became ready within "
                f"{self.cfg.control.register_timeout_s:.0f} s",
            )
        if self.state == "RUNNING" and not self.training_started:
            out += self._maybe_apply_layout()
        if self.state == "RUNNING" and now >= self._next_overdue_check:
            out += self._time_out_work(now)
        if self._batch_retry:
            out += self._retry_batches()
        pending = self.checkpoint_pending
        if pending is not None:
            if self._leader() is None:
                out += self._end_checkpoint(False, "the trainer leader is gone")
            elif now - pending["requested_at"] > self.cfg.control.checkpoint_timeout_s:
                out += self._end_checkpoint(
                    False, f"no answer within {self.cfg.control.checkpoint_timeout_s:.0f} s"
                )
        if self.state == "STOPPING" and self._all_gone():
            self.state, self.ended_at = "STOPPED", now
        self._check_ended()
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
            return self._finish(
                "FAILED",
                f"no step report for batch {self.batch_in_flight} within "
                f"{ctl.step_timeout_s:.0f} s (control.step_timeout_s)",
            )
        return []

    def _retry_batches(self) -> list[Outgoing]:
        retry, self._batch_retry = self._batch_retry, {}
        out: list[Outgoing] = []
        for identity, batch_id in retry.items():
            rank = self._rank_of.get(identity)
            batch = self.data.batches.get(batch_id)
            if batch is None or batch_id != self.batch_in_flight or rank is None:
                continue  # trained or abandoned meanwhile
            if self.workers[rank].state in GONE:
                continue
            self.batch_resent += 1
            out.append((identity, wire.batch_message(batch)))
        return out

    def undelivered(self, identity: bytes, msg: p.Message) -> None:
        """The server could not hand ``msg`` to ``identity`` (no pipe to that peer, or its
        queue full). Work handed out in it goes back to the queue at once; everything else
        is asked for again by the rank (batches, acks) or repeated (heartbeat acks)."""
        self.undeliverable[msg.TYPE] += 1
        rank = self._rank_of.get(identity)
        if isinstance(msg, p.Batch) and rank is not None:
            # Only the leader asks for batches; a trainer replica that missed its copy
            # would leave the leader waiting in the collective: send it again next tick.
            self._batch_retry[identity] = msg.batch_id
        if isinstance(msg, p.Work) and rank is not None:
            for r in reversed(msg.requests):  # each goes to the front: keep their order
                if self.data.dispatcher.requeue(r["sample_id"], rank, "undelivered"):
                    self.generation.finished(r["sample_id"], None)

    def _survivable(self, w: WorkerInfo) -> bool:
        """A dead rank the run can go on without: a rollout rank, other rollout ranks still
        alive, and no process group binding it (a torch.distributed group cannot shrink:
        its next collective would wait for the dead member)."""
        if self.state != "RUNNING" or self.layout.role_of(w.rank) != Role.ROLLOUT:
            return False
        if needs_collective(self.cfg):
            return False
        alive = [
            x
            for x in self.workers.values()
            if x.state not in GONE and self.layout.role_of(x.rank) == Role.ROLLOUT
        ]
        return bool(alive)

    def _finish(self, state: str, reason: str) -> list[Outgoing]:
        if self.state in TERMINAL:
            return []
        # A rank lost or failing mid-training is what a restart from the last checkpoint
        # is for; failing to start (or a bad recipe) would fail the same way again.
        self.failed_while_training = state == "FAILED" and self.training_started
        self.state, self.reason = state, reason
        self.ended_at = self.clock()
        return self._broadcast(p.Stop(reason=reason))

    def _all_gone(self) -> bool:
        return all(w.state in GONE for w in self.workers.values())

    def _check_ended(self) -> None:
        if self.state == "STOPPING" and self._all_gone():
            self.state, self.ended_at = "STOPPED", self.clock()

    @property
    def finished(self) -> bool:
        """Terminal, and every rank has left (or the grace period is over)."""
        if self.state not in TERMINAL:
            return False
        assert self.ended_at is not None
        grace_over = self.clock() - self.ended_at > self.cfg.control.stop_grace_s
        return self._all_gone() or grace_over

    def _broadcast(self, msg: p.Message) -> list[Outgoing]:
        return [(w.identity, msg) for w in self.workers.values() if w.state not in GONE]

    # --- reporting ---------------------------------------------------------------------

    def rollout_idle_ratio(self) -> float:
        """Share of rollout-role time with nothing generating (from heartbeats)."""
        active = sum(w.rollout_time[0] for w in self.workers.values())
        busy = sum(w.rollout_time[1] for w in self.workers.values())
        return 1.0 - busy / active if active > 0 else 0.0

    def _switch_records(self, records: list[SwitchRecord]) -> list[dict[str, Any]]:
        return [
            {
                "epoch": s.epoch,
                "ratio": s.ratio,
                "applied": s.applied_at is not None,
                "duration_s": (
                    round(s.done_at - s.applied_at, 3)
                    if s.done_at is not None and s.applied_at is not None
                    else None
                ),
                "max_rank_switch_s": max(s.durations.values(), default=None),
                "source": s.source,
            }
            for s in records
        ]

    def _resumed_brief(self) -> dict[str, Any] | None:
        if self.resumed is None:
            return None
        buf = self.resumed["buffer"]
        return {
            **{k: v for k, v in self.resumed.items() if k != "buffer"},
            "samples": len(buf["samples"]),
            "pending": len(buf["pending"]),
        }

    def summary(self) -> dict[str, Any]:
        """End-of-run figures (``summary.json``)."""
        end = self.ended_at if self.ended_at is not None else self.clock()
        wall = max(end - self.started_at, 1e-9)
        ledger = self.data.ledger()
        tokens = sum(line.get("tokens", 0) for line in self._all_metrics)
        first = self._all_metrics[0]["wall_s"] if self._all_metrics else 0.0
        syncs = sorted(x["weight_sync_s"] for x in self._all_metrics if "weight_sync_s" in x)
        return {
            "run": self.run,
            "state": self.state,
            "reason": self.reason,
            "mode": self.cfg.reflow.mode,
            "steps": self.step,
            "wall_s": round(wall, 3),
            "trainer_tokens_per_s": round(tokens / wall, 2),
            # Idle is counted from the first step on: before it the pools are warming up.
            "trainer_idle_ratio": round(
                max(0.0, self.data.trainer_idle_s - self._idle_at_first_step)
                / max(wall - first, 1e-9),
                4,
            ),
            "rollout_idle_ratio": round(self.rollout_idle_ratio(), 4),
            "rollout_tokens": self.generated_tokens,
            # over the training window (first step to the end), as trainer idle is
            "rollout_tokens_per_s": round(
                (self.generated_tokens - self._tokens_at_first_step) / max(wall - first, 1e-9), 2
            ),
            "eval_reward_start": self.evals.get("eval_reward_start"),
            "eval_reward_end": self.evals.get("eval_reward_end"),
            "weight_sync_s_median": syncs[len(syncs) // 2] if syncs else None,
            # tokens and seconds of the rollout engines by running requests (heartbeats)
            "rollout_decode_by_concurrency": self.engine_profile.summary(),
            "switches": self._switch_records(self.switches),
            "lost_ranks": list(self.lost_ranks),
            "attempt": self.attempt,
            "resumed": self._resumed_brief(),
            "checkpoints": list(self.checkpoints),
            "failed_while_training": self.failed_while_training,
            "ledger_violations": len(self.ledger_violations),
            "samples": {
                k: ledger[k]
                for k in (
                    "dispatched",
                    "delivered",
                    "consumed",
                    "replayed",
                    "evicted",
                    "lost",
                    "duplicated",
                )
            },
        }

    def status(self) -> dict[str, Any]:
        now = self.clock()
        pending = self.pending_layout.ratio if self.pending_layout is not None else None
        workers = []
        for rank in sorted(self.workers):
            w = self.workers[rank]
            workers.append(
                {
                    "rank": w.rank,
                    "node": w.node,
                    "pid": w.pid,
                    "role": w.role,
                    "state": w.state,
                    "layout_epoch": w.layout_epoch,
                    "heartbeat_age_s": round(now - w.last_seen, 3),
                }
            )
        switches = self._switch_records(self.switches[-10:])
        return {
            "run": self.run,
            "state": self.state,
            "reason": self.reason,
            "mode": self.cfg.reflow.mode,
            "step": self.step,
            "total_steps": self.cfg.train.steps,
            "policy_version": self.policy_version,
            "uptime_s": round(now - self.started_at, 3),
            "layout": {
                "rollout_gpus": self.layout.n_rollout_ranks,
                "trainer_gpus": self.layout.n_trainer_ranks,
                "epoch": self.layout_epoch,
                "pending": pending,
                "switching": self._switch_in_progress(),
            },
            "workers": workers,
            "buffer": {**self.data.stats(), "ledger": self.data.ledger()},
            "metrics": dict(self.last_metrics),
            "switches": switches,
            "generation": self.generation.status(),
            "lost_ranks": list(self.lost_ranks),
            "attempt": self.attempt,
            "resumed": self._resumed_brief(),
            "checkpoint": {
                "pending": self.checkpoint_pending,
                "last": next((c for c in reversed(self.checkpoints) if c["ok"]), None),
                "failed": sum(1 for c in self.checkpoints if not c["ok"]),
            },
            "allocator": {
                "auto": self.auto_rebalance,
                "decisions": [d.as_dict() for d in self.allocator.decisions[-5:]],
            },
            "control": {
                "accepted": self.accepted,
                "rejected": sum(self.rejected.values()),
                "rejected_by_reason": dict(self.rejected),
                "undeliverable": dict(self.undeliverable),
                "batches_resent": self.batch_resent,
            },
            "ledger_violations": self.ledger_violations[-5:],
            "updated_at": self.wall(),
        }
