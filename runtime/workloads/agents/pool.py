"""Rewards and tool calls in a pool of processes, off the rollout engine's event loop.

A reward that raises, hangs past ``timeout_s`` or kills its process becomes a recorded
failure ``(None, reason)``; the pool is replaced when one of its processes is lost or
stuck, so the next call has a working pool and the rollout worker never dies with it.
Processes are spawned, not forked: the rollout rank is multi-threaded (engine, sockets).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

log = logging.getLogger(__name__)


class RewardPool:
    def __init__(self, workers: int, timeout_s: float) -> None:
        self.workers, self.timeout_s = workers, timeout_s
        self.failures: dict[str, int] = {}
        self._pool = self._new()

    def _new(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"))

    async def call(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        loop = asyncio.get_running_loop()
        pool = self._pool
        try:
            fut = loop.run_in_executor(pool, fn, *args)
            return await asyncio.wait_for(fut, self.timeout_s), None
        except asyncio.TimeoutError:
            self._replace(pool, "timeout")
            return None, f"timed out after {self.timeout_s:g} s"
        except BrokenProcessPool:
            self._replace(pool, "process_died")
            return None, "its process died"
        except Exception as exc:  # the reward's own error, raised in the pool
            self.failures["error"] = self.failures.get("error", 0) + 1
            return None, f"{type(exc).__name__}: {exc}"[:300]

    def _replace(self, pool: ProcessPoolExecutor, why: str) -> None:
        self.failures[why] = self.failures.get(why, 0) + 1
        if pool is not self._pool:
            return  # another call replaced it already
        log.warning("reward pool: a call failed (%s); starting a fresh pool", why)
        self._pool = self._new()
        _kill(pool)

    def close(self) -> None:
        _kill(self._pool)


def _kill(pool: ProcessPoolExecutor) -> None:
    # A stuck task cannot be cancelled; its process is killed. ``_processes`` is the
    # executor's own table of its workers (CPython keeps it on every version we support).
    for proc in list(getattr(pool, "_processes", {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
