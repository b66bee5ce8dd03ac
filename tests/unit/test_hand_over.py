"""Hand-overs (runtime/control/hand_over.py): a rollout driver that leaves the rollout pool
reports what it had generated, and rank 0 hands each request on to another rollout rank,
which continues it; scripted against the coordinator with a fake clock, on the synthetic
engine's rollout side, and in the simulator."""

from __future__ import annotations

import itertools

from runtime.config.layout import LayoutChange
from runtime.config.recipe import load_recipe
from runtime.control.run import HAND_OVER_TIMEOUT_S
from runtime.data.sample import Request, Turn
from runtime.rank.worker import HybridWorker
from runtime.sim import cluster as sim_cluster
from runtime.sim.parameters import load_profiles
from runtime.sim.run import plan
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.helpers import REPO
from tests.unit.test_coordinator import Clock, ident, make, register_all, wire_done
from tests.unit.test_data_plane import traj
from tests.unit.test_lends import waiting_trainer_sim
from tests.unit.test_parked_rollouts import parked_rollout, synthetic_rollout_side

PROFILES = load_profiles()


def leaving(clock: Clock, **sections) -> tuple[object, list[Request]]:
    """Ranks 0-1 train, 2-3 generate; rank 2 takes 4 requests, then a rebalance to 3
    trainer ranks takes it out of the rollout pool. The coordinator and its requests."""
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in itertools.count()),
        algorithm={"group_size": 2},
        train={"steps": 50, "batch_size": 8},
        **sections,
    )
    register_all(c)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=4))
    out = c.data.dispatcher.outstanding
    taken = [out[r["sample_id"]][0] for r in work.requests]
    out = c.handle(b"cli", p.RebalanceRequest(rollout=1, trainer=3))  # before training: now
    switch = [m for _, m in out if isinstance(m, p.RoleSwitch)]
    assert switch and switch[0].roles == ["trainer", "trainer", "trainer", "rollout"]
    return c, taken


def at(c, rank: int) -> list[int]:
    return [sid for sid, (_, w) in c.data.dispatcher.outstanding.items() if w == rank]


def test_a_leaving_driver_hands_its_requests_on_with_what_it_generated():
    clock = Clock()
    c, (done, cut, empty, _) = leaving(clock)
    # its requests stay out at rank 2 until it reports: they still count against B_max
    assert c.data.handing_over(2) and len(at(c, 2)) == 4
    # what it finished before leaving comes first (one connection), and is taken
    c.handle(ident(2), wire_done(done, 2))
    assert c.data.dispatcher.outstanding.get(done.sample_id) is None
    assert c.data.stats()["delivered_by_rank"] == {"2": 1}
    report = {cut.sample_id: parked_rollout(3), empty.sample_id: parked_rollout(2, version=9)}
    assert c.handle(ident(2), wire.parked_message(2, report)) == []
    d = c.data.dispatcher
    assert not c.data.handing_over(2) and at(c, 2) == []
    # all three back at the front, in their order; only the valid report carries tokens
    front = list(d.pending)[:3]
    assert [r.sample_id for r in front] == [cut.sample_id, empty.sample_id, front[2].sample_id]
    assert front[0].resume is not None and list(front[0].resume.token_ids) == [1, 2, 3]
    assert front[1].resume is None  # version 9: a version this run never had
    assert d.parked["handed_on"] == 1 and d.parked["handed_on_tokens"] == 3
    assert d.parked["refused_version_out_of_range"] == 1
    assert d.requeue_reasons["left_rollout"] == 3
    # the rank that gets it next is sent the parked rollout and continues it
    ((_, work),) = c.handle(ident(3), p.WorkRequest(rank=3, slots=1))
    (sent,) = wire.requests(p.decode(p.encode(work)))
    assert sent.sample_id == cut.sample_id and list(sent.resume.token_ids) == [1, 2, 3]
    t = traj(sent, 0, worker=3)
    t.token_ids, t.logprobs, t.n_valid = [1, 2, 3, 4], [-1.0] * 4, 4
    t.versions = [(0, 0, 4)]
    c.handle(ident(3), wire.sample_done(t, 3))
    assert d.parked["continued_tokens"] == 3 and d.parked["regenerated_tokens"] == 0
    assert c.data.ledger_problems() == []


