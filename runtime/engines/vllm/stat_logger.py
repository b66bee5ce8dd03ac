"""The rollout engine's load, as the generation scheduler needs it.

:class:`EngineStats` holds the latest numbers; :func:`vllm_stat_logger` makes a vLLM
``StatLoggerBase`` that fills it once per engine step (in the front-end process, the
rank's own): KV-cache utilisation, running and waiting requests, preemptions so far,
generated tokens so far, and the KV capacity in tokens. The rank's heartbeat carries
:meth:`EngineStats.snapshot` to rank 0.
"""

from __future__ import annotations

import threading
from typing import Any

FIELDS = ("kv_util", "kv_peak", "running", "waiting", "preemptions", "generated", "kv_tokens")


class EngineStats:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values = dict.fromkeys(FIELDS, 0.0)

    def update(self, **values: float) -> None:
        with self._lock:
            self._values.update({k: float(v) for k, v in values.items() if k in FIELDS})
            if "kv_util" in values:  # the highest utilisation between two snapshots
                self._values["kv_peak"] = max(self._values["kv_peak"], float(values["kv_util"]))

    def add(self, **values: float) -> None:
        with self._lock:
            for k, v in values.items():
                self._values[k] += float(v)

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out = dict(self._values)
            self._values["kv_peak"] = self._values["kv_util"]
            return out


def vllm_stat_logger(stats: EngineStats) -> Any:
    """A factory vLLM calls as ``factory(vllm_config, engine_index)``."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.cache = vllm_config.cache_config

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            if scheduler_stats is not None:
                stats.update(
                    kv_util=scheduler_stats.kv_cache_usage,
                    running=scheduler_stats.num_running_reqs,
                    waiting=scheduler_stats.num_waiting_reqs,
                )
            if iteration_stats is not None:
                stats.add(
                    preemptions=iteration_stats.num_preempted_reqs,
                    generated=iteration_stats.num_generation_tokens,
                )

        def log_engine_initialized(self) -> None:
            blocks = getattr(self.cache, "num_gpu_blocks", None) or 0
            stats.update(kv_tokens=blocks * (self.cache.block_size or 0))

    return _Logger
