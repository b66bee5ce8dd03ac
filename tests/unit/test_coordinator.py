"""The coordinator's state machine, driven with a fake clock and no sockets."""

import itertools

import pytest

from runtime.config.recipe import build_config
from runtime.config.schema import DATA_PARALLEL_TRAINERS
from runtime.control.coordinator import Coordinator
from runtime.transport import protocol as p
from tests.unit.test_data_plane import traj


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def ident(rank: int) -> bytes:
    return f"rank-{rank}".encode()


@pytest.fixture
def clock():
    return Clock()


def make(clock, prompts=None, vocab_size=None, **sections) -> Coordinator:
    raw = {"resources": {"gpus_per_node": 4, "initial_ratio": "2:2"}, "train": {"steps": 5}}
    raw.update(sections)
    cfg = build_config(raw)
    return Coordinator(
        cfg, run="t", prompts=prompts, clock=clock, wall=clock, vocab_size=vocab_size
    )


def train_step(c: Coordinator, step: int, metrics: dict | None = None) -> list:
    """One real step: a rollout rank delivers samples until a batch can be made, the
    leader takes it and reports ``step`` on it (rank 0 accepts only that)."""
    out = take_batch(c)
    done = p.StepDone(
        rank=0,
        step=step,
        policy_version=c.cfg.train.version_at(step),
        batch_id=out.batch_id,
        metrics=metrics or {},
    )
    return c.handle(ident(0), done)


def take_batch(c: Coordinator, make_sample=traj) -> p.Batch:
    """The leader's next batch, once a rollout rank has delivered enough samples (each
    made by ``make_sample(request, version, worker=rank)``)."""
    from runtime.config.layout import Role

    d = c.data.dispatcher
    if d.exhausted or not d.pending:  # a coordinator made without prompts: give it some
        d._prompts = ({"text": f"extra{i}"} for i in itertools.count())
        d.exhausted = False
    rollout = c.layout.ranks(Role.ROLLOUT)[0]
    for _ in range(100):
        ((_, out), *_) = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
        if isinstance(out, p.Batch):
            break
        for req in c.data.request_work(rollout, c.cfg.algorithm.group_size):
            c.data.deliver(make_sample(req, c.policy_version, worker=rollout))
    else:
        raise AssertionError("no batch after 100 tries")
    return out


def register_all(c: Coordinator) -> None:
    for r in range(4):
        out = c.handle(ident(r), p.Hello(rank=r, world_size=4, node="n", pid=100 + r))
        ((to, welcome),) = out
        assert to == ident(r) and isinstance(welcome, p.Welcome)
        c.handle(ident(r), p.Ready(rank=r, role=welcome.role, layout_epoch=0))


def test_registration_makes_the_run_running(clock):
    c = make(clock)
    assert c.state == "STARTING"
    c.handle(ident(0), p.Hello(rank=0, world_size=4, node="n", pid=1))
    assert c.state == "STARTING"
    register_all(c)
    assert c.state == "RUNNING"
    roles = [w["role"] for w in c.status()["workers"]]
    assert roles == ["trainer", "trainer", "rollout", "rollout"]


def test_garbage_and_impostors_are_counted_not_obeyed(clock):
    c = make(clock)
    register_all(c)
    assert c.on_frames(b"x", [b"\xc1\xc1"]) == []
    assert c.handle(b"intruder", p.Bye(rank=1, reason="evil")) == []
    assert (
        c.handle(
            ident(1),
            p.Welcome(
                rank=1,
                role="rollout",
                layout_epoch=0,
                heartbeat_interval_s=1.0,
                roles=["trainer", "trainer", "rollout", "rollout"],
            ),
        )
        == []
    )
    assert c.handle(b"dup", p.Hello(rank=2, world_size=4, node="x", pid=9)) == []
    assert c.handle(b"w", p.Hello(rank=2, world_size=8, node="x", pid=9)) == []
    assert c.state == "RUNNING"
    assert dict(c.messages.rejected) == {
        "malformed": 1,
        "unknown_sender": 1,
        "unexpected": 1,
        "duplicate_rank": 1,
        "wrong_world": 1,
    }
    assert c.workers[1].state == "idle"


