"""Sample-level request dispatch with a bound on work in flight and staleness-aware admission.

Prompts become ``group_size`` requests each (one GRPO group) in a FIFO pending queue.
Rollout workers ask for work; a request is handed out only if

- fewer than ``B_max`` samples are outstanding (running or held) at rollout workers, and
- its sample can still be consumed before it is too old: with ``ahead`` samples in front
  of it (unused in the buffer, waiting for their group, outstanding), the trainer taking
  ``b`` of them per step and ``horizon`` steps left whose batches may still take a sample
  of the current version (``TrainConfig.last_step_for`` minus the steps done and the
  batch in training), admission
  needs ``ahead + 1 <= b * horizon`` (StaleFlow-style consistency; otherwise the work
  would be generated only to be evicted).

The rate is the trainer's demand, ``b``, not the fresh samples it was seen to take: in
``reflow`` mode a batch takes fewer fresh samples exactly when fewer arrive (replay fills
the rest), and a bound on that observed rate held rollout back further each time it fell
behind (the cluster simulator showed rollout idle at 73% against async's 40%, APPS agent,
64 GPUs). Outside ``reflow`` every batch is all fresh and both rates are ``b``.

Pure logic: the coordinator passes in the current buffer occupancy, version and horizon.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any

from runtime.data.sample import (
    ParkedRollout,
    Request,
    Sample,
    request_from_state,
    request_state,
    token_versions,
)


@dataclass
class HandOver:
    """A hand-over rank 0 awaits from a worker that left the rollout pool."""

    until: float  # when rank 0 stops waiting: the requests go back from their prompts
    sample_ids: set[int]  # the requests the worker held when it left


class Dispatcher:
    def __init__(
        self,
        *,
        prompts: Iterator[dict[str, Any]],
        group_size: int,
        B_max: int,
        delta: int,
        batch_size: int,
        clock: Callable[[], float],
        closed_groups: Callable[[], AbstractSet[int]] = frozenset,
    ) -> None:
        """``closed_groups``: the groups that trained without their stragglers now (the
        buffer owns them): a request of one still queued is dropped, not handed out."""
        self._prompts = prompts
        self.group_size = group_size
        self.B_max = B_max
        self.delta = delta
        self.clock = clock
        self.pending: deque[Request] = deque()
        self.outstanding: dict[int, tuple[Request, int]] = {}  # sample_id -> (request, worker)
        self._at_worker: Counter[int] = Counter()  # outstanding per worker, kept in step
        self.batch_size = batch_size
        self._next_sample = 0
        self._next_group = 0
        self._next_prompt = 0
        self.transitions: Counter[str] = Counter()
        self.blocked: Counter[str] = Counter()  # why requests were not handed out
        self.requeue_reasons: Counter[str] = Counter()  # why requests came back
        # Parked rollouts kept at a stop (requests, tokens, refused) and what became of
        # their tokens after the resume: continued (the sample starts with them),
        # regenerated (it does not) or dropped with a straggler whose group closed.
        self.parked: Counter[str] = Counter()
        self.exhausted = False
        self.last_block: str | None = None  # why the last take stopped short, if it did
        self._started_groups: set[int] = set()
        # sample_id -> the workers its request was taken back from. Such a worker may still
        # report it late (its outbox was on the wire), also after the request's new owner
        # delivered: that is a stale result, not a duplicate. Not checkpointed: a worker
        # of the saved run cannot report to the resumed one.
        self.taken_back_from: dict[int, set[int]] = {}
        # worker -> the hand-over rank 0 awaits from it: it left the rollout pool with
        # these requests out, which stay outstanding there until it reports what it had
        # generated of each (a finished sample, a parked rollout, or nothing).
        self.handing_over: dict[int, HandOver] = {}
        self._closed_groups = closed_groups

    def _refill(self) -> bool:
        try:
            prompt = next(self._prompts)
        except StopIteration:
            self.exhausted = True
            return False
        gid, pid = self._next_group, self._next_prompt
        self._next_group += 1
        self._next_prompt += 1
        for _ in range(self.group_size):
            self.pending.append(Request(self._next_sample, gid, pid, prompt))
            self._next_sample += 1
        return True

    @property
    def prompts_drawn(self) -> int:
        """Prompts taken from the dataset so far (each one group of requests)."""
        return self._next_prompt

    def open_group_remainder(self) -> int:
        """Pending requests at the head of the queue whose group is already partly out.

        A group becomes available only when all its members are in, so a barrier that
        holds these back can wait forever on a group it let start."""
        n = 0
        for req in self.pending:
            if req.group_id not in self._started_groups:
                break
            n += 1
        return n

    def _rest_of_a_started_group(self) -> bool:
        """The head of the queue belongs to a group some of whose members went out (a
        group's members are queued together; a requeued request goes back to the front,
        so a whole group requeued is at the head in full and is not a started one)."""
        if not self.pending or self.pending[0].group_id not in self._started_groups:
            return False
        group, n = self.pending[0].group_id, 0
        for req in self.pending:
            if req.group_id != group or n >= self.group_size:
                break
            n += 1
        return n < self.group_size

    def admissible(self, ahead: int, horizon: int) -> bool:
        """Whether a sample with ``ahead`` in front of it is consumed within ``horizon``
        steps at ``b`` samples per step."""
        return ahead + 1 <= self.batch_size * horizon

    def take(
        self,
        worker: int,
        slots: int,
        *,
        buffered: int,
        version: int,
        horizon: int,
        admit: Callable[[Request], bool] | None = None,
    ) -> list[Request]:
        """Up to ``slots`` requests for ``worker``; ``buffered`` = unused + waiting samples;
        ``horizon`` = steps left that may take a sample of ``version`` (module doc);
        ``admit`` (the generation scheduler's token budget) may stop the hand-out at the
        first request that does not fit (it stays first in the queue). Why it stopped, if
        it did, is in ``last_block``."""
        self.last_block = None
        out: list[Request] = []
        while len(out) < slots:
            why = None
            if len(self.outstanding) >= self.B_max:
                why = "B_max"
            elif (
                not self.admissible(buffered + len(self.outstanding), horizon)
                and not self._rest_of_a_started_group()
            ):
                # (the rest of a started group goes out regardless: a group feeds a batch
                # only once all its members are in, and what staleness counts ahead
                # includes its first members, so holding its rest back could leave no
                # batch ever formed; staleness is exceeded by group_size - 1 at most)
                why = "staleness"
            elif not self._drop_closed() and not self._refill():
                why = "no_prompts"
            elif admit is not None and not admit(self.pending[0]):
                why = "token_budget"
            if why is not None:
                self.blocked[why] += 1
                self.last_block = why
                break
            req = self.pending.popleft()
            req = Request(
                req.sample_id,
                req.group_id,
                req.prompt_id,
                req.prompt,
                self.clock(),
                version,
                req.resume,
            )
            self.outstanding[req.sample_id] = (req, worker)
            self._at_worker[worker] += 1
            self._started_groups.add(req.group_id)
            self.transitions["pending->running"] += 1
            out.append(req)
        return out

    def _drop_closed(self) -> bool:
        """Drop the queue's head while it belongs to a closed group; whether a request is
        left at the head."""
        closed = self._closed_groups()
        while self.pending and self.pending[0].group_id in closed:
            dropped = self.pending.popleft()
            self.transitions["pending->dropped"] += 1
            if dropped.resume is not None:
                # a parked rollout of a group that trained without it: its tokens are
                # neither continued nor generated again, and the counts must say so
                self.parked["dropped_straggler"] += 1
                self.parked["dropped_straggler_tokens"] += len(dropped.resume)
        return bool(self.pending)

    def finished(self, sample_id: int, worker: int) -> Request | None:
        """A trajectory came back from ``worker``; None if it was not outstanding there
        (a duplicate, an unknown id, or a late result from a worker that lost the request
        in a role switch and whose request was requeued: it is someone else's now)."""
        entry = self.outstanding.get(sample_id)
        if entry is None or entry[1] != worker:
            return None
        del self.outstanding[sample_id]
        self._at_worker[worker] -= 1
        self.transitions["running->finished"] += 1
        return entry[0]

    def was_taken_back_from(self, sample_id: int, worker: int) -> bool:
        """Whether ``worker`` once held the request for ``sample_id`` and lost it to a
        requeue (a role switch, its loss, a failure or a refusal)."""
        return worker in self.taken_back_from.get(sample_id, ())

    def reinstate(self, req: Request, worker: int) -> None:
        """Undo :meth:`finished` (the result turned out not to match the request)."""
        self.outstanding[req.sample_id] = (req, worker)
        self._at_worker[worker] += 1
        self.transitions["running->finished"] -= 1

    def running_at(self, worker: int) -> int:
        """Requests outstanding at ``worker`` (O(1): the dispatcher's hot path)."""
        return self._at_worker[worker]

    def requeue_worker(self, worker: int, reason: str = "worker_left") -> list[Request]:
        """A worker is gone or left the rollout pool: its requests go back to the front."""
        self.handing_over.pop(worker, None)
        back = [req for req, w in self.outstanding.values() if w == worker]
        self._at_worker.pop(worker, None)
        for req in reversed(back):
            del self.outstanding[req.sample_id]
            self.taken_back_from.setdefault(req.sample_id, set()).add(worker)
            self.pending.appendleft(req)
            self.transitions["running->pending"] += 1
        self.requeue_reasons[reason] += len(back)
        return back

    def requeue(self, sample_id: int, worker: int, reason: str) -> bool:
        """One request came back from ``worker`` (failed, refused, never delivered): back
        to the front of the queue."""
        entry = self.outstanding.get(sample_id)
        if entry is None or entry[1] != worker:
            return False
        del self.outstanding[sample_id]
        self._at_worker[worker] -= 1
        self.taken_back_from.setdefault(sample_id, set()).add(worker)
        r = entry[0]
        if r.resume is not None and reason.startswith("invalid:"):
            # A sample refused after continuing a parked rollout may be refused for it (a
            # recipe changed on resume): from the prompt, or it comes back forever.
            r = replace(r, resume=None)
            self.parked["dropped_after_refusal"] += 1
        self.pending.appendleft(r)
        self.transitions["running->pending"] += 1
        self.requeue_reasons[reason] += 1
        return True

    def keep_parked(self, sample_id: int, worker: int, rollout: ParkedRollout) -> bool:
        """What ``worker`` had generated of a request when the run stopped: the request
        stays outstanding there and a checkpoint saves it with its parked rollout, which
        the resumed run continues. False if the request is not outstanding at ``worker``."""
        entry = self.outstanding.get(sample_id)
        if entry is None or entry[1] != worker:
            return False
        self.outstanding[sample_id] = (replace(entry[0], resume=rollout), worker)
        self.parked["kept"] += 1
        self.parked["kept_tokens"] += len(rollout)
        return True

    def await_hand_over(self, worker: int, until: float) -> None:
        """``worker`` left the rollout pool: the requests it holds now stay outstanding
        there until it hands them over (:meth:`hand_over`) or ``until`` passes
        (:meth:`hand_overs_due`). Only these: a worker that plays rollout again before it
        reports is handed new requests, which its old report does not settle."""
        held = {sid for sid, (_, w) in self.outstanding.items() if w == worker}
        before = self.handing_over.get(worker)
        if before is not None:  # (left, came back, left again: one report for both)
            held |= before.sample_ids
        self.handing_over[worker] = HandOver(until, held)

    def hand_over(self, worker: int, rollouts: dict[int, ParkedRollout]) -> None:
        """What ``worker`` had generated when it left the rollout pool: each request it
        held then goes back to the front of the queue, those in ``rollouts`` carrying
        their parked rollout, which the next rank continues; the rest from their prompts."""
        for sid, rollout in rollouts.items():
            entry = self.outstanding.get(sid)
            if entry is None or entry[1] != worker:
                continue
            self.outstanding[sid] = (replace(entry[0], resume=rollout), worker)
            self.parked["handed_on"] += 1
            self.parked["handed_on_tokens"] += len(rollout)
        self._settle(worker, "left_rollout")

    def hand_overs_due(self, now: float) -> list[int]:
        """Workers whose hand-over did not come in time: the requests they held when they
        left go back from their prompts (nothing is lost; their work is generated again)."""
        due = [w for w, h in self.handing_over.items() if h.until <= now]
        for worker in due:
            self._settle(worker, "hand_over_timeout")
        return due

    def _settle(self, worker: int, reason: str) -> None:
        """The requests ``worker`` held when it left the rollout pool, back to the front of
        the queue in their order (those it delivered since are no longer out there)."""
        held = self.handing_over.pop(worker).sample_ids
        back = [sid for sid, (_, w) in self.outstanding.items() if w == worker and sid in held]
        for sid in reversed(back):
            self.requeue(sid, worker, reason)

    def resumed(self, request: Request, sample: Sample) -> None:
        """A sample of a request that carried a parked rollout: how many of its tokens
        it starts with, each under the policy version it was generated by before the stop
        (continued), and how many it does not (generated again)."""
        prefix = request.resume
        if prefix is None:
            return
        k = len(prefix)
        before = token_versions(prefix.versions, k)
        after = token_versions(sample.versions, min(k, len(sample.token_ids)))
        same = 0
        for a, b, va, vb in zip(prefix.token_ids, sample.token_ids, before, after, strict=False):
            if a != b or va != vb:
                break
            same += 1
        self.parked["continued_tokens"] += same
        self.parked["regenerated_tokens"] += k - same

    def overdue(self, cutoff: float) -> list[tuple[int, int]]:
        """(sample_id, worker) of the requests handed out before ``cutoff``. ``outstanding``
        is in hand-out order (a dict keeps insertion order, and a requeued request is
        re-inserted when handed out again), so the scan stops at the first one in time: the
        simulator calls this every simulated second with thousands out."""
        out = []
        for sid, (req, w) in self.outstanding.items():
            if req.dispatched_at >= cutoff:
                break
            out.append((sid, w))
        return out

    # --- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The queue and the data cursor. Requests out at rollout workers are saved as
        pending (at the front, in dispatch order): after a restart nobody generates them."""
        out = sorted(self.outstanding.values(), key=lambda x: x[0].sample_id)
        return {
            "pending": [request_state(r) for r, _ in out]
            + [request_state(r) for r in self.pending],
            "requeued_on_save": len(out),
            "next_sample": self._next_sample,
            "next_group": self._next_group,
            "prompts_drawn": self._next_prompt,
            "transitions": dict(self.transitions),
            "blocked": dict(self.blocked),
            "started_groups": sorted(self._started_groups),
            "requeue_reasons": dict(self.requeue_reasons),
            "parked": dict(self.parked),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore; the prompt stream (a fresh one, same seed) is advanced past the prompts
        the saved run had already drawn, so the next prompt is the one it would have got."""
        drawn = int(state["prompts_drawn"])
        for _ in range(drawn):
            try:
                next(self._prompts)
            except StopIteration:
                self.exhausted = True
                break
        self.pending = deque(request_from_state(d) for d in state["pending"])
        self.outstanding = {}
        self._at_worker = Counter()
        self._next_sample = int(state["next_sample"])
        self._next_group = int(state["next_group"])
        self._next_prompt = drawn
        self.transitions = Counter(state["transitions"])
        self.transitions["running->pending"] += int(state["requeued_on_save"])
        self.requeue_reasons = Counter(state.get("requeue_reasons", {}))
        self.requeue_reasons["out_at_checkpoint"] += int(state["requeued_on_save"])
        # Checkpoints written before the rename to "parked" keep these counts under
        # "partials": read it too, so they still resume and the counts carry on.
        self.parked = Counter(state.get("parked", state.get("partials", {})))
        self.blocked = Counter(state["blocked"])
        self._started_groups = set(state["started_groups"])

    def stats(self) -> dict:
        return {
            "pending": len(self.pending),
            "running": len(self.outstanding),
            "dispatched": self.transitions["pending->running"],
            "delivered": self.transitions["running->finished"],
            "requeued": self.transitions["running->pending"],
            "held_across_sync": self.transitions["running->held"],
            # queued members of groups that trained without them (never generated)
            "dropped_stragglers": self.transitions["pending->dropped"],
            "blocked": dict(self.blocked),
            "requeued_by_reason": dict(self.requeue_reasons),
            "parked_rollouts": dict(self.parked),
        }
