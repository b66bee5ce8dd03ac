"""Tensor-parallel rollout replicas (``rollout_gpus_per_replica > 1``): one engine per
replica on its driver (first rank), member sides on the other ranks, and rank 0's books
per replica: work, weight-sync recipients, idle and busy time, liveness, role switches."""

import pytest

from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.control.idle import IdleBook
from runtime.engines.registry import build_sides
from runtime.engines.synthetic import SyntheticRollout, synthetic_prompts, synthetic_rollout
from runtime.entry import cpu_threads_bind
from runtime.rank.sides import PlaceholderSide
from runtime.rank.tp_member import TensorParallelMember, tensor_parallel_member
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.unit.test_coordinator import Clock, ident, train_step
from tests.unit.test_data_plane import traj

pytestmark = pytest.mark.unit


def config(world: int, ratio: str, rollout_group: int = 2, trainer_group: int = 1, **sections):
    raw = {
        "resources": {
            "gpus_per_node": world,
            "initial_ratio": ratio,
            "rollout_gpus_per_replica": rollout_group,
            "trainer_gpus_per_replica": trainer_group,
        },
        "train": {"steps": 5},
        "engine": {"rollout": "synthetic", "trainer": "placeholder"},
    }
    raw.update(sections)
    return build_config(raw)


def running(clock: Clock, world: int, ratio: str, **kw) -> Coordinator:
    cfg = config(world, ratio, **kw)
    c = Coordinator(cfg, run="t", prompts=synthetic_prompts(0), clock=clock, wall=clock)
    for r in range(world):
        ((_, welcome),) = c.handle(ident(r), p.Hello(rank=r, world_size=world, node="n", pid=r))
        c.handle(ident(r), p.Ready(rank=r, role=welcome.role, layout_epoch=0))
    assert c.state == "RUNNING"
    return c


def beat(c: Coordinator, rank: int, active: float, busy: float, state: str = "idle") -> None:
    role = c.layout.role_of(rank).value
    c.handle(
        ident(rank),
        p.Heartbeat(
            rank=rank,
            role=role,
            state=state,
            layout_epoch=c.layout_epoch,
            rollout_active_s=active,
            rollout_busy_s=busy,
            engine={},
        ),
    )


def recipients(out: list, msg_type: type) -> set[int]:
    return {int(to.decode().split("-")[1]) for to, m in out if isinstance(m, msg_type)}


# --- the ranks' sides -----------------------------------------------------------------------


def test_only_the_first_rank_of_a_rollout_group_builds_an_engine(tmp_path):
    cfg = config(6, "4:2")
    sides = {r: build_sides(cfg, r, tmp_path)["rollout"] for r in range(6)}
    assert [type(sides[r]) for r in (0, 2, 4)] == [SyntheticRollout] * 3
    for member in (1, 3, 5):
        assert isinstance(sides[member], TensorParallelMember)
        assert sides[member].driver == member - 1
    # the trainer side is an ordinary one everywhere: a member trains in another layout
    assert isinstance(build_sides(cfg, 3, tmp_path)["trainer"], PlaceholderSide)
    # one rank per replica: every rank drives, as before
    solo = config(4, "2:2", rollout_group=1)
    solo_sides = [build_sides(solo, r, tmp_path)["rollout"] for r in range(4)]
    assert all(isinstance(side, SyntheticRollout) for side in solo_sides)


def test_a_synthetic_engine_is_refused_on_a_member(tmp_path):
    with pytest.raises(ValueError, match=r"rank 3 does not drive .* rank 2 runs its engine"):
        synthetic_rollout(config(4, "2:2"), 3, tmp_path)


