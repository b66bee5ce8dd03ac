"""The generation scheduler as rank 0 runs it: per rollout rank an AIMD cap
(:class:`ConcurrencyController`, updated from the engine stats in heartbeats every
``interval_s``) and token-budget admission (:class:`TokenRouter`), applied when a rank
asks for work. Work is pulled, so routing reduces to admission at the asking rank; GRPO
siblings are consecutive in the queue and go out together, which keeps them on one
engine's prefix cache unless its budget is full (then they spill to the next rank that
asks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.control.scheduling.concurrency import (
    AimdSettings,
    ConcurrencyController,
    WorkerSignals,
)
from runtime.control.scheduling.router import TokenRouter


class GenerationScheduler:
    def __init__(
        self,
        clock: Callable[[], float],
        aimd: AimdSettings,
        *,
        interval_s: float = 2.0,
        adaptive_caps: bool = True,
        token_admission: bool = True,
    ) -> None:
        self.clock, self.aimd, self.interval_s = clock, aimd, interval_s
        self.adaptive_caps, self.token_admission = adaptive_caps, token_admission
        self.caps: dict[int, ConcurrencyController] = {}
        self.router = TokenRouter()
        self._updated: dict[int, float] = {}
        self.history: list[dict[str, Any]] = []  # cap changes, for status and metrics

    def cap(self, rank: int) -> int:
        c = self.caps.get(rank)
        return self.aimd.max_cap if c is None or not self.adaptive_caps else c.limit

    def observe(self, rank: int, stats: dict[str, float]) -> None:
        """Engine stats from a rollout rank's heartbeat."""
        if not stats:
            return
        now = self.clock()
        c = self.caps.setdefault(rank, ConcurrencyController(self.aimd))
        budget = int(stats.get("kv_tokens", 0))
        if budget > 0 and rank not in self.router.workers and self.token_admission:
            self.router.add_worker(rank, budget=budget, cap=c.limit)
        if now - self._updated.get(rank, -1e18) < self.interval_s:
            return
        self._updated[rank] = now
        before = c.limit
        sig = WorkerSignals(
            kv_util=stats.get("kv_util", 0.0),
            waiting=int(stats.get("waiting", 0)),
            preemptions=int(stats.get("preemptions", 0)),
            active=int(stats.get("running", 0)),
            kv_peak=stats.get("kv_peak"),
        )
        after = c.update(sig) if self.adaptive_caps else before
        if rank in self.router.workers:
            self.router.observe(
                rank, util=sig.kv_util, queue=sig.waiting, pressure=c.preempt_growth, cap=after
            )
        if after != before:
            self.history.append(
                {
                    "t": round(now, 3),
                    "rank": rank,
                    "cap": after,
                    "action": c.last_action,
                    "kv_util": round(sig.kv_util, 3),
                    "preemptions": sig.preemptions,
                }
            )
            del self.history[:-50]

    def grant(self, rank: int, slots: int, outstanding: int) -> int:
        """How many of ``slots`` the rank may fill now (its cap minus what it runs)."""
        return max(0, min(slots, self.cap(rank) - outstanding))

    def admit(
        self, rank: int, sample_id: int, group: int, prompt_tokens: int, in_tools: int = 0
    ) -> bool:
        """Token-budget admission of one request at ``rank`` (booked if admitted);
        ``in_tools`` of the rank's requests wait on a tool call and hold no slot."""
        if rank not in self.router.workers:
            return True  # budget not known yet: the cap alone limits
        return self.router.admit(rank, sample_id, group, prompt_tokens, in_tools=in_tools)

    def finished(self, sample_id: int, response_tokens: int | None) -> None:
        self.router.finished(sample_id, response_tokens)

    def worker_left(self, rank: int) -> None:
        self.router.remove_worker(rank)
        self.caps.pop(rank, None)
        self._updated.pop(rank, None)

    def status(self) -> dict[str, Any]:
        return {
            "adaptive_caps": self.adaptive_caps,
            "caps": {str(r): self.cap(r) for r in sorted(self.caps)},
            "expected_response_tokens": round(self.router.expected_response.get("default", 0.0), 1),
            "recent_changes": self.history[-10:],
        }