def test_heartbeats_keep_ranks_alive_and_silence_fails_the_run(clock):
    c = make(clock)
    register_all(c)
    for _ in range(20):
        clock.t += 1.0
        for r in range(4):
            ((_, ack),) = c.handle(
                ident(r),
                p.Heartbeat(
                    rank=r,
                    role="rollout" if r > 1 else "trainer",
                    state="idle",
                    layout_epoch=0,
                    rollout_active_s=10.0 if r > 1 else 0.0,
                    rollout_busy_s=7.5 if r > 1 else 0.0,
                    engine={},
                ),
            )
            assert isinstance(ack, p.HeartbeatAck)
        assert c.tick() == []
    assert c.state == "RUNNING"
    assert c.rollout_idle_ratio() == pytest.approx(0.25)
    clock.t += 16.0  # heartbeat_timeout_s defaults to 15
    out = c.tick()
    assert c.state == "FAILED"
    assert "rank 0 (trainer, pid 100 on n) sent no heartbeat for 16.0 s" in c.reason
    assert {type(m) for _, m in out} == {p.Stop}


def test_registration_timeout(clock):
    c = make(clock, control={"register_timeout_s": 30})
    c.handle(ident(0), p.Hello(rank=0, world_size=4, node="n", pid=1))
    c.handle(ident(0), p.Ready(rank=0, role="trainer", layout_epoch=0))
    clock.t += 10
    c.handle(
        ident(0),
        p.Heartbeat(
            rank=0,
            role="trainer",
            state="idle",
            layout_epoch=0,
            rollout_active_s=0.0,
            rollout_busy_s=0.0,
            engine={},
        ),
    )
    clock.t += 25
    c.handle(
        ident(0),
        p.Heartbeat(
            rank=0,
            role="trainer",
            state="idle",
            layout_epoch=0,
            rollout_active_s=0.0,
            rollout_busy_s=0.0,
            engine={},
        ),
    )
    c.tick()
    assert c.state == "FAILED"
    assert c.reason == "only 1 of 4 ranks became ready within 30 s"


def test_rebalance_is_validated_applied_and_acknowledged(clock):
    c = make(clock)
    register_all(c)
    ((_, reply),) = c.handle(b"cli", p.RebalanceRequest(rollout=3, trainer=2))
    assert not reply.ok and "adds up to 5" in reply.text
    out = c.handle(b"cli", p.RebalanceRequest(rollout=3, trainer=1))
    assert out[0][1] == p.Reply(
        ok=True, text="rebalance to 3:1 accepted; applied at the next sync point"
    )
    broadcasts = [m for _, m in out[1:]]
    assert broadcasts == [p.RoleSwitch(layout_epoch=1, roles=["trainer"] + ["rollout"] * 3)] * 4
    s = c.status()
    assert s["layout"] == {
        "rollout_gpus": 3,
        "trainer_gpus": 1,
        "epoch": 1,
        "pending": None,
        "switching": True,
    }
    assert s["workers"][1]["state"] == "switching"
    clock.t += 0.5
    for r in range(4):
        role = "trainer" if r == 0 else "rollout"
        # each rank times its phases; the record keeps the slowest rank's of each
        phases = {"offload": 0.01 * r, "wake": 0.02, "regroup": 0.03, "weight_load": 0.01}
        done = p.RoleSwitchDone(rank=r, role=role, layout_epoch=1, duration_s=0.1, phases=phases)
        c.handle(ident(r), done)
    s = c.status()
    assert not s["layout"]["switching"]
    assert [w["role"] for w in s["workers"]] == ["trainer", "rollout", "rollout", "rollout"]
    assert s["switches"][-1]["duration_s"] == 0.5
    assert s["switches"][-1]["phases_max_s"] == {
        "offload": 0.03,
        "wake": 0.02,
        "regroup": 0.03,
        "weight_load": 0.01,
    }
    ((line),) = [t for t in c.rebalance.new_transitions()]
    assert line["phases_max_s"]["offload"] == 0.03


