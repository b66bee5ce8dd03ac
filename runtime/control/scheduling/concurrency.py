"""AIMD control of one rollout worker's concurrency cap (the slow loop, every few seconds).

Signals from the engine (KV-cache utilisation, waiting queue, preemptions so far, active
generations) are smoothed by EWMAs. Then, per update:

- multiplicative decrease (``cap *= beta``) when the smoothed preemption growth exceeds
  ``preempt_threshold`` per update (sustained preemption, not one blip) while the KV
  cache was near full (its peak utilisation since the last update reached the target
  band), or the utilisation is at ``hard_limit``: the engine is evicting work it already
  computed. Preemptions with an empty cache are not pressure: vLLM counts the requests
  it recomputes after a weight update (``pause_generation(clear_cache=True)``) as
  preempted, every sync step;
- additive increase (``cap += alpha``) while the smoothed utilisation is below the target
  band and there is demand (requests waiting, or the cap is in use): the KV cache has room;
- otherwise hold. The cap stays within ``[min_cap, max_cap]``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerSignals:
    kv_util: float  # KV-cache (token budget) utilisation, 0..1
    waiting: int  # requests queued in the engine
    preemptions: int  # cumulative count
    active: int  # generations running now
    throughput: float = 0.0  # generated tokens/s (reported, not used by the rule)
    kv_peak: float | None = None  # highest utilisation since the last update (None: kv_util)


@dataclass
class AimdSettings:
    min_cap: int = 1
    max_cap: int = 256
    initial_cap: int | None = None  # None: max_cap
    target_util: float = 0.8  # additive increase below target_util - band
    band: float = 0.1
    hard_limit: float = 0.98
    alpha: float = 2.0
    beta: float = 0.5
    preempt_threshold: float = 0.5  # smoothed preemptions per update
    smoothing: float = 0.5  # EWMA weight of the newest observation


class ConcurrencyController:
    def __init__(self, settings: AimdSettings | None = None) -> None:
        self.s = settings or AimdSettings()
        self.cap = float(self.s.initial_cap or self.s.max_cap)
        self.util: float | None = None
        self.preempt_growth = 0.0
        self._last_preemptions: int | None = None
        self.last_action = "hold"

    @property
    def limit(self) -> int:
        return max(self.s.min_cap, min(self.s.max_cap, int(self.cap)))

    def update(self, sig: WorkerSignals) -> int:
        a = self.s.smoothing
        self.util = sig.kv_util if self.util is None else a * sig.kv_util + (1 - a) * self.util
        grew = (
            0
            if self._last_preemptions is None
            else max(0, sig.preemptions - self._last_preemptions)
        )
        self._last_preemptions = sig.preemptions
        self.preempt_growth = a * grew + (1 - a) * self.preempt_growth
        demand = sig.waiting > 0 or sig.active >= self.limit
        peak = sig.kv_util if sig.kv_peak is None else max(sig.kv_peak, sig.kv_util)
        pressure = peak >= self.s.target_util - self.s.band
        if (self.preempt_growth > self.s.preempt_threshold and pressure) or (
            sig.kv_util >= self.s.hard_limit
        ):
            self.cap = max(self.s.min_cap, self.cap * self.s.beta)
            self.last_action = "decrease"
        elif self.util < self.s.target_util - self.s.band and demand:
            self.cap = min(self.s.max_cap, self.cap + self.s.alpha)
            self.last_action = "increase"
        else:
            self.last_action = "hold"
        return self.limit
