"""The node's pool of sandbox uids: claims of several uids are all or none, so gradings
that each need two processes at once never hold one while waiting for a second."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.workloads.sandbox.uids import NodeSlots, UidPool, accounts_in


def test_a_claim_of_two_takes_both_or_none(tmp_path):
    pool = UidPool(5000, 3, lock_dir=tmp_path)
    with pool.claim(2) as held:
        assert len(set(held)) == 2 and all(5000 <= u < 5003 for u in held)
        with (
            pytest.raises(TimeoutError, match="2 of 3 uid slots not free at once"),
            pool.claim(2, timeout_s=0.2),
        ):
            pass
        # the refused claim kept nothing: the one free uid is still free
        with pool.claim(1, timeout_s=0.2) as (last,):
            assert last not in held


def test_more_gradings_than_the_pool_holds_pairs_for_all_finish(tmp_path):
    """Eight gradings of two processes each on four uids: claimed one after the other, the
    first four took a uid each and waited for a second until the claim timed out."""
    pool = UidPool(7000, 4, lock_dir=tmp_path)
    inside = threading.Barrier(2, timeout=10)  # two gradings at once hold all four uids
    seen: list[tuple[int, ...]] = []

    def grading(_: int) -> None:
        with pool.claim(2, timeout_s=20) as uids:
            seen.append(uids)
            with contextlib.suppress(threading.BrokenBarrierError):
                inside.wait()  # the odd one out at the end has no partner

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(grading, range(8)))
    assert len(seen) == 8 and all(len(set(u)) == 2 for u in seen)


def test_a_claim_larger_than_the_pool_is_refused(tmp_path):
    with (
        pytest.raises(ValueError, match="3 uid slots asked of 2"),
        UidPool(9000, 2, lock_dir=tmp_path).claim(3),
    ):
        pass


def test_accounts_in_the_range_are_named():
    assert accounts_in(0, 1) == ["root (0)"]
    assert accounts_in(0x78000000, 100_000) == []


def test_waiting_threads_take_their_turns_in_order_and_only_the_first_polls(tmp_path):
    """Twenty threads wait for a single slot: they get it in the order they came, and the
    locks are polled by the first in line only (every waiter polling every 10 ms took the
    CPU the sandboxed programs needed at 256 gradings, and the luckiest kept winning)."""
    slots = NodeSlots("run", 0, 1, tmp_path, "sandbox.running")
    polls = 0
    try_claim = slots._try_claim

    def counted(count, held):
        nonlocal polls
        polls += 1
        return try_claim(count, held)

    slots._try_claim = counted
    order: list[int] = []

    def wait(i: int) -> None:
        with slots.claim(1, timeout_s=60):
            order.append(i)

    with slots.claim(1):
        threads = []
        for i in range(20):
            threads.append(threading.Thread(target=wait, args=(i,)))
            threads[-1].start()
            deadline = time.monotonic() + 10
            while len(slots._queue) < i + 1:  # in line before the next one comes
                assert time.monotonic() < deadline
                time.sleep(0.001)
        polls_before = polls
        time.sleep(1.0)
        polled_while_held = polls - polls_before
    for t in threads:
        t.join(30)
    assert order == list(range(20))
    assert polled_while_held < 120  # one poller backing off to 20 ms, not twenty at 10 ms
    assert slots.waits == 20