def test_a_member_asks_for_nothing_and_hands_back_work_it_should_not_get():
    sent: list[p.Message] = []
    member = tensor_parallel_member(5, 2)
    assert member.driver == 4
    member.attach(lambda m: sent.append(m) or True, 5)
    member.activate()
    for _ in range(3):
        member.step()
    member.on_message(p.WeightSync(policy_version=1, layout_epoch=0))  # not in the sync group
    member.on_message(p.HeartbeatAck(step=0, policy_version=0))
    assert sent == [] and member.state == "idle"
    work = p.Work(
        policy_version=0,
        requests=[
            {"sample_id": i, "group_id": 0, "prompt_id": 0, "prompt": {}, "resume": None}
            for i in (7, 8)
        ],
    )
    member.on_message(work)
    assert [(type(m), m.sample_id) for m in sent] == [(p.SampleFailed, 7), (p.SampleFailed, 8)]
    assert member.returned == 2
    with pytest.raises(ValueError, match="drives its rollout replica"):
        TensorParallelMember(4, 4)


def test_a_driver_gets_the_cores_of_its_group_for_its_engine_workers():
    assert cpu_threads_bind(2, 2, [0, 1]) == "0|1"
    assert cpu_threads_bind(4, 4, [0, 1, 2, 3, 4, 5]) == "4|5|0|1"
    assert cpu_threads_bind(3, 2, [0, 1]) == "1"  # a member builds no engine
    assert [cpu_threads_bind(r, 1, [5, 7]) for r in range(4)] == ["5", "7", "5", "7"]
    with pytest.raises(ValueError, match="no CPU core"):
        cpu_threads_bind(0, 1, [])


# --- rank 0 ---------------------------------------------------------------------------------


def test_work_goes_to_drivers_only_and_a_member_asking_is_refused_and_counted():
    clock = Clock()
    c = running(clock, 4, "2:2")
    ((to, answer),) = c.handle(ident(3), p.WorkRequest(rank=3, slots=8))
    assert to == ident(3) and isinstance(answer, p.Work) and answer.requests == []
    assert c.messages.rejected["work_from_tp_member"] == 1
    assert c.data.dispatcher.running_at(3) == 0 and not c.data.dispatcher.outstanding
    ((_, granted),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=8))
    assert len(granted.requests) == 8 and c.data.dispatcher.running_at(2) == 8
    # a sample a member claims to have generated is not the driver's: rank 0 takes nothing
    req = wire.requests(granted)[0]
    c.handle(ident(3), wire.sample_done(traj(req, 0, worker=3), 3))
    assert c.data.dispatcher.running_at(2) == 8 and not c.data.delivered_by_worker


def test_weight_sync_goes_to_the_first_trainer_group_and_the_rollout_drivers():
    clock = Clock()
    c = running(clock, 8, "4:4", trainer_group=2)
    assert c.weight_sync_ranks() == [0, 1, 4, 6]
    assert recipients(c.weight_sync(), p.WeightSync) == {0, 1, 4, 6}
    # and at a real sync point, after a step
    assert recipients(train_step(c, 1), p.WeightSync) == {0, 1, 4, 6}
    solo = running(Clock(), 4, "2:2", rollout_group=1)
    assert recipients(solo.weight_sync(), p.WeightSync) == {0, 2, 3}


def test_rollout_time_counts_the_driver_for_its_whole_replica_and_not_the_member():
    clock = Clock()
    c = running(clock, 4, "2:2")
    beat(c, 2, 0.0, 0.0)
    beat(c, 3, 0.0, 0.0)
    clock.t += 10.0
    # the driver's engine was busy 6 of 10 s; the member runs none and reports 0 busy
    beat(c, 2, 10.0, 6.0)
    beat(c, 3, 10.0, 0.0)
    assert c.rollout_idle_ratio() == pytest.approx(0.4)  # not (4 + 10) / 20
    assert c.idle.rollout_active_s == pytest.approx(20.0)  # 2 ranks x 10 s
    assert c.idle.rollout_idle_s() == pytest.approx(8.0)  # 2 ranks x 4 s
    # the allocator's unit: busy rank-seconds of the replica
    assert c.members.rollout_busy_s(clock.t, 1.0) == pytest.approx(12.0)
    beat(c, 2, 10.0, 6.0, state="busy")
    clock.t += 0.5  # busy since its last beat: both ranks of the replica
    assert c.members.rollout_busy_s(clock.t, 1.0) == pytest.approx(13.0)


