"""Lends at rank 0 (runtime/control/lends.py): a trainer that waits for fresh samples lends
its replica groups to rollout inside a step, and takes them back when the batch will be
there; scripted against the coordinator with a fake clock, and in the simulator."""

import itertools
import math

import pytest

from runtime.config.recipe import RecipeError, build_config, load_recipe
from runtime.config.schema import needs_collective
from runtime.control.scheduling.lending import ArrivalRate
from runtime.sim import cluster as sim_cluster
from runtime.sim.parameters import ModelProfile, load_profiles
from runtime.sim.run import plan, simulate
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.helpers import REPO
from tests.unit.test_coordinator import (
    Clock,
    ident,
    make,
    register_all,
    train_step,
    wire_done,
)

PROFILES = load_profiles()


@pytest.fixture
def clock() -> Clock:
    return Clock()


SPLIT = ["trainer", "trainer", "rollout", "rollout"]  # 2:2 on 4 ranks


def lending(clock: Clock, sigma: float = 0.0, **scheduler) -> object:
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in itertools.count()),
        scheduler={"lend_trainer": True, "lend_estimate_s": 1.0, **scheduler},
        algorithm={"group_size": 2},
        train={"steps": 50, "batch_size": 8},
        reflow={"sigma": sigma},
    )
    register_all(c)
    # the rate over the last 3 arrivals (64 by default: a real step brings hundreds)
    c.lends.arrivals = ArrivalRate(size=3)
    return c


def work(c, rank: int, slots: int = 8) -> list:
    """The requests ``rank`` is handed, as the coordinator's records."""
    ((_, msg),) = c.handle(ident(rank), p.WorkRequest(rank=rank, slots=slots))
    out = c.data.dispatcher.outstanding
    return [out[r["sample_id"]][0] for r in msg.requests]


def deliver(c, clock: Clock, requests: list, rank: int, every_s: float) -> list:
    """Each request's sample sent by ``rank``, ``every_s`` apart; what rank 0 answered."""
    out = []
    for req in requests:
        clock.t += every_s
        out += c.handle(ident(rank), wire_done(req, rank))
    return out


def ask(c) -> list:
    return c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))


def switches(out: list) -> list[p.RoleSwitch | p.Lend]:
    """The layouts broadcast (one message to every rank each): switches, lends, reclaims."""
    kinds = (p.RoleSwitch, p.Lend)
    return list({m.layout_epoch: m for _, m in out if isinstance(m, kinds)}.values())


def all_switched(c, clock: Clock, switch: p.RoleSwitch | p.Lend, after_s: float) -> list:
    clock.t += after_s
    out = []
    for rank, role in enumerate(switch.roles):
        done = p.RoleSwitchDone(
            rank=rank, role=role, layout_epoch=switch.layout_epoch, duration_s=after_s
        )
        out += c.handle(ident(rank), done)
    return out


def lend_once(c, clock: Clock) -> tuple[p.Lend, list]:
    """Rank 2 takes 8 requests and delivers 2 a second apart (1 a second), the leader
    asks: 6 of its 8 fresh samples are missing, 6 s at that rate, beyond 1.5 round trips
    of 2 x 1 s. The lend, and rank 2's requests still out."""
    held = work(c, 2)
    deliver(c, clock, held[:2], 2, every_s=1.0)
    out = ask(c)
    assert isinstance(out[-1][1], p.BatchWait)
    (lend,) = switches(out)
    return lend, held[2:]


