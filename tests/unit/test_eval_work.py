"""Eval rounds in the run (runtime/control/eval_work.py), driven through the coordinator
with a fake clock: the start's round, a round after a sync that crosses eval_every, steps
going on while one runs, held weight syncs, the end's round before the run completes, a
lost pinned rank, and a resume that does not evaluate a version again."""

from __future__ import annotations

import itertools

import pytest

from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.unit.test_coordinator import Clock, ident, register_all, take_batch, train_step

pytestmark = pytest.mark.unit

PROMPTS = {
    "alpha": [{"index": 0, "prompt_ids": [5, 6]}, {"index": 3, "prompt_ids": [7]}],
    "beta": [{"index": 1, "prompt_ids": [8, 9, 10]}],
}


def make(clock: Clock, steps: int = 4, **sections) -> Coordinator:
    raw = {
        "resources": {"gpus_per_node": 4, "initial_ratio": "2:2"},
        "train": {"steps": steps, "sync_every": 1, "eval_every": 2},
        "eval": {"k": 1, "timeout_s": 60},
        **sections,
    }
    return Coordinator(build_config(raw), run="t", clock=clock, wall=clock, eval_prompts=PROMPTS)


def ask(c: Coordinator, rank: int, slots: int = 16) -> p.Message:
    ((_, answer),) = c.handle(ident(rank), p.WorkRequest(rank=rank, slots=slots))
    return answer


def play(c: Coordinator, rank: int, work: p.EvalWork, reward=lambda t: 1.0) -> list:
    out = []
    for t in work.tasks:
        done = p.EvalDone(
            rank=rank,
            round_id=work.round_id,
            task_id=t["task_id"],
            policy_version=work.policy_version,
            reward=reward(t),
        )
        out += c.handle(ident(rank), done)
    return out


def eval_lines(c: Coordinator) -> list[dict]:
    return [line for line in c.reports.new_lines if "eval_version" in line]


def test_rounds_at_the_start_every_n_steps_and_at_the_end_while_training_goes_on():
    clock = Clock()
    c = make(clock)
    register_all(c)
    rollout = c.sync_receivers()
    assert rollout == [2, 3]
    # the first driver to ask is pinned to version 0 and gets every episode of the round
    work = ask(c, 2)
    assert isinstance(work, p.EvalWork) and work.policy_version == 0
    assert len(work.tasks) == (2 + 1) * 2  # greedy + k=1 sampled per prompt
    assert {t["prompt"]["index"] for t in work.tasks} == {0, 1, 3}
    assert c.evals.pinned == 2
    # the other driver gets training work; the pinned one asks again and gets none
    assert isinstance(ask(c, 3), p.Work)
    again = ask(c, 2)
    assert isinstance(again, p.EvalWork) and again.tasks == []

    # a step while the round runs: its weight sync is held for the pinned driver
    out = train_step(c, 1)
    syncs = {to: m for to, m in out if isinstance(m, p.WeightSync)}
    assert syncs[ident(2)].hold and not syncs[ident(3)].hold and not syncs[ident(0)].hold
    assert c.step == 1  # training did not wait for the eval

    clock.t += 5.0
    play(c, 2, work, reward=lambda t: 1.0 if t["set_name"] == "alpha" else 0.0)
    (start,) = eval_lines(c)
    assert start["step"] == 0 and start["eval_version"] == 0 and start["eval_complete"]
    assert start["eval_start/alpha/greedy"] == 1.0 and start["eval_start/beta/greedy"] == 0.0
    assert start["eval_s"] == pytest.approx(5.0)
    # done, still at version 0: it takes training work again, and the leader's next batch
    # request (between steps, at a sync point) first brings it the current version
    assert c.evals.pinned is None and c.evals.behind(1)
    assert isinstance(ask(c, 2), p.Work)
    out = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
    syncs = {to: m for to, m in out if isinstance(m, p.WeightSync)}
    assert set(syncs) == {ident(0), ident(2), ident(3)} and syncs[ident(2)].policy_version == 1
    assert not any(m.hold for m in syncs.values()) and not c.evals.behind(1)
    assert isinstance(out[-1][1], p.BatchWait)

    # step 2 crosses eval_every: a sync (rank 2 now takes version 2), then its round
    out = train_step(c, 2)
    syncs = {to: m for to, m in out if isinstance(m, p.WeightSync)}
    assert not syncs[ident(2)].hold
    r = c.evals.active
    assert r is not None and (r.version, r.step, r.when) == (2, 2, "step")
    pinned = c.evals.pinned
    work = ask(c, pinned)
    assert isinstance(work, p.EvalWork) and work.policy_version == 2

    train_step(c, 3)  # steps go on while it runs
    assert c.step == 3
    play(c, pinned, work)
    assert [line["eval_version"] for line in eval_lines(c)] == [0, 2]
    assert eval_lines(c)[1]["step"] == 2 and eval_lines(c)[1]["eval/alpha/pass@1"] == 1.0

    # the last step: its version to the drivers, its round, then the run completes
    out = train_step(c, 4)
    assert c.state == "RUNNING" and c.evals.closing
    assert {m.policy_version for _, m in out if isinstance(m, p.WeightSync)} == {4}
    ((_, wait),) = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
    assert isinstance(wait, p.BatchWait)  # no fifth step
    other = next(r for r in (2, 3) if r != c.evals.pinned)
    answer = ask(c, other)
    assert isinstance(answer, p.Work) and answer.requests == []  # no training work now
    work = ask(c, c.evals.pinned)
    out = play(c, c.evals.pinned, work)
    assert c.state == "COMPLETED"
    assert any(isinstance(m, p.Stop) for _, m in out)
    summary = c.summary()
    assert [r["version"] for r in summary["eval_rounds"]] == [0, 2, 4]
    assert summary["evals"]["alpha"]["last"]["greedy"] == 1.0
    assert c.status()["eval_rounds"]["last"]["when"] == "end"


