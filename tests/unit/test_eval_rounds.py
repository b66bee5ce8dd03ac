"""Rank 0's eval rounds (runtime/control/evals.py): one policy version per round on a
pinned rollout replica, figures as the trainer-side path counts them, and rounds that end
short say so."""

from __future__ import annotations

import math

import pytest

from runtime.control.evals import EvalRounds
from runtime.data.eval_scores import SetScores, pass_at_k

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def rounds(sets=None, k=2, timeout_s=600.0, clock=None) -> EvalRounds:
    sizes = sets or {"gsm": 3, "mbpp": 2}
    prompts = {
        name: [{"index": 10 + i, "prompt_ids": [1, i]} for i in range(n)]
        for name, n in sizes.items()
    }
    return EvalRounds(prompts, k, 1.0, timeout_s, clock or Clock())


def reward_of(task) -> float:
    # prompt 0 solved every time, prompt 1 only by its greedy episode and its last sample
    if task.prompt == 0:
        return 1.0
    if task.prompt == 1:
        return 1.0 if task.sample in (0, 2) else 0.0
    return 0.0


def test_a_round_hands_the_pinned_rank_every_episode_and_counts_as_the_trainer_side():
    clock = Clock()
    ev = rounds(clock=clock)
    r = ev.start(version=3, step=6, when="step", rank=2)
    assert r is not None and ev.pinned == 2 and r.total == (3 + 2) * 3
    assert ev.take(1, 100) == []  # only the pinned rank gets eval work
    assert not ev.takes_training_work(2) and ev.takes_training_work(1)
    tasks = ev.take(2, 4) + ev.take(2, 100)
    assert len(tasks) == 15 and len({t.task_id for t in tasks}) == 15
    assert ev.prompt_of(tasks[-1]) == {"index": 11, "prompt_ids": [1, 1]}
    clock.t = 42.0
    results = [ev.finished(2, r.round_id, t.task_id, reward_of(t), 3) for t in tasks]
    assert results[:-1] == [True] * 14
    record = results[-1]
    assert record.complete and record.missing == 0 and record.reason == ""
    assert (record.version, record.step, record.when, record.seconds) == (3, 6, "step", 42.0)
    # the same figures as the trainer-side path's SetScores over the same rewards
    expected = SetScores(2, 1.0)
    expected.add(1.0, [1.0, 1.0])
    expected.add(1.0, [0.0, 1.0])
    expected.add(0.0, [0.0, 0.0])
    for figure, value in expected.metrics().items():
        assert record.figures[f"eval/gsm/{figure}"] == pytest.approx(value)
    assert record.figures["eval/gsm/pass@2"] == pytest.approx(2 / 3)
    assert record.figures["eval/gsm/mean@2"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert record.figures["eval/mbpp/greedy"] == 1.0
    assert record.figures["eval/mbpp/mean@2"] == pytest.approx(0.75)
    assert record.figures["eval/gsm/unscored"] == 0.0
    # done: no longer pinned, it takes training work, but serves version 3 until a sync
    # reaches it
    assert ev.pinned is None and ev.takes_training_work(2)
    assert ev.behind(4) and not ev.behind(3) and not ev.serves(2, 4) and ev.serves(1, 4)
    ev.synced([0, 2])
    assert not ev.behind(4) and ev.serves(2, 4)
    assert math.isclose(pass_at_k(2, 1, 2), 1.0)


def test_an_episode_without_a_score_counts_zero_and_is_counted():
    ev = rounds({"s": 1}, k=1)
    r = ev.start(1, 1, "step", 0)
    a, b = ev.take(0, 2)
    assert ev.finished(0, r.round_id, a.task_id, None, 1, "no room") is True
    record = ev.finished(0, r.round_id, b.task_id, 1.0, 1)
    assert record.complete and record.figures["eval/s/unscored"] == 1.0
    assert record.figures["eval/s/greedy"] == 0.0 and record.figures["eval/s/mean@1"] == 1.0


@pytest.mark.parametrize(
    ("rank", "round_offset", "task", "reward", "why"),
    [
        (1, 0, 0, 1.0, "not_pinned"),
        (0, 1, 0, 1.0, "not_this_round"),
        (0, 0, 99, 1.0, "not_out"),
        (0, 0, 0, math.nan, "bad_reward"),
        (0, 0, 0, math.inf, "bad_reward"),
        (0, 0, 0, 1e9, "bad_reward"),
    ],
)
def test_results_the_round_cannot_have_asked_for_are_refused(rank, round_offset, task, reward, why):
    ev = rounds({"s": 1}, k=1)
    r = ev.start(1, 1, "step", 0)
    ev.take(0, 1)  # task 0 is out, task 1 is not
    assert ev.finished(rank, r.round_id + round_offset, task, reward, 1) is False
    assert ev.refused == {why: 1}
    # a refused bad reward leaves the task owed: the right answer still counts
    if why == "bad_reward":
        assert ev.finished(0, r.round_id, 0, 1.0, 1) is True


def test_a_duplicate_result_is_refused():
    ev = rounds({"s": 1}, k=1)
    r = ev.start(1, 1, "step", 0)
    (t,) = ev.take(0, 1)
    assert ev.finished(0, r.round_id, t.task_id, 1.0, 1) is True
    assert ev.finished(0, r.round_id, t.task_id, 1.0, 1) is False
    assert ev.refused == {"not_out": 1}


def test_losing_the_pinned_rank_ends_the_round_incomplete_never_silently_short():
    ev = rounds({"s": 2}, k=1)
    r = ev.start(5, 10, "step", 3)
    tasks = ev.take(3, 4)
    ev.finished(3, r.round_id, tasks[0].task_id, 1.0, 5)
    ev.finished(3, r.round_id, tasks[1].task_id, 0.0, 5)  # prompt 0 complete
    ev.finished(3, r.round_id, tasks[2].task_id, 1.0, 5)  # prompt 1 half
    assert ev.rank_lost(1) is None  # another rank: nothing happens
    record = ev.rank_lost(3)
    assert not record.complete and record.reason == "rank 3 lost" and record.missing == 1
    # the figures are over the prompts whose every episode came back, and say how many
    assert record.figures["eval/s/prompts"] == 1.0
    assert record.figures["eval/s/greedy"] == 1.0
    assert ev.pinned is None and 3 not in ev.stale
    assert ev.finished(3, r.round_id, tasks[3].task_id, 1.0, 5) is False  # too late


def test_a_round_that_runs_past_its_timeout_ends_incomplete():
    clock = Clock()
    ev = rounds({"s": 1}, k=1, timeout_s=30.0, clock=clock)
    ev.start(1, 1, "step", 0)
    clock.t = 30.0
    assert ev.tick() is None
    clock.t = 30.5
    record = ev.tick()
    assert record is not None and not record.complete and record.missing == 2
    assert record.reason == "timed out after 30 s" and record.figures["eval/s/unscored"] == 0.0
    assert "eval/s/greedy" not in record.figures  # no prompt came back whole


def test_one_round_at_a_time_and_one_round_per_version():
    ev = rounds({"s": 1}, k=1)
    r = ev.start(1, 1, "step", 0)
    assert ev.start(2, 2, "step", 1) is None and ev.skipped == 1
    for t in ev.take(0, 2):
        ev.finished(0, r.round_id, t.task_id, 1.0, 1)
    assert ev.start(1, 1, "end", 0) is None  # version 1 has its record
    assert ev.start(2, 2, "step", 1) is not None


def test_no_set_no_round():
    ev = rounds({"empty": 0})
    assert not ev.enabled and ev.start(1, 1, "step", 0) is None


def test_a_resume_keeps_finished_rounds_and_does_not_evaluate_them_again():
    ev = rounds({"s": 1}, k=1)
    r = ev.start(0, 0, "start", 1)
    for t in ev.take(1, 2):
        ev.finished(1, r.round_id, t.task_id, 1.0, 0)
    ev.start(1, 2, "step", 1)  # in flight at the checkpoint: not kept
    state = ev.state_dict()
    assert state["interrupted"] == 1

    resumed = rounds({"s": 1}, k=1)
    resumed.load_state_dict(state)
    assert [rec.version for rec in resumed.records] == [0]
    assert resumed.records[0] == ev.records[0]
    assert resumed.start(0, 0, "start", 1) is None  # the start is not evaluated again
    assert resumed.start(1, 2, "step", 1) is not None  # the interrupted one may be


def test_status_shows_the_last_round_and_the_one_in_flight():
    clock = Clock()
    ev = rounds({"s": 1}, k=1, clock=clock)
    r = ev.start(0, 0, "start", 1)
    clock.t = 2.0
    st = ev.status()
    assert st["last"] is None
    assert st["in_flight"] == {"version": 0, "rank": 1, "done": 0, "total": 2, "seconds": 2.0}
    for t in ev.take(1, 2):
        ev.finished(1, r.round_id, t.task_id, 1.0, 0)
    st = ev.status()
    assert st["in_flight"] is None and st["last"]["version"] == 0 and st["last"]["complete"]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="k >= 1"):
        EvalRounds({"s": [{"prompt_ids": [1]}]}, 0, 1.0, 10.0, Clock())
    with pytest.raises(ValueError, match="timeout_s > 0"):
        EvalRounds({"s": [{"prompt_ids": [1]}]}, 1, 1.0, 0.0, Clock())


def test_an_episode_of_another_version_ends_the_round_incomplete():
    # the pinned rank did not hold the round's weights: what it plays is not version 4
    ev = rounds({"s": 2}, k=1)
    r = ev.start(4, 8, "step", 1)
    a, b, c, _ = ev.take(1, 4)
    assert ev.finished(1, r.round_id, a.task_id, 1.0, 4) is True
    assert ev.finished(1, r.round_id, b.task_id, 1.0, 4) is True
    record = ev.finished(1, r.round_id, c.task_id, 1.0, 5)
    assert not record.complete and record.reason == "rank 1 served version 5, not 4"
    assert record.missing == 2 and record.figures["eval/s/prompts"] == 1.0