def test_a_waiting_trainer_lends_its_groups_and_takes_them_back_when_the_batch_is_near(clock):
    c = lending(clock)
    lend, held = lend_once(c, clock)
    assert lend.roles == ["rollout"] * 4  # every trainer group generates, at once
    assert isinstance(lend, p.Lend) and lend.lent  # no group changes: not a RoleSwitch
    assert c.status()["lends"]["state"] == "lending"
    all_switched(c, clock, lend, after_s=1.0)
    assert c.status()["lends"]["state"] == "lent"
    # the lent leader takes work like any rollout rank
    mine = work(c, 0)
    assert mine and all(c.data.dispatcher.outstanding[r.sample_id][1] == 0 for r in mine)
    clock.t += 2.0  # lent 2 s: the trainer's busy cause, not idle
    # rank 2 delivers 3 more, 4 a second: the 4 still missing would be in within the
    # reclaim's 1 s: the groups come back, the lent leader hands its requests over
    assert not switches(deliver(c, clock, held[:2], 2, every_s=0.25))
    (reclaim,) = switches(deliver(c, clock, held[2:3], 2, every_s=0.25))
    assert reclaim.roles == SPLIT and isinstance(reclaim, p.Lend) and not reclaim.lent
    assert c.data.handing_over(0)  # its requests stay out there until it reports them
    c.handle(ident(0), wire.parked_message(0, {}))  # it had nothing of any
    assert not any(w == 0 for _, w in c.data.dispatcher.outstanding.values())
    assert c.data.dispatcher.requeue_reasons["left_rollout"] == len(mine)
    all_switched(c, clock, reclaim, after_s=1.0)
    back = c.status()["lends"]
    assert back["lent_now"] == 0 and back["state"] == "none"  # back, its verdict to come
    deliver(c, clock, held[3:], 2, every_s=0.1)
    out = ask(c)
    # the lend paid: the batch was there, 5.25 s after the lend was decided on a 6 s wait
    assert isinstance(out[0][1], p.Batch)
    status = c.status()
    lends = status["lends"]
    assert lends["lends"] == 1 and lends["paid"] == 1 and lends["state"] == "none"
    assert lends["margin"] < 1.5  # a lend that paid lowers it
    assert lends["predicted_wait_s"] == pytest.approx(6.0)  # what it was decided on
    sources = [s["source"] for s in status["switches"]]
    assert sources[-2:] == ["lend", "reclaim"]
    busy = c.idle.trainer_busy_s(clock.t)
    assert busy["lent"] == pytest.approx(2.0 + 3 * 0.25)
    assert "lent" not in c.idle.trainer_idle(clock.t)


def test_a_trainer_short_of_replay_lends_for_the_fresh_samples_that_fill_the_rest(clock):
    # sigma 0.5, batch 8: the 4 fresh samples a batch needs are in, but there is no replay
    # for the other 4 (idle cause replay_short): the batch waits for 4 more fresh ones,
    # 4 s at 1 a second, beyond 1.5 round trips of 2 x 1 s. Before, only a trainer short of
    # its fresh share (fresh_short) lent, and this one waited idle.
    c = lending(clock, sigma=0.5)
    held = work(c, 2)
    deliver(c, clock, held[:4], 2, every_s=1.0)
    out = ask(c)
    assert isinstance(out[-1][1], p.BatchWait)
    assert c.data.shortfall == "replay" and c.data.fresh_missing() == 4
    (lend,) = switches(out)
    assert isinstance(lend, p.Lend) and lend.roles == ["rollout"] * 4
    assert c.status()["lends"]["predicted_wait_s"] == pytest.approx(4.0, rel=0.01)


def test_a_lend_whose_batch_was_not_there_raises_the_margin(clock):
    c = lending(clock)
    lend, held = lend_once(c, clock)
    all_switched(c, clock, lend, after_s=1.0)
    # 4 missing at under 1 a second: more than the reclaim's 1 s, the gate keeps them lent
    out = deliver(c, clock, held[:2], 2, every_s=1.0)
    assert not switches(out)
    # ...until 1 is missing at 2 a second
    out = deliver(c, clock, held[2:5], 2, every_s=0.5)
    (reclaim,) = switches(out)
    all_switched(c, clock, reclaim, after_s=1.0)
    # the one sample never came: the trainer waits for fresh samples again
    assert isinstance(ask(c)[-1][1], p.BatchWait)
    lends = c.status()["lends"]
    assert lends["lends"] == 1 and lends["paid"] == 0 and lends["margin"] > 1.5


def test_no_lend_when_the_wait_is_shorter_than_the_round_trip(clock):
    c = lending(clock, lend_estimate_s=4.0)  # 1.5 x (4 + 4) = 12 s > the 6 s of the wait
    deliver(c, clock, work(c, 2)[:2], 2, every_s=1.0)
    assert not switches(ask(c))
    assert c.layout.ratio == "2:2"


def test_without_lending_the_trainer_only_waits(clock):
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in itertools.count()),
        algorithm={"group_size": 2},
        train={"steps": 50, "batch_size": 8},
        reflow={"sigma": 0.0},
    )
    register_all(c)
    deliver(c, clock, work(c, 2)[:2], 2, every_s=1.0)
    assert not switches(ask(c)) and c.lends is None and c.status()["lends"] is None