def test_a_rebalance_asked_during_a_switch_waits_for_it_to_finish(clock):
    # The switch under way is the one last applied, not the newest request: with the
    # records' last entry taken for it, a request made during a switch hid it (the
    # ranks' reports went unmatched and the request was applied over the switch).
    c = make(clock)
    register_all(c)
    c.handle(b"cli", p.RebalanceRequest(rollout=3, trainer=1))  # before training: at once
    c.handle(b"cli", p.RebalanceRequest(rollout=1, trainer=3))
    assert c.rebalance.switching() and c.status()["layout"]["pending"] == "1:3"
    assert not [m for _, m in c.tick() if isinstance(m, p.RoleSwitch)]
    for r in range(4):
        role = "trainer" if r == 0 else "rollout"
        done = p.RoleSwitchDone(rank=r, role=role, layout_epoch=1, duration_s=0.1)
        c.handle(ident(r), done)
    assert c.status()["switches"][0]["duration_s"] is not None  # the 3:1 switch is done
    switch = [m for _, m in c.tick() if isinstance(m, p.RoleSwitch)]
    assert switch == [p.RoleSwitch(layout_epoch=2, roles=["trainer"] * 3 + ["rollout"])] * 4


def test_rebalance_waits_for_a_sync_point_once_training(clock):
    c = make(clock, train={"steps": 10, "sync_every": 2})
    register_all(c)
    train_step(c, 1, {})
    out = c.handle(b"cli", p.RebalanceRequest(rollout=1, trainer=3))
    assert [type(m) for _, m in out] == [p.Reply]  # step 1 is not a sync point
    assert c.tick() == [] and c.status()["layout"]["pending"] == "1:3"
    out = train_step(c, 2, {})
    # Weights first, to the old layout's sync group (leader + rollout ranks 2, 3), then
    # the switch to everyone: each rank sees them in this order.
    sync = p.WeightSync(policy_version=1, layout_epoch=0)  # one version per sync
    assert out[:3] == [(ident(0), sync), (ident(2), sync), (ident(3), sync)]
    assert {type(m) for _, m in out[3:]} == {p.RoleSwitch} and len(out) == 7
    assert c.layout.ratio == "1:3"


def test_sync_points_only_mid_run_and_batches_go_to_every_trainer_rank(clock):
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in itertools.count()),
        train={"steps": 3, "sync_every": 1, "batch_size": 4},
        algorithm={"group_size": 2},
        resources={"gpus_per_node": 4, "initial_ratio": "1:3"},
    )
    register_all(c)
    out = train_step(c, 1, {})
    assert out == [(ident(r), p.WeightSync(policy_version=1, layout_epoch=0)) for r in (0, 3)]
    for i, req in enumerate(c.data.request_work(3, 4)):
        t = traj(req, version=1, worker=3, reward=float(req.sample_id % 2))
        if i == 0:  # its reward crashed: scored 0, recorded by the agent
            t.info["reward_error"] = "ValueError: reward bug"
        c.data.deliver(t)
    out = c.handle(ident(0), p.BatchRequest(rank=0))
    assert [to for to, _ in out] == [ident(0), ident(1), ident(2)], out
    # a data-parallel trainer: each rank gets only its samples, the three shares the batch
    assert c.cfg.engine.trainer in DATA_PARALLEL_TRAINERS
    assert all(isinstance(m, p.Batch) and m.updates is not None for _, m in out)
    carried = [s["sample_id"] for _, m in out for s in m.samples]
    assert sorted(carried) == sorted(
        t.sample_id for t in c.data.batches[out[0][1].batch_id].samples
    )
    # each rank's plan: the whole update's normalisers, its own samples in micro-batches
    assert all(sum(len(u["n_valid"]) for u in m.updates) == 4 for _, m in out)
    assert all(m.batch_id == out[0][1].batch_id for _, m in out)
    batch_id = out[0][1].batch_id
    c.handle(ident(0), p.StepDone(rank=0, step=2, policy_version=2, batch_id=batch_id, metrics={}))
    assert c.reports.new_lines[-1]["reward_failures"] == 1
    out = train_step(c, 3, {})
    assert {type(m) for _, m in out} == {p.Stop}  # the last step: no broadcast to wait for


def test_stop_goes_through_stopping_to_stopped(clock):
    c = make(clock)
    register_all(c)
    out = c.handle(b"cli", p.StopRequest(reason="reflow stop"))
    assert out[0][1] == p.Reply(ok=True, text="stopping")
    assert [m for _, m in out[1:]] == [p.Stop(reason="reflow stop")] * 4
    assert c.state == "STOPPING" and not c.finished
    for r in range(4):
        c.handle(ident(r), p.Bye(rank=r, reason="reflow stop"))
    assert c.state == "STOPPED" and c.finished