def test_the_idle_book_leaves_members_out_and_weighs_drivers_by_their_group():
    book = IdleBook(rollout_group_size=2)
    for rank in (2, 3):
        book.rank_beat(rank, 0.0, 0.0, 0.0, 0.0, holding=False)
    book.rank_is(2, "staleness", 1.0)
    book.rank_is(3, "B_max", 1.0)  # never asked: not counted
    book.rank_beat(2, 5.0, 5.0, 2.0, 0.0, holding=False)
    book.rank_beat(3, 5.0, 5.0, 0.0, 0.0, holding=False)
    assert book.rollout == {"staleness": pytest.approx(6.0)}  # 3 s idle x 2 ranks
    assert book.rollout_active_s == pytest.approx(10.0)
    assert not book.counts(3) and book.counts(2)
    with pytest.raises(ValueError, match="at least 1"):
        IdleBook(rollout_group_size=0)


def test_status_shows_each_replica_with_its_ranks_and_its_drivers_state():
    clock = Clock()
    c = running(clock, 6, "4:2")
    beat(c, 2, 1.0, 1.0, state="busy")
    s = c.status()
    assert s["rollout_replicas"] == [
        {"driver": 2, "ranks": [2, 3], "state": "busy"},
        {"driver": 4, "ranks": [4, 5], "state": "idle"},
    ]
    drivers = {w["rank"]: w["rollout_driver"] for w in s["workers"]}
    assert drivers == {0: None, 1: None, 2: 2, 3: 2, 4: 4, 5: 4}


def test_a_lost_driver_is_not_survived_on_its_members_alone():
    clock = Clock()
    c = running(clock, 4, "2:2")
    for _ in range(20):  # everyone but the driver of the only replica keeps beating
        clock.t += 1.0
        for r in (0, 1, 3):
            beat(c, r, 0.0, 0.0)
        c.tick()
    assert c.state == "FAILED" and "rank 2" in c.reason
    assert c.members.lost_ranks == []


def test_a_lost_member_or_driver_is_survived_while_another_replica_generates():
    clock = Clock()
    c = running(clock, 6, "4:2")
    for _ in range(20):
        clock.t += 1.0
        for r in (0, 1, 4, 5):
            beat(c, r, 0.0, 0.0)
        c.tick()
    assert c.state == "RUNNING"
    assert sorted(x["rank"] for x in c.members.lost_ranks) == [2, 3]


def test_a_role_switch_moves_members_with_their_group():
    clock = Clock()
    c = running(clock, 6, "2:4")
    assert c.weight_sync_ranks() == [0, 4]
    ((_, reply), *switch) = c.handle(b"cli", p.RebalanceRequest(rollout=4, trainer=2))
    assert reply.ok, reply.text
    # every rank hears the new layout, members too (their trainer sides switch)
    assert recipients(switch, p.RoleSwitch) == set(range(6))
    for r in range(6):
        role = c.layout.role_of(r).value
        c.handle(ident(r), p.RoleSwitchDone(rank=r, role=role, layout_epoch=1, duration_s=0.1))
    assert not c.rebalance.switching()
    assert c.weight_sync_ranks() == [0, 2, 4]
    ((_, answer),) = c.handle(ident(3), p.WorkRequest(rank=3, slots=4))
    assert answer.requests == [] and c.messages.rejected["work_from_tp_member"] == 1
    ((_, granted),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=4))
    assert len(granted.requests) == 4
    # and back: the replica [2, 3] leaves rollout together; its driver hands its work
    # over (its member has none), and what it reports nothing of starts from the prompt
    c.handle(b"cli", p.RebalanceRequest(rollout=2, trainer=4))
    assert c.data.handing_over(2) and not c.data.handing_over(3)
    c.handle(ident(2), wire.parked_message(2, {}))
    assert c.data.dispatcher.running_at(2) == 0
    assert c.data.dispatcher.requeue_reasons["left_rollout"] == 4
    assert [g["ranks"] for g in c.status()["rollout_replicas"]] == [[4, 5]]