def test_only_what_the_current_policy_generated_is_carried():
    # continued, a rollout of an older version makes a sample older than its request's
    # admission assumed; from the prompt it is as young as any
    clock = Clock()
    c, (cut, old, mixed, _) = leaving(clock)
    c.data.policy_version = 2  # (as if two syncs had come while it generated)
    spanning = parked_rollout(4)
    spanning.versions = [(1, 0, 2), (2, 2, 4)]  # held across the last sync
    report = {
        cut.sample_id: parked_rollout(3, version=2),
        old.sample_id: parked_rollout(3, version=1),
        mixed.sample_id: spanning,
    }
    c.handle(ident(2), wire.parked_message(2, report))
    d = c.data.dispatcher
    carried = {r.sample_id for r in d.pending if r.resume is not None}
    assert carried == {cut.sample_id}
    assert d.parked["too_old_to_continue"] == 2 and d.parked["handed_on"] == 1


def test_with_age_from_the_newest_span_a_rollout_held_across_the_last_sync_is_carried():
    clock = Clock()
    c, (_, _, mixed, _) = leaving(clock, reflow={"age_from": "newest_span"})
    c.data.policy_version = 2
    spanning = parked_rollout(4)
    spanning.versions = [(1, 0, 2), (2, 2, 4)]
    c.handle(ident(2), wire.parked_message(2, {mixed.sample_id: spanning}))
    assert c.data.dispatcher.parked["handed_on"] == 1


def test_a_hand_over_that_does_not_come_sends_the_requests_back_from_their_prompts():
    clock = Clock()
    c, taken = leaving(clock, control={"heartbeat_timeout_s": 100.0})
    clock.t += HAND_OVER_TIMEOUT_S - 1
    c.tick()
    assert len(at(c, 2)) == 4  # still awaited
    clock.t += 1
    c.tick()
    d = c.data.dispatcher
    assert at(c, 2) == [] and not c.data.handing_over(2)
    assert d.requeue_reasons["hand_over_timeout"] == 4
    assert [r.sample_id for r in list(d.pending)[:4]] == [r.sample_id for r in taken]
    # a report that comes after is refused, and changes nothing
    c.handle(ident(2), wire.parked_message(2, {taken[0].sample_id: parked_rollout(3)}))
    assert c.messages.rejected["unexpected_parked"] == 1
    assert all(r.resume is None for r in d.pending)


def back_in_the_pool(c, clock: Clock) -> list[int]:
    """After :func:`leaving`: the 1:3 switch done, a rebalance brings rank 2 back to
    rollout before its report came, and it takes new requests. Their sample ids."""
    for epoch, roles in ((1, ["trainer"] * 3 + ["rollout"]), (2, None)):
        if roles is None:
            out = c.handle(b"cli", p.RebalanceRequest(rollout=2, trainer=2))
            switches = [m for _, m in out if isinstance(m, p.RoleSwitch)]
            roles = switches[0].roles
            assert roles[2] == "rollout"
        for r in range(4):
            done = p.RoleSwitchDone(rank=r, role=roles[r], layout_epoch=epoch, duration_s=0.1)
            c.handle(ident(r), done)
    assert c.data.handing_over(2)  # its report has not come
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=2))
    assert work.requests
    return [r["sample_id"] for r in work.requests]


def test_a_rank_back_in_the_pool_keeps_the_requests_handed_to_it_since_it_left():
    # The report, or its bound, settles the requests the rank held when it left, not the
    # ones it is generating again (they went back from their prompts while it worked).
    clock = Clock()
    c, taken = leaving(clock, control={"heartbeat_timeout_s": 100.0})
    new = back_in_the_pool(c, clock)
    clock.t += HAND_OVER_TIMEOUT_S
    c.tick()
    d = c.data.dispatcher
    assert sorted(at(c, 2)) == sorted(new) and not c.data.handing_over(2)
    assert d.requeue_reasons["hand_over_timeout"] == len(taken)


