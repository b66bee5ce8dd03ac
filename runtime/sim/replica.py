"""A rollout replica as an event-driven model: continuous batching over a fixed KV cache.

Every running sequence gets one token per decode step, and a step with ``c`` sequences
takes ``step_base_s + step_per_seq_s * c`` seconds, so all running sequences advance at
the same rate: processor sharing. The replica keeps one *service counter* ``S`` (tokens
each running sequence has received since the counter started); a sequence admitted at
``S0`` needing ``n`` tokens finishes when ``S = S0 + n``. Finishing, admitting and
overflowing the KV cache are the only events, each O(log c), so a 128-GPU cluster's
hundreds of thousands of generations simulate in seconds (the per-token
``runtime/sim/engine_model.py`` is the small-scale reference).

KV cache: a running sequence holds its prompt plus what it generated. When the cache
overflows, the newest sequence is preempted: it loses its tokens and goes back to the front
of the queue (vLLM's recompute preemption). New sequences are admitted while their prompt
fits; prefill stalls decoding for ``prompt tokens / prefill_tok_s``. A weight sync stalls
it too (the requests are held and resume under the new weights: partial rollout).

Lengths are in *blocks* of ``block`` tokens (vLLM's KV block is 16 tokens) to keep the
token lists that travel to the coordinator short; rates are converted accordingly.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from runtime.sim.parameters import ModelProfile

_EPS = 1e-9


@dataclass
class _Seq:
    rid: int
    prompt: int  # blocks
    need: int  # blocks to generate in this turn
    start: float = 0.0  # service counter at admission
    order: int = 0  # admission order: the newest is preempted first


class RolloutReplica:
    def __init__(self, model: ModelProfile, *, block: int, max_seqs: int) -> None:
        self.model = model
        self.block = block
        self.max_seqs = max_seqs
        self.capacity = model.kv_tokens // block
        self.S = 0.0
        self.t = 0.0
        self.frozen_until = 0.0  # prefill or weight sync: no decoding before this
        self.running: dict[int, _Seq] = {}
        self._heap: list[tuple[float, int, int]] = []  # (finish S, order, rid), lazy
        self.waiting: deque[_Seq] = deque()
        self._sum_prompt = 0
        self._sum_start = 0.0
        self._order = 0
        self.preemptions = 0
        self.generated_blocks = 0.0
        self.busy_s = 0.0  # time with something running (decoding or stalled)
        self.sync_until = 0.0  # paused for a weight sync (requests held) before this
        self.paused_s = 0.0  # of busy_s, paused for weight syncs
        self.kv_peak = 0.0

    # --- state -------------------------------------------------------------------------

    def rate(self) -> float:
        """Blocks per second each running sequence receives."""
        c = len(self.running)
        if c == 0:
            return 0.0
        return 1.0 / ((self.model.step_base_s + self.model.step_per_seq_s * c) * self.block)

    def kv_used(self) -> float:
        return self._sum_prompt + len(self.running) * self.S - self._sum_start

    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    def stats(self) -> dict[str, float]:
        """What a real rollout rank's heartbeat carries (runtime/engines/vllm/stat_logger.py)."""
        util = self.kv_used() / self.capacity if self.capacity else 0.0
        peak, self.kv_peak = max(self.kv_peak, util), util
        return {
            "kv_util": util,
            "kv_peak": peak,
            "running": float(len(self.running)),
            "waiting": float(len(self.waiting)),
            "preemptions": float(self.preemptions),
            "generated": self.generated_blocks * self.block,
            "kv_tokens": float(self.capacity),  # in blocks: the sim's token unit
        }

    # --- time --------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        if now <= self.t:
            return
        if self.running:
            self.busy_s += now - self.t
            self.paused_s += max(0.0, min(now, self.sync_until) - self.t)
            start = max(self.t, self.frozen_until)
            if now > start:
                ds = (now - start) * self.rate()
                self.S += ds
                self.generated_blocks += ds * len(self.running)
        self.t = now
        if self.capacity:
            self.kv_peak = max(self.kv_peak, self.kv_used() / self.capacity)

    def stall(self, now: float, seconds: float) -> None:
        """A weight sync: what runs is held for ``seconds``, then resumes."""
        self.advance(now)
        self.frozen_until = max(self.frozen_until, now) + seconds
        self.sync_until = max(self.sync_until, now) + seconds

    def next_event(self) -> float:
        """When the next sequence finishes or the cache overflows (inf: nothing runs)."""
        self._drop_stale()
        if not self.running:
            return math.inf
        r = self.rate()
        start = max(self.t, self.frozen_until)
        finish_s = self._heap[0][0]
        c = len(self.running)
        over_s = (self.capacity - self._sum_prompt + self._sum_start) / c
        target = min(finish_s, over_s) if c > 1 else finish_s
        return start + max(target - self.S, 0.0) / r

    # --- work --------------------------------------------------------------------------

    def submit(self, rid: int, prompt_blocks: int, need_blocks: int) -> None:
        self.waiting.append(_Seq(rid, prompt_blocks, max(need_blocks, 1)))

    def drop(self, rid: int) -> None:
        seq = self.running.pop(rid, None)
        if seq is not None:
            self._sum_prompt -= seq.prompt
            self._sum_start -= seq.start
        else:
            self.waiting = deque(s for s in self.waiting if s.rid != rid)

    def on_event(self, now: float) -> list[int]:
        """Advance to ``now``: finished sequences out, overflow preempted, new admitted."""
        self.advance(now)
        done = []
        self._drop_stale()
        while self._heap and self._heap[0][0] <= self.S + _EPS * max(1.0, self.S):
            _, _, rid = heapq.heappop(self._heap)
            seq = self.running.pop(rid, None)
            if seq is None:
                continue
            self._sum_prompt -= seq.prompt
            self._sum_start -= seq.start
            done.append(rid)
            self._drop_stale()
        # full to the last block: the next decode step would overflow, so preempt now
        while len(self.running) > 1 and self.kv_used() > self.capacity - 1e-6:
            # running is filled in admission order (a re-admitted sequence goes back in
            # at the end), so its last entry is the newest: no scan of every sequence
            newest = next(reversed(self.running.values()))
            self.running.pop(newest.rid)
            self._sum_prompt -= newest.prompt
            self._sum_start -= newest.start
            self.waiting.appendleft(_Seq(newest.rid, newest.prompt, newest.need))
            self.preemptions += 1
        self.admit(now)
        return done

    def admit(self, now: float) -> None:
        prefill = 0
        while self.waiting and len(self.running) < self.max_seqs:
            nxt = self.waiting[0]
            if self.running and self.kv_used() + nxt.prompt + 1 > self.capacity:
                break
            self.waiting.popleft()
            self._order += 1
            nxt.start, nxt.order = self.S, self._order
            self.running[nxt.rid] = nxt
            self._sum_prompt += nxt.prompt
            self._sum_start += nxt.start
            heapq.heappush(self._heap, (nxt.start + nxt.need, nxt.order, nxt.rid))
            prefill += nxt.prompt
        if prefill:
            self.stall(now, prefill * self.block / self.model.prefill_tok_s)

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            _, order, rid = heap[0]
            seq = self.running.get(rid)
            if seq is not None and seq.order == order:
                return
            heapq.heappop(heap)
