"""A rollout engine model: continuous batching over a KV cache of fixed size.

Each step decodes one token for every running request and takes
``step_base_s + step_per_seq_s * running`` seconds (a batching curve: more requests, more
tokens per second, with diminishing returns), plus ``prefill_per_token_s`` for every
prompt token a newly admitted request brings that is not cached already (a running
sibling holds it). A request holds its prompt's KV (shared with
running siblings of the same group: prefix caching) plus its generated tokens. When the
cache overflows the newest request is preempted: it loses its generated tokens, is put
back at the front of the waiting queue and is recomputed later (vLLM's recompute
preemption). Waiting requests are admitted while their prompt fits.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass
class SimRequest:
    rid: int
    group: int
    prompt: int
    length: int  # response tokens it will generate
    generated: int = 0


class SimEngine:
    def __init__(
        self,
        kv_tokens: int,
        step_base_s: float = 0.02,
        step_per_seq_s: float = 0.0005,
        prefill_per_token_s: float = 0.00005,
        max_batch: int = 256,
    ) -> None:
        self.kv_tokens, self.step_base_s = kv_tokens, step_base_s
        self.step_per_seq_s, self.max_batch = step_per_seq_s, max_batch
        self.prefill_per_token_s = prefill_per_token_s
        self.running: list[SimRequest] = []
        self.waiting: deque[SimRequest] = deque()
        self.preemptions = 0
        self.generated = 0  # tokens decoded, including ones later lost to preemption

    def kv_used(self, extra: SimRequest | None = None) -> int:
        reqs = self.running + ([extra] if extra else [])
        groups = {r.group for r in reqs}
        prompts = sum(max((r.prompt for r in reqs if r.group == g), default=0) for g in groups)
        return prompts + sum(r.generated for r in reqs)

    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def step(self) -> tuple[float, list[SimRequest]]:
        """One decode step: (its duration, the requests that finished)."""
        prefill = 0
        while self.waiting and len(self.running) < self.max_batch:
            nxt = self.waiting[0]
            if self.kv_used(nxt) + 1 > self.kv_tokens and self.running:
                break
            if all(r.group != nxt.group for r in self.running):
                prefill += nxt.prompt  # not in the prefix cache
            self.running.append(self.waiting.popleft())
        if not self.running:
            return 0.0, []
        dt = self.step_base_s + self.step_per_seq_s * len(self.running)
        dt += self.prefill_per_token_s * prefill
        for r in self.running:
            r.generated += 1
        self.generated += len(self.running)
        while self.kv_used() > self.kv_tokens and len(self.running) > 1:
            victim = self.running.pop()  # the newest
            victim.generated = 0
            self.waiting.appendleft(victim)
            self.preemptions += 1
        done = [r for r in self.running if r.generated >= r.length]
        self.running = [r for r in self.running if r.generated < r.length]
        return dt, done