def test_a_stop_while_lent_takes_the_groups_back_before_its_checkpoint(clock):
    c = lending(clock)
    lend, _ = lend_once(c, clock)
    all_switched(c, clock, lend, after_s=1.0)
    out = c.handle(b"cli", p.StopRequest(reason="reflow stop"))
    assert out[0][1] == p.Reply(ok=True, text="stopping")
    assert not [m for _, m in out[1:] if isinstance(m, (p.Stop, p.Checkpoint))]
    (reclaim,) = switches(c.tick())
    assert reclaim.roles == SPLIT and c.state == "RUNNING"
    out = all_switched(c, clock, reclaim, after_s=1.0)
    # the groups are back: the stop goes on (no checkpointer here: it stops at once)
    assert {type(m) for _, m in out} == {p.Stop} and c.state == "STOPPING"
    assert c.status()["lends"]["paid"] == 0  # called back by the run: no verdict


def test_a_rank_lost_while_lent_is_left_out_of_the_reclaim_and_the_run_regroups(clock):
    # 2 trainer replicas of one rank each: rank 1, lent, falls silent. The lend's epochs
    # make no process groups, so the live ranks regroup without it only after the
    # reclaim (a regroup with every rank in rollout would ask them for a trainer group
    # without its leader); the trainer goes on with rank 0's replica. Before, the run
    # failed ("a rank lent to rollout was lost").
    c = lending(clock)  # vLLM + torch: process groups, so a lost rank regroups
    assert needs_collective(c.cfg)
    lend, _ = lend_once(c, clock)
    all_switched(c, clock, lend, after_s=1.0)
    clock.t += c.cfg.control.heartbeat_timeout_s + 1
    out = []
    for r in (0, 2, 3):
        out += c.handle(ident(r), heartbeat_of(r, c.layout_epoch))
    out += c.tick()
    assert c.state == "RUNNING" and [x["rank"] for x in c.members.lost_ranks] == [1]
    assert not [m for _, m in out if isinstance(m, p.RoleSwitch)]  # no regroup while lent
    (reclaim,) = switches(out)
    assert isinstance(reclaim, p.Lend) and not reclaim.lent
    assert reclaim.roles == ["trainer", "gone", "rollout", "rollout"]
    out = []
    for r in (0, 2, 3):
        done = p.RoleSwitchDone(
            rank=r, role=reclaim.roles[r], layout_epoch=reclaim.layout_epoch, duration_s=1.0
        )
        out += c.handle(ident(r), done)
    (regroup,) = switches(out)
    assert isinstance(regroup, p.RoleSwitch) and regroup.roles == reclaim.roles
    assert regroup.layout_epoch == reclaim.layout_epoch + 1
    assert c.rebalance.switches[-1].source == "lost_rank" and c.state == "RUNNING"
    assert c.data.ledger_problems() == []
    for r in (0, 2, 3):
        done = p.RoleSwitchDone(
            rank=r, role=regroup.roles[r], layout_epoch=regroup.layout_epoch, duration_s=1.0
        )
        c.handle(ident(r), done)
    ask(c)  # the trainer's next batch request: where a lend's verdict comes
    # the reclaim waited for the loss to be declared: no cost learnt, no verdict
    lends = c.status()["lends"]
    assert lends["reclaim_s"] == 1.0 and lends["paid"] == 0 and lends["margin"] == 1.5


def heartbeat_of(rank: int, epoch: int) -> p.Heartbeat:
    return p.Heartbeat(
        rank=rank,
        role="rollout",
        state="busy",
        layout_epoch=epoch,
        rollout_active_s=1.0,
        rollout_busy_s=1.0,
        engine={},
    )


def test_no_lend_before_a_rate_is_measured_nor_while_a_layout_is_pending(clock):
    c = lending(clock, lend_estimate_s=0.01)
    assert not switches(ask(c))  # nothing arrived yet: no rate, no prediction
    assert c.lends.refused == {"no_rate": 1}
    train_step(c, 1)  # (samples put in the buffer directly: still no rate)
    c.handle(b"cli", p.RebalanceRequest(rollout=3, trainer=1))  # pending: a sync point
    deliver(c, clock, work(c, 2)[:2], 2, every_s=1.0)
    assert not switches(ask(c))
    assert c.lends.refused["layout_change"] == 1


def test_a_baseline_refuses_lending_in_one_line():
    with pytest.raises(RecipeError, match=r"scheduler\.lend_trainer"):
        build_config({"reflow": {"mode": "async"}, "scheduler": {"lend_trainer": True}})


