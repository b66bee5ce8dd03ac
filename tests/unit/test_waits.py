"""What a wait says: a rank reports what it is about to block on, and for whom, before it
blocks (its heartbeats stop while it does); rank 0 shows that, and its own waits with their
bounds, in status, and names the wait when the rank goes silent (issue 23 item 6)."""

from __future__ import annotations

import msgpack
import pytest

from runtime.rank.worker import wait_label
from runtime.transport import protocol as p
from runtime.transport.states import WorkerState
from tests.unit.test_coordinator import Clock, ident, make, register_all, take_batch

pytestmark = pytest.mark.unit


def beat(rank: int, waiting_on: str = "") -> p.Heartbeat:
    return p.Heartbeat(
        rank=rank,
        role="trainer" if rank < 2 else "rollout",
        state="busy",
        layout_epoch=0,
        rollout_active_s=0.0,
        rollout_busy_s=0.0,
        engine={},
        waiting_on=waiting_on,
    )


def worker(c, rank: int) -> dict:
    return next(w for w in c.status()["workers"] if w["rank"] == rank)


def test_a_reported_wait_is_in_status_and_named_when_the_rank_goes_silent():
    clock = Clock()
    c = make(clock)
    register_all(c)
    label = "training batch 3 with trainer ranks [0, 1]"
    c.handle(ident(1), beat(1, label))
    assert worker(c, 1)["waiting_on"] == f"{label} (for 0.0 s)"
    assert worker(c, 0)["waiting_on"] is None
    for _ in range(16):  # the others beat; rank 1 is blocked in its wait
        clock.t += 1.0
        for r in (0, 2, 3):
            c.handle(ident(r), beat(r))
        c.tick()
    # a lost trainer replica is absorbed (the leader's goes on); the wait is its reason
    assert c.state == "RUNNING" and [x["rank"] for x in c.members.lost_ranks] == [1]
    assert c.members.lost_ranks[0]["reason"].endswith(
        f"its last beat said: waiting on {label} (for 16.0 s)"
    )


def test_a_beat_after_the_wait_clears_it():
    clock = Clock()
    c = make(clock)
    register_all(c)
    c.handle(ident(2), beat(2, "weight sync of version 4 from rank 0"))
    clock.t += 2.5
    assert worker(c, 2)["waiting_on"] == "weight sync of version 4 from rank 0 (for 2.5 s)"
    c.handle(ident(2), beat(2))
    assert worker(c, 2)["waiting_on"] is None


def test_rank0_lists_its_own_waits_with_their_bounds():
    clock = Clock()
    c = make(clock)
    register_all(c)
    assert c.status()["waits"] == []
    batch = take_batch(c)
    clock.t += 7.0
    (wait,) = c.status()["waits"]
    assert wait == {
        "what": f"the step report of batch {batch.batch_id}",
        "from": [0],
        "trained_by": [0, 1],
        "for_s": 7.0,
        "bound": "control.step_timeout_s=3600 (the run fails)",
    }


@pytest.mark.parametrize(
    ("label", "reason"),
    [("x" * (p.MAX_WAIT_LABEL + 1), "at most"), ("a\nb", "printable"), (7, "wrong type")],
)
def test_a_wait_label_that_is_not_a_short_line_of_text_is_refused(label, reason):
    header = msgpack.unpackb(p.encode(beat(2))[0])
    header["waiting_on"] = label
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode([msgpack.packb(header)])


def test_each_blocking_message_names_what_it_waits_on_and_for_whom():
    roles = ("trainer", "trainer", "rollout", "gone")
    sync = p.WeightSync(policy_version=4, layout_epoch=2)
    assert wait_label(sync, 0, roles) == "weight sync of version 4 to rollout ranks [2]"
    assert wait_label(sync, 2, roles) == "weight sync of version 4 from rank 0"
    switch = p.RoleSwitch(layout_epoch=3, roles=list(roles))
    assert wait_label(switch, 1, roles) == "role switch to layout epoch 3 with ranks [0, 1, 2]"
    assert wait_label(p.Checkpoint(step=8), 1, roles) == (
        "checkpoint of step 8 with trainer ranks [0, 1]"
    )
    batch = p.Batch(batch_id=5, policy_version=1, samples=[])
    assert wait_label(batch, 1, roles) == "training batch 5 with trainer ranks [0, 1]"