def test_a_report_that_comes_after_the_rank_came_back_settles_only_what_it_held():
    clock = Clock()
    c, (cut, *_) = leaving(clock)
    new = back_in_the_pool(c, clock)
    c.handle(ident(2), wire.parked_message(2, {cut.sample_id: parked_rollout(3)}))
    d = c.data.dispatcher
    assert sorted(at(c, 2)) == sorted(new) and not c.data.handing_over(2)
    assert d.parked["handed_on"] == 1 and d.requeue_reasons["left_rollout"] == 4
    assert d.pending[0].sample_id == cut.sample_id and d.pending[0].resume is not None
    assert c.data.ledger_problems() == []


def test_a_report_of_requests_that_are_not_the_ranks_is_refused():
    clock = Clock()
    c, _ = leaving(clock)
    ((_, work),) = c.handle(ident(3), p.WorkRequest(rank=3, slots=1))
    (theirs,) = work.requests  # out at rank 3, which stays in the pool
    report = {theirs["sample_id"]: parked_rollout(2), 10**6: parked_rollout(2)}
    c.handle(ident(2), wire.parked_message(2, report))
    d = c.data.dispatcher
    assert d.parked["refused_not_outstanding_there"] == 2 and d.parked["handed_on"] == 0
    assert d.outstanding[theirs["sample_id"]][1] == 3  # untouched
    assert d.requeue_reasons["left_rollout"] == 4  # rank 2's own, from their prompts
    # a rank that never left the pool cannot report a hand-over
    c.handle(ident(3), wire.parked_message(3, {theirs["sample_id"]: parked_rollout(2)}))
    assert c.messages.rejected["unexpected_parked"] == 1
    assert d.outstanding[theirs["sample_id"]][1] == 3


def test_a_rank_lost_while_handing_over_loses_nothing():
    # (the run's verdict on losing a rank in a switch is the membership's; the requests
    # are the data plane's: they go back from their prompts, and nothing waits for it)
    clock = Clock()
    c, taken = leaving(clock)
    assert c.data.worker_gone(2) == 4 and not c.data.handing_over(2)
    assert [r.sample_id for r in list(c.data.dispatcher.pending)[:4]] == [
        r.sample_id for r in taken
    ]
    assert c.data.hand_overs_due(clock.t + HAND_OVER_TIMEOUT_S) == []
    assert c.data.ledger_problems() == []


def test_colocated_ranks_hand_nothing_over():
    c = make(
        Clock(),
        resources={"gpus_per_node": 4, "initial_ratio": None},
        reflow={"mode": "colocated_sync"},
    )
    assert not any(c.hands_over(r) for r in range(4))
    resources = {"gpus_per_node": 4, "initial_ratio": "2:2", "rollout_gpus_per_replica": 2}
    c = make(Clock(), resources=resources)
    assert [c.hands_over(r) for r in range(4)] == [True, False, True, False]  # drivers only


# --- the rank's side -------------------------------------------------------------------


def test_a_synthetic_rank_leaving_rollout_reports_its_work_and_generates_again(monkeypatch):
    side, sent, now = synthetic_rollout_side(monkeypatch)
    side.activate()
    side.on_message(wire.work_message([Request(4, 1, 1, {}), Request(6, 1, 1, {})], 0))
    finished, cut = side.loop.running[4], side.loop.running[6]
    cut.n_tokens = max(cut.n_tokens, 50)
    cut.done_at = cut.started + cut.n_tokens * side.token_time_s
    now[0] = cut.started + 0.205  # 20 tokens of 6
    finished.done_at = now[0] - 0.001  # 4 is done, not yet reaped
    side.hand_over()
    kinds = [type(m) for m in sent]
    assert kinds == [p.SampleDone, p.Parked]  # the finished sample first
    parked = wire.parked(p.decode(p.encode(sent[-1])))
    assert set(parked) == {6} and parked[6].turns == [Turn(0, 20, "abort", None)]
    side.deactivate()
    # unlike a stop, the rank generates again when it next plays rollout
    side.activate()
    side.on_message(wire.work_message([Request(8, 1, 1, {})], 0))
    assert set(side.loop.running) == {8}