def test_a_result_of_another_round_or_rank_is_refused_and_counted():
    clock = Clock()
    c = make(clock)
    register_all(c)
    work = ask(c, 2)
    t = work.tasks[0]["task_id"]
    done = p.EvalDone(rank=3, round_id=work.round_id, task_id=t, policy_version=0, reward=1.0)
    assert c.handle(ident(3), done) == []
    assert c.messages.rejected["eval_result"] == 1
    assert c.evals.refused == {"not_pinned": 1}


def test_losing_the_pinned_rank_ends_its_round_incomplete():
    clock = Clock()
    c = make(clock)
    register_all(c)
    work = ask(c, 2)
    play(c, 2, p.EvalWork(round_id=work.round_id, policy_version=0, tasks=work.tasks[:2]))
    c.lose_rank(c.workers[2], "test: killed")
    (line,) = eval_lines(c)
    assert not line["eval_complete"] and line["eval_missing"] == 4
    assert line["eval_reason"] == "rank 2 lost"
    assert line["eval_start/alpha/prompts"] == 1.0  # the prompt whose episodes came back


def test_a_round_past_its_timeout_ends_incomplete_and_the_end_completes_the_run():
    clock = Clock()
    # ranks stay alive without beating here: only the round's timeout is under test
    c = make(clock, steps=2, control={"heartbeat_timeout_s": 1000, "peer_timeout_s": 500})
    register_all(c)
    ask(c, 2)  # the start's round, never answered
    clock.t += 61.0
    c.tick()
    (line,) = eval_lines(c)
    assert not line["eval_complete"] and line["eval_reason"] == "timed out after 60 s"
    train_step(c, 1)
    train_step(c, 2)  # the last: an end round that never comes back either
    assert c.state == "RUNNING"
    clock.t += 61.0
    c.tick()
    assert c.state == "COMPLETED"


def test_a_resumed_run_keeps_its_rounds_and_evaluates_no_version_again():
    from runtime.control import lifecycle

    clock = Clock()
    c = make(clock, steps=6)
    register_all(c)
    play(c, 2, ask(c, 2))  # version 0
    train_step(c, 1)
    train_step(c, 2)  # version 2's round starts
    state = lifecycle.coordinator_state(c)
    assert state["eval_rounds"]["interrupted"] == 2

    resumed = make(Clock(), steps=6)
    lifecycle.restore(resumed, state, "test")
    register_all(resumed)
    assert [r.version for r in resumed.evals.records] == [0]
    # a resumed run has no start round: its first work request gets training work
    answer = ask(resumed, 2)
    assert isinstance(answer, p.Work) and resumed.evals.active is None
    assert resumed.summary()["evals"]["alpha"]["start"]["greedy"] == 1.0