def test_reaching_the_step_target_completes(clock):
    c = make(clock)
    register_all(c)
    for step in range(1, 6):
        out = train_step(c, step, {"loss": 1.0})
    assert c.state == "COMPLETED" and c.reason == "reached step 5"
    assert {type(m) for _, m in out} == {p.Stop}
    assert not c.finished  # ranks still have to leave
    clock.t += 31  # stop_grace_s
    assert c.finished


def test_an_unexpected_departure_fails_the_run(clock):
    c = make(clock)
    register_all(c)
    c.handle(ident(2), p.Bye(rank=2, reason="crashed"))
    assert c.state == "FAILED" and c.reason == "rank 2 left: crashed"


def beat(c, rank, clock, **engine):
    clock.t += 0.5
    c.handle(
        ident(rank),
        p.Heartbeat(
            rank=rank,
            role="rollout",
            state="busy",
            layout_epoch=0,
            rollout_active_s=1.0,
            rollout_busy_s=1.0,
            engine={k: float(v) for k, v in engine.items()},
        ),
    )


def test_engine_load_in_heartbeats_sets_caps_and_token_admission(clock):
    prompts = ({"prompt_ids": [1] * 100} for _ in itertools.count())
    c = make(
        clock,
        prompts=prompts,
        scheduler={"max_concurrency": 16, "cap_interval_s": 1.0, "adaptive_caps": True},
        algorithm={"group_size": 2},
        train={"steps": 5, "batch_size": 64},
    )
    register_all(c)
    # rank 2 hits a full KV cache, then preempts: its cap halves, twice
    beat(c, 2, clock, kv_util=0.99, kv_tokens=100_000, running=16, waiting=3, preemptions=4)
    clock.t += 1.0
    beat(c, 2, clock, kv_util=0.9, kv_tokens=100_000, running=16, waiting=3, preemptions=9)
    assert c.generation.cap(2) == 4
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=16))
    assert len(work.requests) == 4  # the cap, not the 16 asked for
    # rank 3: a small KV budget; each request books its prompt + expected response (256)
    beat(c, 3, clock, kv_util=0.1, kv_tokens=700, running=0, waiting=0, preemptions=0)
    ((_, work),) = c.handle(ident(3), p.WorkRequest(rank=3, slots=16))
    # 356 tokens for the first sibling, 256 for the second (its prompt is cached): 612
    assert len(work.requests) == 2
    assert c.data.dispatcher.blocked["token_budget"] >= 1
    status = c.status()["generation"]
    assert status["caps"] == {"2": 4, "3": 16} and status["recent_changes"][-1]["cap"] == 4
    # a finished sample releases its budget
    req = work.requests[0]
    r = next(
        x for x, _ in c.data.dispatcher.outstanding.values() if x.sample_id == req["sample_id"]
    )
    c.handle(ident(3), wire_done(r, 3))
    assert c.generation.router.workers[3].load == 256


def wire_done(req, rank):
    from runtime.transport import frames as wire

    t = traj(req, 0, worker=rank)
    return wire.sample_done(t, rank)


def test_a_dead_rollout_rank_is_survived_only_without_a_process_group(clock):
    prompts = ({"text": f"p{i}"} for i in itertools.count())
    c = make(clock, prompts=prompts, engine={"rollout": "synthetic", "trainer": "synthetic"})
    register_all(c)
    train_step(c, 1, {})
    taken = c.data.request_work(3, 4)
    clock.t += 16.0  # past the heartbeat timeout (15 s) for rank 3 only:
    for r in (0, 1, 2):
        beat(c, r, clock)
    c.tick()
    assert c.state == "RUNNING"
    (lost,) = c.members.lost_ranks
    assert lost["rank"] == 3 and lost["requeued"] == len(taken) == 4
    assert len(c.data.dispatcher.pending) >= 4  # its requests are back in the queue
    # the last rollout rank dying ends the run
    clock.t += 16.0
    beat(c, 0, clock)
    beat(c, 1, clock)
    c.tick()
    assert c.state == "FAILED" and "rank 2" in c.reason
    # with process groups, a lost rank of a tensor-parallel replica fails the run too
    tp = make(clock, resources={"gpus_per_node": 4, "rollout_gpus_per_replica": 2})
    register_all(tp)
    clock.t += 16.0
    for r in (0, 1, 2):
        beat(tp, r, clock)
    tp.tick()
    assert tp.state == "FAILED" and tp.members.lost_ranks == []