def test_an_engine_that_cannot_park_hands_over_nothing_at_once(monkeypatch):
    side, sent, _ = synthetic_rollout_side(monkeypatch)
    side.activate()
    side.on_message(wire.work_message([Request(4, 1, 1, {})], 0))

    def broken() -> dict:
        raise RuntimeError("engine gone")

    monkeypatch.setattr(side, "park", broken)
    side.hand_over()  # no exception: the rank's switch goes on
    (report,) = sent
    assert isinstance(report, p.Parked) and report.rollouts == []  # rank 0 need not wait


def test_a_worker_hands_over_only_when_it_leaves_rollout():
    calls: list[str] = []

    class Side:
        def __init__(self, name: str) -> None:
            self.name = name

        def hand_over(self) -> None:
            calls.append(self.name)

    w = HybridWorker.__new__(HybridWorker)
    w.sides = {"rollout": Side("rollout"), "trainer": Side("trainer")}
    w.rank, w.colocated, w.collective, w.role = 1, False, None, "rollout"
    w._enter = lambda role, phases=None: setattr(w, "role", role)
    for side in w.sides.values():
        side.on_layout = lambda change: None
    w._switch(LayoutChange(2, ("trainer", "rollout"), ("trainer", "rollout")))
    assert calls == []  # staying in the pool
    w._switch(LayoutChange(3, ("trainer", "rollout"), ("trainer", "trainer")))
    assert calls == ["rollout"]


# --- in the simulator ------------------------------------------------------------------


def test_a_simulated_reclaim_hands_the_lent_ranks_work_on():
    sim, _ = waiting_trainer_sim()  # it lends every few steps
    s = sim.run().summary
    requeued = sim.coord.data.dispatcher.requeue_reasons
    assert s["state"] == "COMPLETED" and s["steps"] == 12 and s["lends"]["lends"] > 0
    parked = s["parked_rollouts"]
    assert parked["handed_on"] > 0 and parked["handed_on_tokens"] > 0
    assert requeued["left_rollout"] > 0 and requeued["hand_over_timeout"] == 0
    # what was handed on is continued, not generated again (or still carried at the end)
    carried = sim.coord.data.parked_kept()["tokens"]
    assert parked["continued_tokens"] + carried == parked["handed_on_tokens"]
    assert parked.get("regenerated_tokens", 0) == 0
    assert s["samples"]["lost"] == 0 and s["samples"]["duplicated"] == 0
    assert s["ledger_violations"] == 0


def test_simulated_allocator_moves_come_after_a_sync_and_carry_nothing_older():
    # APPS agent, Qwen3-8B on 16 GPUs: the allocator moves rollout groups to the trainer
    # in the first 32 steps, right after weight syncs: what the leaving ranks had was
    # generated under older weights, reported, and sent back from the prompts
    cfg = load_recipe(REPO / "recipes" / "apps_coding.yaml", ["train.steps=32"])
    sim = sim_cluster.SimCluster(
        plan(cfg, 16, mode="reflow", model="qwen3-8b", workload="apps_agent").cfg,
        PROFILES.model("qwen3-8b"),
        PROFILES.workload("apps_agent"),
    )
    s = sim.run().summary
    assert s["state"] == "COMPLETED" and s["samples"]["lost"] == 0
    assert s["ledger_violations"] == 0
    assert any(x["source"] == "auto" for x in s["switches"])
    parked = s["parked_rollouts"]
    assert parked["too_old_to_continue"] > 0 and "handed_on" not in parked
    requeued = sim.coord.data.dispatcher.requeue_reasons
    assert requeued["left_rollout"] > 0 and requeued["hand_over_timeout"] == 0
