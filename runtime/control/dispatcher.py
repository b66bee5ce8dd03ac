"""Sample-level request dispatch with a bound on work in flight and staleness-aware admission.

Prompts become ``group_size`` requests each (one GRPO group) in a FIFO pending queue.
Rollout workers ask for work; a request is handed out only if

- fewer than ``B_max`` samples are outstanding (running or held) at rollout workers, and
- its trajectory can still be consumed within ``delta`` policy versions: with ``ahead``
  samples in front of it (unused in the buffer, waiting for their group, outstanding) and
  a consumption of ``rate`` fresh samples per step, admission needs
  ``ahead + 1 <= rate * (delta + 1)`` (StaleFlow-style consistency; otherwise the work
  would be generated only to be evicted).

``rate`` is, by ``reflow.admission``: ``observed`` (default), an EWMA of the fresh samples
the trainer took per step; or ``capacity``, the batch size ``b``. ``observed`` keeps
samples fresher, but in ``reflow`` mode a batch takes fewer fresh samples exactly when
fewer arrive (replay fills the rest), so it also holds rollout back when it falls behind:
the cluster simulator showed rollout idle at 73% against async's 40% (APPS agent, 64 GPUs),
and ``capacity`` won more throughput there. On the CPU demo both reached the same held-out
reward (0.344 with ``capacity``, 0.348 with ``observed``, one run each); the default stays
the rule the demo was tuned with.

Pure logic: the coordinator passes in the current buffer occupancy and version.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterator
from typing import Any

from runtime.data.sample import Request, request_from_state, request_state


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
        admission: str = "observed",
    ) -> None:
        self._prompts = prompts
        self.group_size = group_size
        self.B_max = B_max
        self.delta = delta
        self.clock = clock
        self.pending: deque[Request] = deque()
        self.outstanding: dict[int, tuple[Request, int]] = {}  # sample_id -> (request, worker)
        self._at_worker: Counter[int] = Counter()  # outstanding per worker, kept in step
        self.batch_size = batch_size
        self.admission = admission
        self.fresh_per_step = float(batch_size)  # EWMA of unused samples consumed per step
        self._next_sample = 0
        self._next_group = 0
        self._next_prompt = 0
        self.transitions: Counter[str] = Counter()
        self.blocked: Counter[str] = Counter()  # why requests were not handed out
        self.requeue_reasons: Counter[str] = Counter()  # why requests came back
        self.exhausted = False
        self._started_groups: set[int] = set()

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

    def admissible(self, ahead: int) -> bool:
        rate = self.batch_size if self.admission == "capacity" else self.fresh_per_step
        return ahead + 1 <= rate * (self.delta + 1)

    def take(
        self,
        worker: int,
        slots: int,
        *,
        buffered: int,
        version: int,
        admit: Callable[[Request], bool] | None = None,
    ) -> list[Request]:
        """Up to ``slots`` requests for ``worker``; ``buffered`` = unused + waiting samples;
        ``admit`` (the generation scheduler's token budget) may stop the hand-out at the
        first request that does not fit (it stays first in the queue)."""
        out: list[Request] = []
        while len(out) < slots:
            if len(self.outstanding) >= self.B_max:
                self.blocked["B_max"] += 1
                break
            if not self.admissible(buffered + len(self.outstanding)):
                self.blocked["staleness"] += 1
                break
            if not self.pending and not self._refill():
                self.blocked["no_prompts"] += 1
                break
            if admit is not None and not admit(self.pending[0]):
                self.blocked["token_budget"] += 1
                break
            req = self.pending.popleft()
            req = Request(
                req.sample_id, req.group_id, req.prompt_id, req.prompt, self.clock(), version
            )
            self.outstanding[req.sample_id] = (req, worker)
            self._at_worker[worker] += 1
            self._started_groups.add(req.group_id)
            self.transitions["pending->running"] += 1
            out.append(req)
        return out

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
        back = [req for req, w in self.outstanding.values() if w == worker]
        self._at_worker.pop(worker, None)
        for req in reversed(back):
            del self.outstanding[req.sample_id]
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
        self.pending.appendleft(entry[0])
        self.transitions["running->pending"] += 1
        self.requeue_reasons[reason] += 1
        return True

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

    def observe_step(self, n_unused: int) -> None:
        self.fresh_per_step = 0.8 * self.fresh_per_step + 0.2 * max(n_unused, 1)

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
            "fresh_per_step": self.fresh_per_step,
            "transitions": dict(self.transitions),
            "blocked": dict(self.blocked),
            "started_groups": sorted(self._started_groups),
            "requeue_reasons": dict(self.requeue_reasons),
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
        self.fresh_per_step = float(state["fresh_per_step"])
        self.transitions = Counter(state["transitions"])
        self.transitions["running->pending"] += int(state["requeued_on_save"])
        self.requeue_reasons = Counter(state.get("requeue_reasons", {}))
        self.requeue_reasons["out_at_checkpoint"] += int(state["requeued_on_save"])
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
            "fresh_per_step": round(self.fresh_per_step, 2),
            "blocked": dict(self.blocked),
            "requeued_by_reason": dict(self.requeue_reasons),
        }
