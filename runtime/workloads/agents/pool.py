"""Rewards and tool calls in a pool of processes, off the rollout engine's event loop.

Two kinds of call. A reward runs on its process's main thread, one at a time per process:
rewards are CPU-bound, and the common ones time themselves with ``signal.alarm``, which
works on the main thread only (math_verify scores every answer 0 on another). A call that
waits on the sandbox (``on_thread=True``: a tool call, a grading) runs on one of
``ceil(concurrency / workers)`` threads of its process, so all of one rollout engine's
conversations (``scheduler.max_concurrency``) can be in the sandbox at once without a
process each. One call at a time per process queued a 128-conversation engine behind 2
gradings, the queue's wait counted against each call's timeout.

A reward that raises, hangs past ``timeout_s`` or kills its process becomes a recorded
failure ``(None, reason)``; the rollout worker never dies with it. A hung call cannot be
stopped: its process is retired at once when the call held its main thread, else once a
quarter of its threads hang; a retired process takes no new calls and is killed when its
last live call is answered. A process that dies fails only the calls it held, and is
replaced.
Processes are spawned, not forked: the rollout rank is multi-threaded (engine, sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import pickle
import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import count
from multiprocessing.connection import Connection
from typing import Any

log = logging.getLogger(__name__)

Answer = tuple[Any, str | None]  # (value, None) or (None, why it failed)


class RewardPool:
    def __init__(self, workers: int, timeout_s: float, concurrency: int | None = None) -> None:
        self.workers, self.timeout_s = workers, timeout_s
        self.threads = -(-(concurrency or workers) // workers)  # calls at once per process
        self.failures: dict[str, int] = {}
        self._ids = count()
        self._lock = threading.Lock()  # the process table and the failure counts
        self._procs = [_Worker(self.threads, self._lost) for _ in range(workers)]

    async def call(self, fn: Callable[..., Any], *args: Any, on_thread: bool = False) -> Answer:
        """``fn(*args)`` in a pool process: on its main thread, or on one of its threads
        when ``on_thread`` (a call that mostly waits on the sandbox's processes)."""
        loop = asyncio.get_running_loop()
        try:
            payload = pickle.dumps((fn, args))
        except Exception as exc:  # a lambda, an open file: nothing a process can take
            return self._failed("error", f"{type(exc).__name__}: {exc}"[:300])
        call_id = next(self._ids)
        fut: asyncio.Future[tuple[bool, Any]] = loop.create_future()
        for _ in range(2):  # a process found dead before its reader saw it is replaced
            worker = self._pick(on_thread)
            if worker is None:
                return self._failed("closed", "the reward pool is closed")
            if worker.submit(call_id, payload, on_thread, loop, fut):
                break
            self._replace(worker, "process_died")
        else:
            return self._failed("process_died", "its process died")
        try:
            ok, value = await asyncio.wait_for(fut, self.timeout_s)
        except asyncio.TimeoutError:
            if worker.hung(call_id, max(1, self.threads // 4)):  # or its main thread
                self._replace(worker, "timeout")
            return self._failed("timeout", f"timed out after {self.timeout_s:g} s")
        if ok:
            return value, None
        if value is _DIED:
            return self._failed("process_died", "its process died")
        return self._failed("error", value)  # the reward's own error, raised in the pool

    def _pick(self, on_thread: bool) -> _Worker | None:
        with self._lock:
            return min(self._procs, key=lambda w: w.load(on_thread), default=None)

    def _failed(self, why: str, line: str) -> Answer:
        with self._lock:
            self.failures[why] = self.failures.get(why, 0) + 1
        return None, line

    def _replace(self, worker: _Worker, why: str) -> None:
        with self._lock:
            if worker not in self._procs:
                return  # replaced already
            self._procs[self._procs.index(worker)] = _Worker(self.threads, self._lost)
        log.warning("reward pool: retiring a process (%s); a fresh one takes its place", why)
        worker.retire()

    def _lost(self, worker: _Worker) -> None:
        # the reader thread of a process that died (not one retired on purpose)
        self._replace(worker, "process_died")

    def close(self) -> None:
        with self._lock:
            procs, self._procs = self._procs, []
        for w in procs:
            w.kill()


_DIED = object()  # a call's answer when its process died under it


class _Worker:
    """One spawned process running calls on its main thread or on ``threads`` threads, and
    the reader thread here that hands its answers to the callers' event loops."""

    def __init__(self, threads: int, lost: Callable[[_Worker], None]) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, threads), name="reward-pool")
        self.proc.start()
        child.close()
        # call id -> (the caller's loop, its future, on a thread)
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future, bool]] = {}
        self._hung: set[int] = set()  # threaded calls that timed out, still running
        self._retired = False
        self._lock = threading.Lock()
        self._lost = lost
        threading.Thread(target=self._read, name="reward-pool-reader", daemon=True).start()

    def load(self, on_thread: bool) -> int:
        with self._lock:
            return sum(1 for *_, threaded in self._pending.values() if threaded == on_thread)

    def submit(
        self, call_id: int, payload: bytes, on_thread: bool, loop: Any, fut: asyncio.Future
    ) -> bool:
        with self._lock:
            if self._retired or not self.proc.is_alive():
                return False
            self._pending[call_id] = (loop, fut, on_thread)
            try:
                self._conn.send((call_id, payload, on_thread))
            except OSError:
                del self._pending[call_id]
                return False
        return True

    def hung(self, call_id: int, limit: int) -> bool:
        """``call_id`` timed out: True when it holds the main thread, or this process now
        holds ``limit`` hung threaded calls."""
        with self._lock:
            entry = self._pending.pop(call_id, None)
            if entry is not None and not entry[2]:
                return True
            self._hung.add(call_id)
            return len(self._hung) >= limit

    def retire(self) -> None:
        """No new calls; killed now if no live call is left, else after the last."""
        with self._lock:
            self._retired = True
            done = not self._pending
        if done:
            self.kill()

    def kill(self) -> None:
        with self._lock:
            self._retired = True
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(timeout=5)
        self._conn.close()

    def _read(self) -> None:
        while True:
            try:
                call_id, ok, value = self._conn.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # an answer that does not unpickle here
                log.warning("reward pool: an unreadable answer (%s)", exc)
                continue
            with self._lock:
                self._hung.discard(call_id)
                waiter = self._pending.pop(call_id, None)
                last = self._retired and not self._pending
            if waiter is not None:
                _settle(waiter[0], waiter[1], (ok, value))
            if last:
                self.kill()
                return
        with self._lock:
            waiters, self._pending = list(self._pending.values()), {}
            retired = self._retired
        for waiter in waiters:
            _settle(waiter[0], waiter[1], (False, _DIED))
        if not retired:
            self._lost(self)