def waiting_trainer_sim() -> tuple[sim_cluster.SimCluster, ModelProfile]:
    """32 GPUs of Qwen3-8B math whose trainer is 20x the profile's: it waits for rollout
    and lends (12 steps, a sync every 2, no allocator). The cluster and its model."""
    cfg = load_recipe(
        REPO / "recipes" / "dapo_math.yaml",
        [
            "train.steps=12",
            "train.sync_every=2",
            "scheduler.lend_trainer=true",
            "scheduler.auto_rebalance=false",
        ],
    )
    base = PROFILES.model("qwen3-8b")
    fast = ModelProfile(**{**base.__dict__, "train_tok_s": base.train_tok_s * 20})
    sim = sim_cluster.SimCluster(plan(cfg, 32, mode="reflow").cfg, fast, PROFILES.workload("math"))
    return sim, fast


def test_a_simulated_run_lends_with_the_models_phases_and_loses_nothing():
    sim, fast = waiting_trainer_sim()
    assert sim.coord.cfg.scheduler.lend_estimate_s == fast.lend_estimate_s()
    res = sim.run()
    s = res.summary
    assert s["state"] == "COMPLETED" and s["steps"] == 12
    assert s["samples"]["lost"] == 0 and s["samples"]["duplicated"] == 0
    assert s["ledger_violations"] == 0
    lends = [x for x in s["switches"] if x["source"] == "lend"]
    reclaims = [x for x in s["switches"] if x["source"] == "reclaim"]
    assert lends and len(reclaims) == len(lends)
    assert {x["ratio"] for x in lends} == {"32:0"}
    to_rollout = sum(fast.lend_phases("trainer", "rollout").values())
    to_trainer = sum(fast.lend_phases("rollout", "trainer").values())
    assert [x["max_rank_switch_s"] for x in lends] == pytest.approx([to_rollout] * len(lends))
    assert [x["max_rank_switch_s"] for x in reclaims] == pytest.approx([to_trainer] * len(lends))
    assert "state_transfer" not in reclaims[0]["phases_max_s"]  # its own state, kept
    # a lend moves no process group (runtime/rank/worker.py lend_switch): no regroup
    assert all("regroup" not in x["phases_max_s"] for x in lends + reclaims)
    assert s["trainer_busy_by_cause"]["lent"] > 0
    assert "fresh_short" not in s["trainer_idle_by_cause"]
    assert res.metrics[-1]["lends"]["lends"] == len(lends)
    # rank 0 measures each switch from its ranks' reports: none is over before its slowest
    # rank (a rank still switching used to beat from the new epoch, which ended it early)
    assert all(x["duration_s"] >= x["max_rank_switch_s"] - 1e-3 for x in s["switches"])
    measured = res.metrics[-1]["lends"]
    assert measured["lend_s"] == pytest.approx(to_rollout, rel=1e-3)
    assert measured["reclaim_s"] == pytest.approx(to_trainer, rel=1e-3)


def test_a_reclaim_in_the_middle_of_a_replicas_finished_turns_loses_nothing():
    # Math, Qwen3-14B on 16 GPUs, the grid's run: a delivery among turns that end at the
    # same instant ends a lend, and the replica leaves while its other turns are reported
    # (the simulator raised KeyError there, 160 steps in)
    cfg = load_recipe(
        REPO / "recipes" / "dapo_math.yaml", ["train.steps=160", "scheduler.lend_trainer=true"]
    )
    res = simulate(plan(cfg, 16, mode="reflow", model="qwen3-14b", workload="math"))
    s = res.summary
    assert s["state"] == "COMPLETED" and s["steps"] == 160
    assert s["lends"]["lends"] > 10 and s["samples"]["lost"] == 0
    assert s["samples"]["duplicated"] == 0 and s["ledger_violations"] == 0


def test_the_arrival_rate_over_the_last_arrivals():
    rate = ArrivalRate(size=3)
    assert rate.per_s(0.0) == 0.0  # nothing to go by
    rate.arrived(1.0)
    rate.arrived(1.0)
    assert rate.per_s(1.0) == math.inf  # all at this instant: no bound yet
    rate.arrived(2.0)
    assert rate.per_s(2.0) == pytest.approx(2.0)  # 2 intervals over 1 s
    rate.arrived(4.0)  # the first falls out of the window
    assert rate.per_s(4.0) == pytest.approx(2 / 3)
    assert rate.per_s(7.0) == pytest.approx(2 / 6)  # a supply that stopped slows down
    with pytest.raises(ValueError):
        ArrivalRate(size=1)
