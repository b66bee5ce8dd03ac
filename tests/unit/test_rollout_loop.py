"""The rollout pull loop shared by every rollout engine, and the length model they share."""

import math
import random
import time

import pytest

from runtime.config.recipe import build_config
from runtime.data.lengths import drifting, piecewise_linear, synthetic_lengths
from runtime.data.sample import Sample
from runtime.engines.synthetic import SyntheticRollout
from runtime.rank.rollout_loop import RolloutLoop, Spans
from runtime.rank.sides import REASK_S, PullGate
from runtime.transport import frames as wire
from runtime.transport import protocol as p


def work(*ids: int, version: int = 0) -> p.Work:
    return p.Work(
        policy_version=version,
        requests=[
            {"sample_id": i, "group_id": i, "prompt_id": i, "prompt": {"k": i}, "resume": None}
            for i in ids
        ],
    )


def sample(sid: int, n: int = 3) -> Sample:
    return Sample(
        sample_id=sid,
        group_id=sid,
        prompt_id=sid,
        versions=[(0, 0, n)],
        token_ids=[1] * n,
        logprobs=[-1.0] * n,
        n_valid=n,
        reward=1.0,
    )


def test_the_gate_keeps_one_request_unanswered_and_asks_again_when_it_is_overdue():
    g, sent = PullGate(), []
    assert g.may_ask(0.0) and g.ask(lambda m: sent.append(m) or True, "m", 0.0)
    assert not g.may_ask(1.0)  # unanswered
    assert g.may_ask(REASK_S + 0.1)  # its answer is overdue: lost
    g.answered(wait_until=5.0)
    assert not g.may_ask(4.9) and g.may_ask(5.0)
    assert not g.ask(lambda m: False, "m", 6.0) and not g.asked  # not sent: not asked


def test_the_loop_asks_for_its_free_slots_and_starts_only_what_does_not_run_here():
    loop: RolloutLoop[str] = RolloutLoop(retry_s=0.5)
    sent: list = []
    loop.attach(lambda m: sent.append(m) or True, 3)
    assert not loop.pull(0, 0.0) and sent == []  # no free slot, no request
    assert loop.pull(4, 0.0) and sent == [p.WorkRequest(rank=3, slots=4)]
    assert not loop.pull(4, 0.1)  # one request unanswered at a time
    reqs = loop.take(work(1, 2), 0.2)
    assert [r.sample_id for r in reqs] == [1, 2] and reqs[0].prompt == {"k": 1}
    for r in reqs:
        loop.running[r.sample_id] = f"handle {r.sample_id}"
    # handed back after a timeout while the first copy runs: not started twice
    assert loop.pull(2, 0.3)
    assert [r.sample_id for r in loop.take(work(2, 3), 0.3)] == [3]
    # "nothing now": wait retry_s before asking again
    assert loop.pull(1, 0.4) and loop.take(work(), 0.4) == []
    assert not loop.pull(1, 0.8) and loop.pull(1, 0.9)


def test_the_loop_tells_rank_0_how_many_of_its_episodes_wait_in_tools():
    loop: RolloutLoop[str] = RolloutLoop(retry_s=0.0)
    sent: list = []
    loop.attach(lambda m: sent.append(m) or True, 3)
    assert loop.pull(4, 0.0, in_tools=2)  # nothing runs here yet: none can be in a tool
    assert sent[-1] == p.WorkRequest(rank=3, slots=4, in_tools=0)
    for r in loop.take(work(1, 2, 3), 0.0):
        loop.running[r.sample_id] = "h"
    assert loop.pull(1, 0.1, in_tools=2) and sent[-1].in_tools == 2
    loop.take(work(), 0.1)
    assert loop.pull(1, 0.2, in_tools=9) and sent[-1].in_tools == 3  # at most what runs


def test_a_rollout_side_reports_its_episodes_in_tools_with_each_work_request():
    # generations that last minutes: both still run at the second step
    engine = {"rollout": "synthetic", "trainer": "synthetic", "synthetic_token_s": 10.0}
    cfg = build_config({"engine": engine})

    class ToolWaiting(SyntheticRollout):
        waiting = 0

        def free_slots(self) -> int:
            return 4

        def episodes_in_tools(self) -> int:
            return self.waiting

    side = ToolWaiting(cfg, 1)
    sent: list = []
    side.attach(lambda m: sent.append(m) or True, 1)
    side.activate()
    side.step()
    assert sent == [p.WorkRequest(rank=1, slots=4, in_tools=0)]
    side.on_message(work(10, 11))
    side.waiting = 2  # the Work was answered: the next step asks again at once
    side.step()
    assert sent[-1] == p.WorkRequest(rank=1, slots=4, in_tools=2)