def test_a_round_the_last_step_finds_running_is_followed_by_the_ends_round():
    clock = Clock()
    c = make(clock, steps=1)
    register_all(c)
    start = ask(c, 2)
    out = train_step(c, 1)  # the last step, the start's round still out
    assert c.state == "RUNNING" and c.evals.closing and c.evals.active.version == 0
    assert not [m for _, m in out if isinstance(m, p.WeightSync)]  # its sync comes later
    out = play(c, 2, start)
    # the start's round ended: the last version to every driver, none held, then its round
    syncs = [m for _, m in out if isinstance(m, p.WeightSync)]
    assert syncs and all(m.policy_version == 1 and not m.hold for m in syncs)
    assert c.evals.active.when == "end" and c.state == "RUNNING"
    rank = c.evals.pinned
    play(c, rank, ask(c, rank))
    assert c.state == "COMPLETED"
    assert [line["eval_version"] for line in eval_lines(c)] == [0, 1]


def test_which_runs_evaluate_on_the_rollout_engines():
    base = {
        "workload": {"kind": "math"},
        "data": {"train": "a.jsonl", "eval": {"held": "b.jsonl"}},
        "engine": {"rollout": "vllm", "trainer": "torch"},
    }
    assert build_config(base).evals_on_rollout
    # colocated_sync too: inside a rollout phase, on every engine
    assert build_config({**base, "reflow": {"mode": "colocated_sync"}}).evals_on_rollout
    synthetic = {"rollout": "synthetic", "trainer": "synthetic"}
    assert not build_config({**base, "engine": synthetic}).evals_on_rollout
    assert not build_config({**base, "data": {"train": "a.jsonl"}}).evals_on_rollout


def test_the_pinned_ranks_generating_seconds_are_booked_as_eval():
    clock = Clock()
    c = make(clock)
    register_all(c)
    ask(c, 2)  # pinned to the start's round

    def beat(rank: int, active: float, busy: float) -> None:
        c.handle(
            ident(rank),
            p.Heartbeat(
                rank=rank,
                role="rollout",
                state="busy",
                layout_epoch=0,
                rollout_active_s=active,
                rollout_busy_s=busy,
                engine={},
            ),
        )

    for rank in (2, 3):
        beat(rank, 0.0, 0.0)
    clock.t += 10.0
    beat(2, 10.0, 8.0)  # evaluating
    beat(3, 10.0, 8.0)  # generating for training
    assert c.idle.rollout_busy["eval"] == pytest.approx(8.0)  # rank 2's alone
    report = c.idle.report(clock.t, None)["rollout_busy_by_cause"]
    assert report == {"eval": 0.4}  # of both ranks' 20 active seconds
    # the allocator's rollout rate counts the seconds that made training samples only:
    # the eval's episodes feed no batch (counted, they read as a slow rollout side)
    train_step(c, 1)
    assert c.rebalance._marks[-1].rollout_busy_s == pytest.approx(8.0)


def test_a_pinned_rank_moved_to_the_trainer_is_not_caught_up_for_ever():
    """The allocator (or a user's rebalance) moves the pinned driver to the trainer: its
    round ends incomplete, and the rank, which will load the current weights when it plays
    rollout again, is not behind any more. Before, a catch-up sync for it went out before
    every batch and the trainer never got one (a simulated run stalled at step 124)."""
    from runtime.control import eval_work
    from tests.unit.test_lost_trainer import finish_switch

    clock = Clock()
    c = make(clock, steps=6)
    register_all(c)
    work = ask(c, 2)
    assert isinstance(work, p.EvalWork) and c.evals.pinned == 2
    batch = take_batch(c)
    out = c.handle(b"cli", p.RebalanceRequest(rollout=1, trainer=3))
    assert out[0][1].ok, out[0][1].text
    done = p.StepDone(rank=0, step=1, policy_version=1, batch_id=batch.batch_id, metrics={})
    c.handle(ident(0), done)  # the switch, at this sync point
    assert c.rebalance.switching() and c.policy_version == 1
    finish_switch(c)
    assert c.sync_receivers() == [3]
    c.tick()  # the pinned rank left the pool: its round ends incomplete
    (line,) = eval_lines(c)
    assert not line["eval_complete"] and "left the rollout pool" in line["eval_reason"]
    assert eval_work.catch_up(c) == [] and c.evals.stale == {}
    # and the trainer gets its batches
    train_step(c, 2)
    assert c.step == 2