def _settle(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, answer: Any) -> None:
    def put() -> None:
        if not fut.done():  # a caller that timed out cancelled it
            fut.set_result(answer)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed
        loop.call_soon_threadsafe(put)


def _serve(conn: Connection, threads: int) -> None:
    """The pool process: rewards on the main thread in the order sent, threaded calls on a
    pool of ``threads``; each answer sent back as it is ready."""
    send_lock = threading.Lock()
    main_calls: queue.SimpleQueue[tuple[int, bytes] | None] = queue.SimpleQueue()

    def run(call_id: int, payload: bytes) -> None:
        try:
            fn, args = pickle.loads(payload)
            answer = (call_id, True, fn(*args))
        except BaseException as exc:  # a reward's SystemExit is its error too
            answer = (call_id, False, f"{type(exc).__name__}: {exc}"[:300])
        with send_lock:
            try:
                conn.send(answer)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                conn.send((call_id, False, f"its answer cannot be sent: {exc}"[:300]))

    def receive(pool: ThreadPoolExecutor) -> None:
        while True:
            try:
                call_id, payload, on_thread = conn.recv()
            except (EOFError, OSError):  # the rank closed the pool or died
                main_calls.put(None)
                return
            if on_thread:
                pool.submit(run, call_id, payload)
            else:
                main_calls.put((call_id, payload))

    with ThreadPoolExecutor(threads, thread_name_prefix="reward") as pool:
        threading.Thread(target=receive, args=(pool,), daemon=True).start()
        while (item := main_calls.get()) is not None:
            run(*item)
        os._exit(0)