def test_a_baseline_mode_refuses_the_allocator_mid_run(clock):
    c = make(clock, reflow={"mode": "async", "sigma": 0.0})
    register_all(c)
    ((_, reply),) = c.handle(b"cli", p.AllocatorRequest(auto=True))
    assert not reply.ok and "mode=async keeps its placement" in reply.text
    assert not c.auto_rebalance


def test_a_lost_rollout_rank_with_process_groups_regroups_the_live_ranks(clock):
    # vLLM + torch (process groups), 3:1: rank 3 falls silent
    prompts = ({"text": f"p{i}"} for i in itertools.count())
    c = make(clock, prompts=prompts, resources={"gpus_per_node": 4, "initial_ratio": "3:1"})
    register_all(c)
    train_step(c, 1, {})
    clock.t += 16.0
    for r in (0, 1, 2):
        beat(c, r, clock)
    out = c.tick()
    assert c.state == "RUNNING" and c.members.lost_ranks[0]["rank"] == 3
    switches = {to: m for to, m in out if isinstance(m, p.RoleSwitch)}
    assert set(switches) == {ident(0), ident(1), ident(2)}  # the live ranks regroup
    assert switches[ident(0)].roles == ["trainer", "rollout", "rollout", "gone"]
    assert switches[ident(0)].layout_epoch == 1 == c.layout_epoch
    assert any(to == ident(3) and isinstance(m, p.Stop) for to, m in out)
    assert c.weight_sync_ranks() == [0, 1, 2]  # no sync waits for it
    for r in (0, 1, 2):
        done = p.RoleSwitchDone(rank=r, role=c.epoch_roles()[r], layout_epoch=1, duration_s=0.1)
        c.handle(ident(r), done)
    assert not c.rebalance.switching()
    # the leader reports a receiver it dropped: only the leader, of a current receiver
    bad = [
        p.PeerLost(rank=1, peer=2, layout_epoch=1, reason="x"),  # not the leader
        p.PeerLost(rank=0, peer=3, layout_epoch=1, reason="x"),  # not a receiver now
        p.PeerLost(rank=0, peer=2, layout_epoch=7, reason="x"),  # an epoch to come
    ]
    for msg in bad:
        c.handle(ident(msg.rank), msg)
    assert c.messages.rejected["bad_peer_lost"] == 3 and len(c.members.lost_ranks) == 1
    # from the epoch before (the leader was syncing while rank 0 moved on): it counts, as
    # rank 2 is still a receiver
    out = c.handle(ident(0), p.PeerLost(rank=0, peer=2, layout_epoch=0, reason="bucket 3: closed"))
    assert [x["rank"] for x in c.members.lost_ranks] == [3, 2]
    why = c.members.lost_ranks[1]["reason"]
    assert "dropped from a weight sync by rank 0: bucket 3: closed" in why
    (regroup,) = {m.layout_epoch: m for _, m in out if isinstance(m, p.RoleSwitch)}.values()
    assert regroup.roles == ["trainer", "rollout", "gone", "gone"]
    # no rebalance may leave no live rollout driver (a lost rank may sit in the trainer
    # pool as a whole lost replica: test_a_lost_trainer_replica_...)
    for ratio, why in (((2, 2), "no live rank would drive"), ((1, 3), "no live rank would drive")):
        ((_, reply),) = c.handle(b"cli", p.RebalanceRequest(rollout=ratio[0], trainer=ratio[1]))
        assert not reply.ok and why in reply.text
    # a lost rollout rank started again registers "gone" in the current epoch (it makes
    # none of its groups), gets no work until the next, and takes its role back there
    epoch = c.layout_epoch
    for r in (0, 1):
        done = p.RoleSwitchDone(rank=r, role=c.epoch_roles()[r], layout_epoch=epoch, duration_s=0.1)
        c.handle(ident(r), done)
    ((_, welcome),) = c.handle(b"rank-3-new", p.Hello(rank=3, world_size=4, node="n", pid=999))
    assert isinstance(welcome, p.Welcome) and welcome.role == "rollout"
    assert welcome.roles == ["trainer", "rollout", "gone", "gone"] and welcome.layout_epoch == epoch
    ((_, work),) = c.handle(b"rank-3-new", p.WorkRequest(rank=3, slots=4))
    assert work.requests == []
    out = c.handle(b"rank-3-new", p.Ready(rank=3, role="rollout", layout_epoch=epoch))
    switched = {to: m for to, m in out if isinstance(m, p.RoleSwitch)}
    assert set(switched) == {ident(0), ident(1), b"rank-3-new"}
    back = switched[b"rank-3-new"]
    assert back.layout_epoch == epoch + 1
    assert back.roles == ["trainer", "rollout", "gone", "rollout"]
    assert 3 not in c.members.lost
    assert c.members.rejoined_ranks == [{"rank": 3, "pid": 999, "at_step": 1}]
    assert c.rebalance.switches[-1].source == "rank_rejoined"
    assert c.weight_sync_ranks() == [0, 1, 3]