def test_colocated_sync_plays_a_round_on_every_engine_and_its_phase_waits_for_it():
    """colocated_sync loads each version in place on every rank: its round runs inside a
    rollout phase, an even share on each driver, and the phase does not end while it
    runs (before, the trainer leader played the sets with Hugging Face generate)."""
    from runtime.control import colocation
    from tests.unit.test_data_plane import traj

    clock = Clock()
    c = make(
        clock,
        resources={"gpus_per_node": 4},
        reflow={"mode": "colocated_sync"},
        train={"steps": 4, "sync_every": 2, "eval_every": 2},
    )
    register_all(c)
    d = c.data.dispatcher  # training prompts (make() gives only the eval sets)
    d._prompts = ({"text": f"p{i}"} for i in itertools.count())
    d.exhausted = False
    assert c.sync_receivers() == [0, 1, 2, 3]
    shares = {r: ask(c, r) for r in (0, 1, 2)}  # 6 episodes over 4 drivers: 2 each at most
    assert all(isinstance(w, p.EvalWork) and len(w.tasks) == 2 for w in shares.values())
    assert c.evals.active.rank is None and c.evals.pinned is None
    training = ask(c, 3)
    assert isinstance(training, p.Work) and training.requests  # none left to share

    # the phase's training samples all in: it still waits for the round
    for req in wire.requests(training):
        c.data.deliver(traj(req, 0, worker=3))
    for _ in range(50):
        for req in c.data.request_work(3, 8):
            c.data.deliver(traj(req, 0, worker=3))
    assert not c.data.has_outstanding and c.data.n_unused >= colocation.rollout_quota(c)
    assert colocation.advance(c) == [] and colocation.phase(c).value == "rollout"

    # an episode handed to rank 0 is not rank 1's to report
    other = shares[0].tasks[0]
    forged = p.EvalDone(
        rank=1, round_id=shares[0].round_id, task_id=other["task_id"], policy_version=0, reward=1.0
    )
    assert c.handle(ident(1), forged) == []
    assert c.evals.refused["not_this_ranks"] == 1

    out = []
    for r, work in shares.items():
        out += play(c, r, work)
    (line,) = eval_lines(c)
    assert line["eval_complete"] and line["eval_version"] == 0
    assert line["eval_start/alpha/greedy"] == 1.0 and line["eval_start/beta/prompts"] == 1.0
    # the round's last result ended the phase: every rank switches to the trainer
    switches = [m for _, m in out if isinstance(m, p.RoleSwitch)]
    assert switches and switches[0].roles == ["trainer"] * 4


def test_the_ends_round_after_a_lost_pinned_rank_waits_for_the_regroup():
    """The last step is trained while a round runs, and its pinned rank dies: the end's
    round needs the last version on a live driver, but a weight sync sent before the live
    ranks regroup would run over process groups that still hold the dead rank. It goes out
    once the regroup is done."""
    from runtime.config.schema import needs_collective
    from tests.unit.test_lost_trainer import finish_switch

    clock = Clock()
    c = make(clock, steps=1)
    assert needs_collective(c.cfg)
    register_all(c)
    ask(c, 2)
    train_step(c, 1)  # the last step; the start's round still out on rank 2
    assert c.evals.closing and c.evals.active.rank == 2
    out = c.lose_rank(c.workers[2], "test: killed")
    kinds = [type(m).__name__ for _, m in out]
    assert "RoleSwitch" in kinds and "WeightSync" not in kinds, kinds
    finish_switch(c)
    out = c.tick()
    syncs = [(to, m) for to, m in out if isinstance(m, p.WeightSync)]
    assert syncs and all(
        m.policy_version == 1 and m.layout_epoch == c.layout_epoch for _, m in syncs
    )
    assert c.evals.active.when == "end" and c.evals.pinned == 3
    play(c, 3, ask(c, 3))
    assert c.state == "COMPLETED"
    assert [(x["eval_version"], x["eval_complete"]) for x in eval_lines(c)] == [
        (0, False),
        (1, True),
    ]


def test_a_stop_ends_the_round_in_flight_before_the_checkpoint_keeps_the_book():
    """Left running through the stop's checkpoint, a round could end after the checkpoint
    took the book: in the metrics, lost to the resumed run (which never evaluates a version
    it is past). It ends at the stop instead, incomplete and said so, and is kept."""
    from runtime.control import lifecycle

    clock = Clock()
    c = make(clock, steps=6)
    register_all(c)
    play(c, 2, ask(c, 2))  # version 0, complete
    train_step(c, 1)
    train_step(c, 2)  # version 2's round starts
    assert c.evals.active is not None and c.evals.active.version == 2
    lifecycle.request_stop(c, "test: stop")
    assert c.evals.active is None
    (line,) = [x for x in eval_lines(c) if x["eval_version"] == 2]
    assert not line["eval_complete"] and line["eval_reason"] == "the run stopped"
    state = lifecycle.coordinator_state(c)
    assert [r["version"] for r in state["eval_rounds"]["records"]] == [0, 2]
    assert state["eval_rounds"]["interrupted"] is None