def test_a_model_build_held_by_a_stuck_process_is_waited_on_for_a_bounded_time(tmp_path):
    import fcntl

    from runtime.embedded.warm_start import _lock_within

    path = tmp_path / ".tiny.lock"
    with open(path, "w") as holder, open(path, "w") as waiter:
        fcntl.flock(holder, fcntl.LOCK_EX)  # the other builder, stuck
        with pytest.raises(TimeoutError, match=r"\.tiny\.lock: waited 0.3 s for the build of tiny"):
            _lock_within(waiter, 0.3, "tiny")
        fcntl.flock(holder, fcntl.LOCK_UN)
        _lock_within(waiter, 0.3, "tiny")  # free: taken at once


def test_an_engine_call_that_never_finishes_times_out_naming_the_call():
    import asyncio
    import threading

    from runtime.engines.vllm.rollout import VLLMRolloutSide

    side = VLLMRolloutSide.__new__(VLLMRolloutSide)  # the loop only: no engine needed
    side._loop = asyncio.new_event_loop()
    thread = threading.Thread(target=side._loop.run_forever, daemon=True)
    thread.start()
    try:
        assert side._await(asyncio.sleep(0, result=7), 5, "nothing") == 7
        with pytest.raises(TimeoutError, match=r"^vLLM wake_up did not finish within 0.5 s$"):
            side._await(asyncio.sleep(60), 0.5, "wake_up")
    finally:
        # let the cancelled sleep finish before the loop stops
        asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), side._loop).result(5)
        side._loop.call_soon_threadsafe(side._loop.stop)
        thread.join(5)


def test_rank0_lists_a_switch_under_way_with_the_ranks_it_waits_for():
    clock = Clock()
    c = make(clock)
    register_all(c)
    c.handle(b"cli", p.RebalanceRequest(rollout=3, trainer=1))  # applied at once: no step yet
    clock.t += 2.0
    c.handle(ident(2), p.RoleSwitchDone(rank=2, role="rollout", layout_epoch=1, duration_s=0.1))
    (wait,) = c.status()["waits"]
    assert wait["what"] == "the ranks taking up layout epoch 1 (3:1)"
    assert wait["from"] == [0, 1, 3] and wait["for_s"] == 2.0
    assert wait["bound"].startswith("control.heartbeat_timeout_s=15 of silence")


def test_rank0_lists_a_checkpoint_it_waits_for():
    from runtime.control import lifecycle

    clock = Clock()
    c = make(clock, train={"steps": 8, "checkpoint_every": 0})
    register_all(c)
    c.ckpt.save = lambda *args, **kwargs: None  # a saver, so a checkpoint can be asked for
    lifecycle.request_checkpoint(c, None)
    clock.t += 4.0
    waits = [w for w in c.status()["waits"] if "checkpoint" in w["what"]]
    assert waits == [
        {
            "what": f"the trainer's half of the checkpoint of step {c.step}",
            "from": [0],
            "for_s": 4.0,
            "bound": "control.checkpoint_timeout_s=300",
        }
    ]


def test_a_lost_rank_shows_no_wait():
    clock = Clock()
    c = make(clock)
    register_all(c)
    c.handle(ident(3), beat(3, "weight sync of version 2 from rank 0"))
    c.members.workers[3].state = WorkerState.DEAD  # rank 0's verdict on a silent rank
    assert worker(c, 3)["waiting_on"] is None


def test_a_wait_label_with_markup_is_shown_as_text():
    from rich.console import Console

    from reflow_cli.view import status_view

    console = Console(width=200, record=True)
    worker_row = {"rank": 2, "node": "[bold]n", "pid": 5, "role": "rollout", "state": "busy"}
    status = {"run": "r", "state": "RUNNING", "step": 1, "total_steps": 4, "layout": {}}
    status["workers"] = [{**worker_row, "heartbeat_age_s": 1.0, "waiting_on": "x [/] y"}]
    console.print(status_view(status))  # rich markup in a rank's text would raise here
    text = console.export_text()
    assert "x [/] y" in text and "[bold]n" in text


def test_a_tensor_parallel_rollout_names_only_the_replicas_driving_ranks():
    roles = ("trainer", "trainer", "rollout", "rollout", "rollout", "rollout")
    sync = p.WeightSync(policy_version=4, layout_epoch=2)
    assert wait_label(sync, 0, roles, 2) == "weight sync of version 4 to rollout ranks [2, 4]"
    assert wait_label(sync, 1, roles, 2) == "weight sync of version 4 gathering with rank 0"
