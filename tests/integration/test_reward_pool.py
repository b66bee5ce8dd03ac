"""The reward pool runs one engine's conversations at once: sandbox calls share a
process's threads, a hung one retires its process only once a quarter of its threads hang,
a retired process answers the calls it still holds before it is killed; rewards keep the
main thread, where ``signal.alarm`` works."""

from __future__ import annotations

import asyncio
import os
import threading
import time

from runtime.workloads.agents.pool import RewardPool

_together = threading.Barrier(8, timeout=30)


def _meet() -> int:
    """Passes only when eight calls are inside the same process at once."""
    _together.wait()
    return os.getpid()


def _pid() -> int:
    return os.getpid()


def _hang() -> None:
    time.sleep(120)


def _wait_for(path: str) -> str:
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.02)
    return "answered"


def test_one_process_runs_as_many_calls_at_once_as_the_concurrency():
    pool = RewardPool(1, timeout_s=60, concurrency=8)

    async def go():
        return await asyncio.gather(*(pool.call(_meet, on_thread=True) for _ in range(8)))

    try:
        answers = asyncio.run(go())
    finally:
        pool.close()
    assert all(why is None for _, why in answers), answers
    assert len({pid for pid, _ in answers}) == 1


def test_a_hung_call_retires_its_process_only_when_a_quarter_of_its_threads_hang(tmp_path):
    pool = RewardPool(1, timeout_s=4, concurrency=8)  # retired at 2 hung calls
    go_on = tmp_path / "go"

    async def go():
        (first, _), hung = await pool.call(_pid), await pool.call(_hang, on_thread=True)
        (same, _) = await pool.call(_pid)
        # a call still running when the process is retired gets its answer: it starts
        # 2 s after the hang that retires the process, so it is 2 s from its own timeout
        second = asyncio.ensure_future(pool.call(_hang, on_thread=True))
        await asyncio.sleep(2)
        held = asyncio.ensure_future(pool.call(_wait_for, str(go_on), on_thread=True))
        second_hang = await second
        go_on.touch()
        answered = await held
        (fresh, _) = await pool.call(_pid)
        return first, hung, same, second_hang, answered, fresh

    try:
        first, hung, same, second_hang, answered, fresh = asyncio.run(go())
    finally:
        pool.close()
    assert hung == (None, "timed out after 4 s") == second_hang
    assert same == first  # one hung thread of eight: the process keeps serving
    assert answered == ("answered", None)
    assert fresh != first  # the second hang retired it
    assert pool.failures == {"timeout": 2}


def _alarm_works() -> bool:
    """What math_verify does around every parse: refused off the main thread."""
    import signal

    signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
    return True


def test_rewards_run_on_the_main_thread_and_sandbox_calls_beside_them():
    pool = RewardPool(1, timeout_s=60, concurrency=8)

    async def go():
        return await asyncio.gather(
            pool.call(_alarm_works),
            pool.call(_alarm_works, on_thread=True),
        )

    try:
        main, threaded = asyncio.run(go())
    finally:
        pool.close()
    assert main == (True, None)
    assert threaded[0] is None and "main thread" in threaded[1]
