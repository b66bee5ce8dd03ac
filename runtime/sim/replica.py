"""A rollout replica as an event-driven model: continuous batching over a fixed KV cache.

Every running sequence gets one token per decode step. A step with ``c`` sequences holding
``K`` tokens of KV (prompts, earlier turns and what they generated) takes
``a + b * c + k * K`` seconds: ``a`` the weight read (``step_base_s``, plus the tensor-parallel
all-reduces' fixed part ``tp_step_s``), ``b`` per sequence (``step_per_seq_s`` +
``tp_per_seq_s``), ``k`` per token of context (``step_per_ctx_token_s``: the KV read), so
a sequence with a longer context costs more. All running sequences advance at the same
rate: processor sharing. The replica keeps one *service counter* ``S`` (tokens each running
sequence has received since the counter started); a sequence admitted at ``S0`` needing
``n`` tokens finishes when ``S = S0 + n``. Between two events ``c`` is fixed and ``K``
grows by ``c`` per token, so the step time is linear in ``S`` and the time to reach a
given ``S`` is a quadratic in it, solved exactly (no per-token loop). Finishing, admitting
and overflowing the KV cache are the only events, each O(log c), so a 128-GPU cluster's
hundreds of thousands of generations simulate in seconds (the per-token
``runtime/sim/engine_model.py`` is the small-scale reference).

KV cache: a running sequence holds its prompt plus what it generated. When the cache
overflows, the newest sequence is preempted: it loses its tokens and goes back to the front
of the queue (vLLM's recompute preemption). New sequences are admitted while their prompt
fits; prefill stalls decoding for ``uncached prompt tokens / prefill_tok_s`` (busy time:
the GPU computes, so it is not booked as a pause). A weight sync stalls it too (the requests
are held and resume under the new weights: partial rollout), and that is a pause.

Prefix caching (vLLM's default, ``prefix_cache=True`` for multi-turn workloads): a turn
that finishes frees its blocks into an LRU cache of free blocks, where they stay until
running sequences need the room. The next turn of the same episode on this replica then
prefills only what its cached prefix lacks (the tool output and anything evicted). Free
space is taken back oldest entry first, at the next event or admission (not at the exact
instant the running sequences grow into it), a tail at a time (vLLM frees a request's
blocks tail first, so what stays is a prefix). A preempted sequence pays its whole prompt
again: its blocks were freed because the cache was full, so they are the first reused.
First-turn prompts shared by the sibling samples of a group are not shared here.

Lengths are in *blocks* of ``block`` tokens (vLLM's KV block is 16 tokens) to keep the
token lists that travel to the coordinator short; rates are converted accordingly.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass

from runtime.sim.parameters import ModelProfile

_EPS = 1e-9


@dataclass
class _Seq:
    rid: int
    prompt: int  # blocks
    need: int  # blocks to generate in this turn
    fresh: bool = False  # a first turn or a re-queued preemption: nothing of it is cached
    start: float = 0.0  # service counter at admission
    order: int = 0  # admission order: the newest is preempted first


class RolloutReplica:
    def __init__(
        self, model: ModelProfile, *, block: int, max_seqs: int, prefix_cache: bool = False
    ) -> None:
        self.model = model
        self.block = block
        self.max_seqs = max_seqs
        self.capacity = model.kv_tokens // block
        # step = a + b * running + k * KV tokens of the running sequences
        self._a = model.step_base_s + model.tp_step_s
        self._b = model.step_per_seq_s + model.tp_per_seq_s
        self._k = model.step_per_ctx_token_s
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
        self.busy_s = 0.0  # time with something running (decoding, prefilling or paused)
        self.sync_until = 0.0  # paused for a weight sync (requests held) before this
        self.paused_s = 0.0  # of busy_s, paused for weight syncs
        self.prefill_s = 0.0  # of busy_s, prefilling (seconds of prefill work booked)
        self.prefilled_blocks = 0  # blocks prefilled (cache misses)
        self.cached_blocks = 0  # blocks a re-admitted turn found in the prefix cache
        self.kv_peak = 0.0
        self.prefix_cache = prefix_cache
        self._cached: OrderedDict[int, int] = OrderedDict()  # rid -> free cached blocks
        self._cached_total = 0

    # --- state -------------------------------------------------------------------------

    def step_s(self) -> float:
        """Seconds of one decode step now (all running sequences get a token)."""
        c = len(self.running)
        if c == 0:
            return 0.0
        return self._a + self._b * c + self._k * self.block * self.kv_used()

    def rate(self) -> float:
        """Blocks per second each running sequence receives now."""
        step = self.step_s()
        return 1.0 / (step * self.block) if step > 0 else 0.0

    def _time_for(self, ds: float) -> float:
        """Seconds for the service counter to advance ``ds`` blocks from now: the step time
        grows by ``k * block * c`` per block of service (every running sequence's KV grows),
        so the time is ``block * (step * ds + growth * ds^2 / 2)``."""
        growth = self._k * self.block * len(self.running)
        return self.block * ds * (self.step_s() + growth * ds / 2)

    def _service_in(self, dt: float) -> float:
        """Blocks of service in ``dt`` seconds from now (the inverse of ``_time_for``)."""
        step = self.step_s()
        growth = self._k * self.block * len(self.running)
        x = dt / self.block
        # the root of growth/2 ds^2 + step ds - x = 0, in the form that stays exact as
        # growth -> 0 (no context cost: ds = x / step)
        return 2 * x / (step + math.sqrt(step * step + 2 * growth * x))

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
            # cumulative seconds of prefill work (busy, not a pause: runtime/control/idle.py)
            "prefill_s": self.prefill_s,
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
                ds = self._service_in(now - start)
                self.S += ds
                self.generated_blocks += ds * len(self.running)
        self.t = now
        if self.capacity:
            self.kv_peak = max(self.kv_peak, self.kv_used() / self.capacity)

    def stall(self, now: float, seconds: float, *, sync: bool = True) -> None:
        """What runs is held for ``seconds``, then resumes: a weight sync (``sync``: a
        pause, generating nothing) or a prefill (busy: the GPU computes the prompts)."""
        self.advance(now)
        self.frozen_until = max(self.frozen_until, now) + seconds
        if sync:
            self.sync_until = max(self.sync_until, now) + seconds
        else:
            self.prefill_s += seconds

    def next_event(self) -> float:
        """When the next sequence finishes or the cache overflows (inf: nothing runs)."""
        self._drop_stale()
        if not self.running:
            return math.inf
        start = max(self.t, self.frozen_until)
        finish_s = self._heap[0][0]
        c = len(self.running)
        over_s = (self.capacity - self._sum_prompt + self._sum_start) / c
        target = min(finish_s, over_s) if c > 1 else finish_s
        return start + self._time_for(max(target - self.S, 0.0))

    # --- work --------------------------------------------------------------------------

    def submit(self, rid: int, prompt_blocks: int, need_blocks: int) -> None:
        """A turn to generate: ``prompt_blocks`` of context (the prompt, earlier turns and
        tool outputs; what the prefix cache still holds of it is not prefilled again)."""
        fresh = rid not in self._cached
        self.waiting.append(_Seq(rid, prompt_blocks, max(need_blocks, 1), fresh))

    def drop(self, rid: int) -> None:
        self._uncache(rid)
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
            if self.prefix_cache:  # freed into the LRU cache of free blocks
                blocks = seq.prompt + seq.need
                self._cached[rid] = blocks
                self._cached_total += blocks
            self._drop_stale()
        # full to the last block: the next decode step would overflow, so preempt now
        while len(self.running) > 1 and self.kv_used() > self.capacity - 1e-6:
            # running is filled in admission order (a re-admitted sequence goes back in
            # at the end), so its last entry is the newest: no scan of every sequence
            newest = next(reversed(self.running.values()))
            self.running.pop(newest.rid)
            self._sum_prompt -= newest.prompt
            self._sum_start -= newest.start
            self.waiting.appendleft(_Seq(newest.rid, newest.prompt, newest.need, True))
            self.preemptions += 1
        self._evict()
        self.admit(now)
        return done

    def admit(self, now: float) -> None:
        prefill = 0
        while self.waiting and len(self.running) < self.max_seqs:
            nxt = self.waiting[0]
            # cached free blocks do not count: vLLM evicts them for new allocations
            if self.running and self.kv_used() + nxt.prompt + 1 > self.capacity:
                break
            self.waiting.popleft()
            self._order += 1
            nxt.start, nxt.order = self.S, self._order
            self.running[nxt.rid] = nxt
            self._sum_prompt += nxt.prompt
            self._sum_start += nxt.start
            heapq.heappush(self._heap, (nxt.start + nxt.need, nxt.order, nxt.rid))
            hit = 0 if nxt.fresh else min(self._uncache(nxt.rid), nxt.prompt)
            self.cached_blocks += hit
            prefill += nxt.prompt - hit
            self._evict()  # its new blocks take the oldest free cached ones
        if prefill:
            self.prefilled_blocks += prefill
            self.stall(now, prefill * self.block / self.model.prefill_tok_s, sync=False)

    def _uncache(self, rid: int) -> int:
        """Take ``rid``'s blocks out of the prefix cache; how many there were."""
        blocks = self._cached.pop(rid, 0)
        self._cached_total -= blocks
        return blocks

    def _evict(self) -> None:
        """Free cached blocks the running sequences need back, least recently freed
        first, a tail at a time."""
        excess = self.kv_used() + self._cached_total - self.capacity
        while excess > 0 and self._cached:
            rid = next(iter(self._cached))
            blocks = self._cached[rid]
            take = min(blocks, math.ceil(excess))
            if take == blocks:
                del self._cached[rid]
            else:
                self._cached[rid] = blocks - take  # keeps its place: still the oldest
            self._cached_total -= take
            excess -= take

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap:
            _, order, rid = heap[0]
            seq = self.running.get(rid)
            if seq is not None and seq.order == order:
                return
            heapq.heappop(heap)