def test_an_engine_that_fails_every_generation_fails_the_run(clock):
    prompts = ({"text": f"p{i}"} for i in itertools.count())
    c = make(clock, prompts=prompts, control={"max_generation_failures": 3})
    register_all(c)
    reason = "VLLMValidationError('This model does not support generation')"

    def fail_one(rank: int) -> None:
        ((_, work),) = c.handle(ident(rank), p.WorkRequest(rank=rank, slots=1))
        sid = work.requests[0]["sample_id"]
        c.handle(ident(rank), p.SampleFailed(rank=rank, sample_id=sid, reason=reason))

    # failures are requeued; a delivered sample resets the count
    fail_one(2)
    fail_one(2)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=1))
    sid = work.requests[0]["sample_id"]
    req = next(r for r, _ in c.data.dispatcher.outstanding.values() if r.sample_id == sid)
    c.handle(ident(2), wire_done(req, 2))
    fail_one(2)
    fail_one(2)
    fail_one(3)
    assert c.state == "RUNNING" and len(c.data.dispatcher.pending) > 0
    fail_one(2)  # the third in a row at rank 2
    assert c.state == "FAILED"
    assert c.reason == f"rank 2: 3 generations in a row failed, last: {reason}"


def test_each_step_line_carries_the_reward_of_every_sample_delivered_since_the_last(clock):
    from runtime.transport import frames as wire

    prompts = ({"text": f"p{i}"} for i in itertools.count())
    c = make(clock, prompts=prompts)
    register_all(c)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=2))
    reqs = {r.sample_id: r for r, _ in c.data.dispatcher.outstanding.values()}
    for reward, req in zip((1.0, 0.0), work.requests, strict=True):
        t = traj(reqs[req["sample_id"]], 0, worker=2, reward=reward)
        c.handle(ident(2), wire.sample_done(t, 2))
    train_step(c, 1, {})
    line = c.reports.new_lines[-1]
    assert line["rollout_reward_mean"] == 0.5 and line["rollout_samples"] == 2
    train_step(c, 2, {})
    assert "rollout_reward_mean" not in c.reports.new_lines[-1]  # nothing delivered in between