def test_an_answer_that_comes_within_the_send_does_not_leave_the_loop_waiting():
    """The simulator answers synchronously, inside ``send``."""
    loop: RolloutLoop[None] = RolloutLoop(retry_s=0.0)
    loop.attach(lambda m: loop.take(work(7), 0.0) is not None, 0)
    assert loop.pull(1, 0.0) and not loop.gate.asked and loop.pull(1, 0.0)


def test_results_wait_in_the_outbox_until_the_ranks_thread_sends_them():
    loop: RolloutLoop[None] = RolloutLoop()
    sent: list = []
    loop.attach(lambda m: sent.append(m) or True, 2)
    loop.finished(sample(4))
    loop.failed(5, "boom")
    assert sent == []
    loop.flush()
    assert [type(m) for m in sent] == [p.SampleDone, p.SampleFailed]
    assert sent[0] == wire.sample_done(sample(4), 2) and sent[1].reason == "boom"


def test_leaving_the_rollout_pool_hands_back_what_runs_and_forgets_the_request():
    loop: RolloutLoop[str] = RolloutLoop()
    loop.attach(lambda m: True, 0)
    loop.pull(1, 0.0)
    loop.running[1] = "h"
    assert loop.drop() == {1: "h"} and loop.running == {} and loop.gate.may_ask(0.0)


def test_spans_follow_weight_syncs():
    s = Spans(2)
    s.sync(2, 5)  # not a newer version: nothing
    s.sync(3, 0)  # nothing generated yet: the span takes the new version
    s.sync(4, 5)
    s.sync(6, 9)
    assert s.close(12) == [(3, 0, 5), (4, 5, 9), (6, 9, 12)]


def test_the_synthetic_engine_runs_the_loop_end_to_end():
    cfg = build_config(
        {
            "engine": {"rollout": "synthetic", "trainer": "synthetic", "synthetic_token_s": 1e-6},
            "workload": {"max_response_tokens": 16},
        }
    )
    side = SyntheticRollout(cfg, 1)
    sent: list = []
    side.attach(lambda m: sent.append(m) or True, 1)
    side.activate()
    side.step()
    assert sent == [p.WorkRequest(rank=1, slots=side.slots)]
    side.on_message(work(10, 11))
    assert side.state == "busy"
    time.sleep(0.01)
    side.step()
    done = [m for m in sent if isinstance(m, p.SampleDone)]
    assert sorted(m.sample_id for m in done) == [10, 11] and side.state == "idle"
    assert isinstance(sent[-1], p.WorkRequest)  # and it asks again
    side.on_message(work(12))
    side.deactivate()
    assert side.state == "idle" and not side.loop.gate.asked


def test_one_length_model_for_the_synthetic_engine_and_the_simulator():
    knots = ((0, 1.0), (10, 3.0), (20, 0.5))
    assert [piecewise_linear(knots, x) for x in (-5, 0, 5, 10, 15, 20, 99)] == [
        1.0,
        1.0,
        2.0,
        3.0,
        1.75,
        0.5,
        0.5,
    ]
    syn = synthetic_lengths(800, {"10": 2.0, "0": 1.0})
    assert syn.median(0) == 100 and syn.median(5) == 150 and syn.median(50) == 200
    assert syn.mean(0) == pytest.approx(100 * math.exp(0.8**2 / 2))
    sim = drifting(1000.0, 3000.0, 0.5, 4096)
    assert sim.median(0.0) == 1000 and sim.median(0.5) == 2000 and sim.median(2.0) == 3000
    rng = random.Random(0)
    draws = [synthetic_lengths(64).draw(rng, 0) for _ in range(5000)]
    assert min(draws) >= 1 and max(draws) == 64  # clamped to [1, cap]
    assert sorted(draws)[2500] == pytest.approx(8, abs=1)  # median cap / 8
