"""The replay data cycle as one object: dispatcher + replay buffer + policy version.

The coordinator holds one :class:`DataPlane` and maps protocol messages onto it; the unit
tests and the simulator drive it directly. Pure logic with an injected clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from runtime.config.schema import ReflowConfig, TrainConfig
from runtime.control.dispatcher import Dispatcher
from runtime.control.replay_buffer import Batch, ReplayBuffer
from runtime.control.samplers import make_replay_filter, make_sampler
from runtime.data.sample import ParkedRollout, Request, Sample, sample_digest


class DataPlane:
    def __init__(
        self,
        rf: ReflowConfig,
        train: TrainConfig,
        group_size: int,
        prompts: Iterator[dict[str, Any]],
        clock: Callable[[], float],
    ) -> None:
        """Its own sections of the run's config: ``reflow``, ``train`` and
        ``algorithm.group_size`` (the run builds it: runtime/control/run.py)."""
        assert rf.sigma is not None and rf.B_max is not None, "config not validated"
        self.clock = clock
        self.mode_policy = rf.policy  # barrier or streaming, replay (runtime/config/modes.py)
        self.batch_size = train.batch_size
        self.buffer = ReplayBuffer(
            batch_size=train.batch_size,
            sigma=rf.replay_share,
            delta=rf.delta,
            group_size=group_size,
            sampler=make_sampler(rf.sampler),
            replay_filter=make_replay_filter(rf.replay_filter) if rf.replays else None,
            seed=train.seed,
            fresh_order=rf.fresh_order,
            age_from=rf.age_from,
            max_stragglers=rf.stragglers_allowed,
        )
        self.dispatcher = Dispatcher(
            prompts=prompts,
            group_size=group_size,
            B_max=rf.B_max,
            delta=rf.delta,
            batch_size=train.batch_size,
            clock=clock,
            closed_groups=lambda: self.buffer.closed_groups,
        )
        self.train, self.delta = train, rf.delta
        self.last_refusal: str | None = None  # why the last work request got less
        self.policy_version = 0  # of the weights last published: one per sync
        self.step = 0  # training steps done
        self.rejected: Counter[str] = Counter()
        # sample id -> the rank it came from (-1: restored from a checkpoint): a rank that
        # sends a result again (no ack reached it) is told apart from a real duplicate
        self.delivered_ids: dict[int, int] = {}
        self.delivered_by_worker: Counter[int] = Counter()
        self.trainer_idle_s = 0.0
        self._waiting_since: float | None = None

    # --- rollout side ------------------------------------------------------------------

    def request_work(
        self, worker: int, slots: int, admit: Callable[[Request], bool] | None = None
    ) -> list[Request]:
        """Up to ``slots`` requests for ``worker``; when it gets fewer, ``last_refusal``
        says why (a dispatcher limit or a batch barrier)."""
        out = self._request_work(worker, slots, admit)
        if len(out) < slots:
            # (a streaming mode's take always says why it stopped short: no barrier cause)
            self.last_refusal = self.dispatcher.last_block or self.mode_policy.barrier_cause
        else:
            self.last_refusal = None
        return out

    def _request_work(
        self, worker: int, slots: int, admit: Callable[[Request], bool] | None
    ) -> list[Request]:
        self.dispatcher.last_block = None
        buffered = len(self.buffer.unused) + self.buffer.n_waiting_for_group
        if self.mode_policy.barrier:
            # Batch-at-a-time baselines, a step being one weight publication (sync_every
            # trainer steps), as verl counts them: `disaggregated_sync` generates the
            # interval's batches, then waits while the trainer trains them (rollout idles;
            # where its slots hold less than an interval it goes on with the interval's
            # rest while the first batches train, as the budget allows: that favours the
            # baseline, which in verl would train only once the interval is generated);
            # `one_step_off` generates the next interval's batches while the trainer
            # trains this one's; `colocated_sync` generates the batches of its next train
            # phase (every rank trains them: runtime/control/colocation.py).
            # (a batch in training is still part of the current interval)
            ahead = (
                buffered + len(self.dispatcher.outstanding) + self.batch_size * len(self.batches)
            )
            t, cause = self.train, self.mode_policy.barrier_cause
            assert cause is not None  # a barrier mode books its refusals under its cause
            limit = self.mode_policy.batches_ahead(self.step, t.sync_every, t.steps)
            allowed = max(0, self.batch_size * limit - ahead)
            if self.mode_policy.rollout_stops_while_training and self.batches:
                allowed = 0  # every rank is training
            # Groups already started are always finished, or the barrier could deadlock.
            slots = min(slots, max(allowed, self.dispatcher.open_group_remainder()))
            if slots == 0:
                self.dispatcher.blocked[cause] += 1
                return []
        # The steps left that may still take a sample of this version: those after the
        # steps done and after the batch in training, drawn already (counting its step,
        # rollout generated one batch more than delta lets any later batch take; AReaL's
        # staleness capacity counts that batch too).
        last = self.train.last_step_for(self.policy_version, self.delta)
        horizon = last - self.step - len(self.batches)
        return self.dispatcher.take(
            worker,
            slots,
            buffered=buffered,
            version=self.policy_version,
            horizon=horizon,
            admit=admit,
        )

    def deliver(self, t: Sample) -> bool:
        """A finished sample from a rollout worker; False (counted) if unexpected."""
        req = self.dispatcher.finished(t.sample_id, t.worker)
        if req is None:
            d = self.dispatcher
            if self.delivered_ids.get(t.sample_id, -2) == t.worker:
                why = "resent"  # at-least-once delivery: the same result, again
            elif d.was_taken_back_from(t.sample_id, t.worker):
                # requeued away from this worker (a role switch, say): someone else's now,
                # whether or not its new owner delivered yet
                why = "stale_worker"
            elif t.sample_id in self.delivered_ids:
                why = "duplicate"  # a sample this worker was never handed
            elif t.sample_id in d.outstanding or any(r.sample_id == t.sample_id for r in d.pending):
                why = "not_its_request"  # owed, but never handed to this worker
            else:
                why = "unknown"
            self.rejected[why] += 1
            return False
        if (req.group_id, req.prompt_id) != (t.group_id, t.prompt_id):
            self.rejected["mismatched_ids"] += 1
            self.dispatcher.reinstate(req, t.worker)  # still owed
            return False
        t.dispatched_at = req.dispatched_at
        # Each extra version span is one pause across a weight sync (partial rollout).
        holds = len(t.versions) - 1
        self.dispatcher.transitions["running->held"] += holds
        self.dispatcher.transitions["held->running"] += holds
        self.delivered_ids[t.sample_id] = t.worker
        self.delivered_by_worker[t.worker] += 1
        self.buffer.add(t)
        self.dispatcher.resumed(req, t)  # what became of a parked rollout it continued
        return True

    def outstanding_at(self, sample_id: int, worker: int) -> Request | None:
        """The request ``sample_id`` if it is out at ``worker`` (None otherwise)."""
        entry = self.dispatcher.outstanding.get(sample_id)
        return entry[0] if entry is not None and entry[1] == worker else None

    @property
    def has_outstanding(self) -> bool:
        return bool(self.dispatcher.outstanding)

    def running_at(self, worker: int) -> int:
        """Requests out at ``worker``."""
        return self.dispatcher.running_at(worker)

    @property
    def n_unused(self) -> int:
        """Samples in the buffer no batch has taken yet."""
        return len(self.buffer.unused)

    def fresh_missing(self) -> int:
        """Fresh samples the next batch still lacks (0: it has enough): its fresh minimum,
        or, with replay too short to fill the rest, what unused and replay lack together."""
        b = self.buffer
        unused = len(b.unused)
        return max(0, b.min_unused - unused, b.batch_size - unused - len(b.replay))

    @property
    def shortfall(self) -> str | None:
        """What the last batch that could not be made lacked (fresh, replay, or what the
        sampler would take)."""
        return self.buffer.shortfall

    def count_blocked(self, cause: str) -> None:
        """A work request granted less than it asked for, for ``cause`` outside the
        dispatcher (the generation scheduler's cap)."""
        self.dispatcher.blocked[cause] += 1

    def time_out(self, cutoff: float, reason: str = "timeout") -> list[int]:
        """Requests handed out before ``cutoff`` back to the queue; their sample ids."""
        overdue = self.dispatcher.overdue(cutoff)
        for sid, worker in overdue:
            self.dispatcher.requeue(sid, worker, reason)
        return [sid for sid, _ in overdue]

    def requeue(self, sample_id: int, worker: int, reason: str) -> bool:
        """One request back from ``worker`` to the front of the queue (never delivered)."""
        return self.dispatcher.requeue(sample_id, worker, reason)

    def keep_parked(self, sample_id: int, worker: int, rollout: ParkedRollout) -> bool:
        """A request's parked rollout at a stop, kept with it for the checkpoint."""
        return self.dispatcher.keep_parked(sample_id, worker, rollout)

    def count_parked(self, what: str, n: int = 1) -> None:
        """A parked rollout refused, or drivers that never reported theirs."""
        self.dispatcher.parked[what] += n

    def parked_kept(self) -> dict[str, int]:
        """The requests in flight that carry a parked rollout (out at a rank, or back in
        the queue because their rank was lost), and its tokens: what a checkpoint kept."""
        d = self.dispatcher
        kept = [r.resume for r in [*(r for r, _ in d.outstanding.values()), *d.pending]]
        return {
            "requests": sum(1 for x in kept if x is not None),
            "tokens": sum(len(x) for x in kept if x is not None),
        }

    def failed(self, sample_id: int, worker: int) -> bool:
        ok = self.dispatcher.requeue(sample_id, worker, "failed_generation")
        self.rejected["failed_generation" if ok else "unknown_failure"] += 1
        return ok

    def refuse(self, sample_id: int, worker: int, why: str) -> None:
        """A result that cannot be what the run asked for: counted, and its request goes
        back to the queue (it is still owed)."""
        self.rejected[f"invalid:{why}"] += 1
        self.dispatcher.requeue(sample_id, worker, f"invalid:{why}")

    def ledger_problems(self) -> list[str]:
        """The request-side identities; an empty list when they hold. Every request handed
        out is delivered, outstanding or requeued, and every delivery is in the ledger."""
        d = self.dispatcher
        handed, finished = d.transitions["pending->running"], d.transitions["running->finished"]
        requeued, outstanding = d.transitions["running->pending"], len(d.outstanding)
        out = []
        if handed != finished + requeued + outstanding:
            out.append(
                f"dispatched {handed} != delivered {finished} + requeued {requeued} "
                f"+ outstanding {outstanding}"
            )
        if finished != len(self.delivered_ids):
            out.append(f"delivered {finished} != {len(self.delivered_ids)} sample ids taken in")
        return out

    def worker_gone(self, worker: int) -> int:
        return len(self.dispatcher.requeue_worker(worker))

    def await_hand_over(self, worker: int, until: float) -> None:
        """``worker`` left the rollout pool: its requests stay out there until it hands
        them over or ``until`` passes (runtime/control/hand_over.py)."""
        self.dispatcher.await_hand_over(worker, until)

    def handing_over(self, worker: int) -> bool:
        return worker in self.dispatcher.handing_over

    def hand_over(self, worker: int, rollouts: dict[int, ParkedRollout]) -> None:
        """The requests ``worker`` held when it left back to the queue, those in
        ``rollouts`` carrying what it had generated of them."""
        self.dispatcher.hand_over(worker, rollouts)

    def hand_overs_due(self, now: float) -> list[int]:
        """Workers whose hand-over is overdue: their requests back from the prompts."""
        return self.dispatcher.hand_overs_due(now)

    # --- trainer side ------------------------------------------------------------------

    def next_batch(self) -> Batch | None:
        """A batch for the trainer, or None (the wait counts as trainer idle time)."""
        batch = self.buffer.sample_batch(self.policy_version, self._last_chance())
        now = self.clock()
        if batch is None:
            if self._waiting_since is None:
                self._waiting_since = now
            return None
        if self._waiting_since is not None:
            self.trainer_idle_s += now - self._waiting_since
            self._waiting_since = None
        return batch

    def _last_chance(self) -> int | None:
        """The newest version the next batch is the last to take (its step is the last
        ``TrainConfig.last_step_for`` that version): groups of it close without their
        stragglers (None: the buffer closes none)."""
        if self.buffer.max_stragglers <= 0:
            return None
        step = self.step + len(self.batches) + 1
        return self.train.version_at(step) - self.delta - 1

    @property
    def batches(self) -> Mapping[int, Batch]:
        """The batches in training by id: the buffer's, which keeps their samples consumed
        until :meth:`finish_step` (one owner; read-only here)."""
        return MappingProxyType(self.buffer.in_batch)

    @property
    def batch_in_flight(self) -> int | None:
        """The batch being trained: made by :meth:`next_batch`, ended by :meth:`finish_step`
        (the trainer takes one batch at a time)."""
        assert len(self.batches) <= 1, f"batches {sorted(self.batches)} in training at once"
        return next(iter(self.batches), None)

    def finish_step(self, batch_id: int, step: int, new_version: int) -> Batch:
        """Step ``step`` trained batch ``batch_id``; its weights are version ``new_version``
        (one more than before at a sync point)."""
        batch = self.buffer.in_batch[batch_id]
        self.buffer.complete_batch(batch_id)
        self.step = max(self.step, step)
        self.policy_version = max(self.policy_version, new_version)
        self.buffer.evict_stale(self.policy_version)
        return batch

    # --- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self.batches:
            raise ValueError("a batch is in training: checkpoint at a step boundary")
        return {
            "policy_version": self.policy_version,
            "step": self.step,
            "buffer": self.buffer.state_dict(),
            "dispatcher": self.dispatcher.state_dict(),
            "rejected": dict(self.rejected),
            "delivered_ids": sorted(self.delivered_ids),
            "delivered_by_worker": {str(k): v for k, v in self.delivered_by_worker.items()},
            "trainer_idle_s": self.trainer_idle_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy_version = int(state["policy_version"])
        self.step = int(state["step"])
        self.buffer.load_state_dict(state["buffer"])
        self.dispatcher.load_state_dict(state["dispatcher"])
        self.rejected = Counter(state["rejected"])
        self.delivered_ids = dict.fromkeys(state["delivered_ids"], -1)
        self.delivered_by_worker = Counter(
            {int(k): v for k, v in state["delivered_by_worker"].items()}
        )
        self.trainer_idle_s = float(state["trainer_idle_s"])
        self._waiting_since = None

    def digest(self) -> dict[str, Any]:
        """Sample ids and checksums of everything the buffer holds, the queue, and the
        prompts drawn: what a resume must find again."""
        held = sorted(self.buffer.samples(), key=lambda t: t.sample_id)
        return {
            "samples": {str(t.sample_id): sample_digest(t) for t in held},
            "pending": [r.sample_id for r in self.dispatcher.pending],
            "prompts_drawn": self.dispatcher.prompts_drawn,
        }

    # --- reporting ---------------------------------------------------------------------

    def ledger(self) -> dict[str, int]:
        b = self.buffer
        d = self.dispatcher
        held = sum(1 for _ in b.samples())
        evicted = sum(b.evicted.values())
        retired = b.transitions["consumed->retired"]
        return {
            "dispatched": d.transitions["pending->running"] - d.transitions["running->pending"],
            "delivered": len(self.delivered_ids),
            "outstanding": len(d.outstanding),
            "held_in_buffer": held,
            "evicted": evicted,
            "retired": retired,
            "consumed": sum(v for k, v in b.transitions.items() if k.endswith("->consumed")),
            "replayed": b.transitions["consumed->replayed"],
            "lost": len(self.delivered_ids) - held - evicted - retired,
            "duplicated": self.rejected["duplicate"],
        }

    def waste(self) -> dict[str, Any]:
        """Tokens generated and evicted before any use, by reason, and their length bias."""
        return {
            "wasted_tokens": dict(self.buffer.evicted_tokens),
            "length_bias": self.buffer.length_bias(),
        }

    def partial_rollouts(self) -> dict[str, Any]:
        """Generations paused across a weight sync and resumed, and those in flight at a
        stop kept in its checkpoint and continued after the resume."""
        return {
            "held_across_sync": self.dispatcher.transitions["running->held"],
            "parked_rollouts": dict(self.dispatcher.parked),
        }

    @property
    def n_outstanding(self) -> int:
        return len(self.dispatcher.outstanding)

    def n_blocked(self, cause: str) -> int:
        """Work requests stopped short for ``cause`` so far (runtime/control/dispatcher.py)."""
        return self.dispatcher.blocked[cause]

    def groups_settled(self) -> tuple[int, int]:
        """Samples whose group is complete so far: (available to batches, evicted at once,
        as a group the sampler rejects): the simulator asks for a batch when these move."""
        t = self.buffer.transitions
        return t["finished->available"], t["finished->evicted"]

    def stats(self) -> dict[str, Any]:
        s = self.buffer.stats()
        s.update(self.dispatcher.stats())
        s["policy_version"] = self.policy_version
        s["trainer_idle_s"] = round(self.trainer_idle_s, 3)
        s["rejected"] = dict(self.rejected)
        s["delivered_by_rank"] = {str(k): v for k, v in sorted(self.delivered_by_worker.items())}
        return s