@pytest.mark.parametrize(("B_max", "expected"), [(4, [(4, 4), (4, 0)]), (12, [(4, 0)])])
def test_the_allocator_window_counts_the_replay_life_of_fresh_samples(clock, B_max, expected):
    """A fresh sample first trained at age a can join delta - a later batches as replay:
    the allocator's window sums that (it keeps rollout ranks replay could not replace).
    Windows start after the warm-up, the steps that may still train what rollout made
    before the first batch: (delta + 1) x sync_every = 2 here, or B_max / b = 3 with
    B_max = 12, which leaves only the window of steps 3-4."""
    from runtime.transport import frames as wire

    prompts = ({"text": f"p{i}"} for i in itertools.count())
    c = make(
        clock,
        prompts=prompts,
        train={"steps": 5, "batch_size": 4},
        algorithm={"group_size": 2},
        reflow={"sigma": 0.5, "delta": 1, "B_max": B_max},
        scheduler={"auto_rebalance": True, "window_steps": 1},
    )
    register_all(c)

    def step(n: int, generated_at: int) -> None:
        ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=4))
        reqs = {r.sample_id: r for r, _ in c.data.dispatcher.outstanding.values()}
        for req in work.requests:
            t = traj(reqs[req["sample_id"]], generated_at, worker=2)
            c.handle(ident(2), wire.sample_done(t, 2))
        ((_, batch), *_) = c.handle(ident(0), p.BatchRequest(rank=0))
        assert isinstance(batch, p.Batch) and batch.updates is not None, batch
        # the leader carries its share, and the normalisers of the whole batch
        assert sum(len(u["n_valid"]) for u in batch.updates) == 4
        clock.t += 1.0
        done = p.StepDone(rank=0, step=n, policy_version=n, batch_id=batch.batch_id, metrics={})
        c.handle(ident(0), done)

    step(1, generated_at=0)  # trained at version 0, age 0: each may be replayed once more
    step(2, generated_at=0)  # trained at version 1, age 1: none can be replayed
    step(3, generated_at=2)  # trained at version 2, age 0
    step(4, generated_at=2)  # trained at version 3, age 1
    windows = [x["placement"]["window"] for x in c.reports.new_lines if "placement" in x]
    assert [(w["fresh"], w["replay_life"]) for w in windows] == expected
    lines = c.reports.new_lines
    assert all(x["rollout_response_tokens"] > 0 for x in lines)


def test_the_policy_version_goes_up_at_syncs_not_at_every_step(clock):
    # sync every 2 steps: step 1 keeps version 0 (a trainer that counted its optimizer
    # steps would say 1: refused), step 2 publishes version 1 and broadcasts it.
    c = make(clock, train={"steps": 6, "sync_every": 2})
    register_all(c)
    batch = take_batch(c)
    per_step = p.StepDone(rank=0, step=1, policy_version=1, batch_id=batch.batch_id, metrics={})
    assert c.handle(ident(0), per_step) == [] and c.step == 0
    assert c.messages.rejected["bad_policy_version"] == 1
    ok = p.StepDone(rank=0, step=1, policy_version=0, batch_id=batch.batch_id, metrics={})
    assert c.handle(ident(0), ok) == [] and (c.step, c.policy_version) == (1, 0)
    out = train_step(c, 2, {})
    assert {m.policy_version for _, m in out if isinstance(m, p.WeightSync)} == {1}
    assert (c.step, c.policy_version, c.data.policy_version) == (2, 1, 1)


def _zero_reward_step(c: Coordinator, step: int, why: str) -> None:
    def scored_0(req, version, worker):
        t = traj(req, version, worker=worker, reward=0.0)
        t.info["test_error"] = why if req.sample_id % 3 else "test 1: timeout: timeout after 6 s"
        return t

    out = take_batch(c, scored_0)
    done = p.StepDone(
        rank=0,
        step=step,
        policy_version=c.cfg.train.version_at(step),
        batch_id=out.batch_id,
        metrics={},
    )
    c.handle(ident(0), done)


def test_a_run_whose_reward_is_0_everywhere_says_so_naming_the_commonest_reason(clock):
    from runtime.control.reward_watch import WATCHED_STEPS

    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in itertools.count()),
        train={"steps": WATCHED_STEPS + 2},
    )
    register_all(c)
    for step in range(1, WATCHED_STEPS + 2):
        _zero_reward_step(c, step, f"test {step}: error: NameError: f is not defined")
    warned = [x for x in c.reports.new_lines if "reward_warning" in x]
    assert [x["step"] for x in warned] == [WATCHED_STEPS]  # once, when the watch ends
    assert warned[0]["reward_warning"].startswith(
        f"reward 0 for every sample of the first {WATCHED_STEPS} steps"
    )
    assert warned[0]["reward_warning"].endswith("error: NameError: f is not defined")
    # A reward above 0 in the window: no warning.
    c = make(
        clock,
        prompts=({"text": f"p{i}"} for i in itertools.count()),
        train={"steps": WATCHED_STEPS + 1},
    )
    register_all(c)
    train_step(c, 1, {})  # rewards of 0 and 1
    for step in range(2, WATCHED_STEPS + 2):
        _zero_reward_step(c, step, "test 0: wrong_answer")
    assert not any("reward_warning" in x for x in c.reports.new_lines)
