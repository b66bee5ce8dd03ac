"""A lost trainer rank at rank 0 (pure coordinator, fake clock): a data-parallel trainer
outside the leader's replica group is absorbed (its group's other ranks released, the
batch split over the replicas left); the leader's group, or a trainer without process
groups, fails the run for a restart from the checkpoint."""

from __future__ import annotations

import itertools

import pytest

from runtime.config.layout import LayoutChange
from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.rank.sides import BatchConsumer, PlaceholderSide, StepAborted
from runtime.transport import protocol as p
from tests.unit.test_coordinator import Clock, ident
from tests.unit.test_data_plane import traj


def make(clock: Clock, world: int, ratio: str, trainer_group: int = 1, **engine: str):
    raw = {
        "resources": {
            "gpus_per_node": world,
            "initial_ratio": ratio,
            "trainer_gpus_per_replica": trainer_group,
        },
        "train": {"steps": 50},
        "control": {"heartbeat_timeout_s": 15.0},
    }
    if engine:
        raw["engine"] = engine
    prompts = ({"text": f"p{i}"} for i in itertools.count())
    c = Coordinator(build_config(raw), run="t", prompts=prompts, clock=clock, wall=clock)
    for r in range(world):
        ((_, welcome),) = c.handle(
            ident(r), p.Hello(rank=r, world_size=world, node="n", pid=100 + r)
        )
        c.handle(ident(r), p.Ready(rank=r, role=welcome.role, layout_epoch=0))
    assert c.state == "RUNNING"
    return c


def silence(c: Coordinator, clock: Clock, dead: int) -> list:
    """16 s in which every rank but ``dead`` beats; the tick that declares it."""
    clock.t += 16.0
    for w in c.members.alive():
        if w.rank != dead:
            beat = p.Heartbeat(
                rank=w.rank,
                role=w.role,
                state="idle",
                layout_epoch=c.layout_epoch,
                rollout_active_s=0.0,
                rollout_busy_s=0.0,
                engine={},
            )
            c.handle(w.identity, beat)
    return c.tick()


def batch_to_leader(c: Coordinator, last: int = -1) -> list:
    """The leader asks for a batch until one comes (a rollout rank delivers meanwhile);
    every Batch message of the answer, by receiver."""
    rollout = c.trainer_ranks()[-1] + 1
    while c.workers[rollout].gone:
        rollout += 1
    for _ in range(100):
        out = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=last))
        batches = [(to, m) for to, m in out if isinstance(m, p.Batch)]
        if batches:
            return batches
        for req in c.data.request_work(rollout, c.cfg.algorithm.group_size):
            c.data.deliver(traj(req, c.policy_version, worker=rollout))
    raise AssertionError("no batch after 100 tries")


def finish_switch(c: Coordinator) -> None:
    for w in c.members.alive():
        done = p.RoleSwitchDone(
            rank=w.rank, role=c.epoch_roles()[w.rank], layout_epoch=c.layout_epoch, duration_s=0.1
        )
        c.handle(w.identity, done)
    assert not c.rebalance.switching()


def test_a_lost_trainer_replica_is_absorbed_and_its_share_goes_to_the_leader():
    clock = Clock()
    c = make(clock, 4, "2:2")  # vLLM + torch: trainer replicas [0] and [1]
    first = batch_to_leader(c)
    assert sorted(to for to, _ in first) == [ident(0), ident(1)]  # split over both
    batch_id = first[0][1].batch_id
    out = silence(c, clock, dead=1)  # rank 1 dies during the step: no report comes
    assert c.state == "RUNNING", c.reason
    (lost,) = c.members.lost_ranks
    assert lost["rank"] == 1 and lost["role"] == "trainer" and "sent no heartbeat" in lost["reason"]
    switch = next(m for _, m in out if isinstance(m, p.RoleSwitch))
    assert switch.roles == ["trainer", "gone", "rollout", "rollout"]
    assert c.trainer_ranks() == [0]
    # the batch in flight, asked for again by the leader after its regroup, is split over
    # the epoch's trainer ranks: all of it goes to rank 0
    finish_switch(c)
    ((to, again),) = batch_to_leader(c)
    assert to == ident(0) and again.batch_id == batch_id
    assert again.updates is not None and len(again.samples) == 32
    status = c.status()
    assert status["lost_ranks"][0]["rank"] == 1
    assert status["waits"][0]["trained_by"] == [0]


def test_the_other_ranks_of_a_lost_trainer_replica_are_released():
    clock = Clock()
    c = make(clock, 6, "2:4", trainer_group=2)  # trainer replicas [0, 1] and [2, 3]
    out = silence(c, clock, dead=3)
    assert c.state == "RUNNING", c.reason
    lost = c.members.lost_ranks
    assert [(x["rank"], x["role"]) for x in lost] == [(3, "trainer"), (2, "trainer")]
    assert "released: its trainer replica [2, 3] lost rank 3" in c.members.lost_ranks[1]["reason"]
    stopped = {to for to, m in out if isinstance(m, p.Stop)}
    assert stopped == {ident(2), ident(3)}
    switch = next(m for _, m in out if isinstance(m, p.RoleSwitch))
    assert switch.roles == ["trainer", "trainer", "gone", "gone", "rollout", "rollout"]
    assert c.workers[2].state == "exited"
    finish_switch(c)
    assert sorted(to for to, _ in batch_to_leader(c)) == [ident(0), ident(1)]


@pytest.mark.parametrize(
    ("world", "ratio", "group", "dead", "engine"),
    [
        (4, "2:2", 2, 1, {}),  # the leader's replica group: its state is the run's
        (4, "2:2", 1, 1, {"rollout": "synthetic", "trainer": "synthetic"}),  # no groups
    ],
)
def test_a_lost_trainer_rank_the_run_cannot_do_without_fails_it(world, ratio, group, dead, engine):
    clock = Clock()
    c = make(clock, world, ratio, trainer_group=group, **engine)
    silence(c, clock, dead=dead)
    assert c.state == "FAILED" and f"rank {dead} (trainer" in c.reason
    assert c.members.lost_ranks == []


def test_no_layout_puts_a_partly_lost_replica_group_in_the_trainer_pool():
    clock = Clock()
    c = make(clock, 8, "4:4", trainer_group=2)  # trainers [0,1] [2,3], rollout 4..7
    silence(c, clock, dead=5)  # a rollout rank
    assert c.state == "RUNNING" and c.members.lost == {5}
    finish_switch(c)
    ((_, reply),) = c.handle(b"cli", p.RebalanceRequest(rollout=2, trainer=6))
    assert not reply.ok and "ranks [5] were lost: trainer replica [4, 5] cannot train" in reply.text
    # a wholly lost group may sit in the pool: it is no part of the data parallelism
    silence(c, clock, dead=3)
    assert c.members.lost == {2, 3, 5} and c.trainer_ranks() == [0, 1]
    finish_switch(c)
    assert c.without_lost(c.layout.with_ratio(2, 6)) != ""  # [4, 5] still half lost
    assert c.without_lost(c.layout.with_ratio(4, 4)) == ""


class FailingOnce(BatchConsumer):
    """A trainer side whose first step fails as a lost peer makes it fail."""

    def __init__(self) -> None:
        super().__init__(cfg=None, rank=0)
        self.trained: list[int] = []

    def observe(self, step: int, policy_version: int) -> None:
        pass

    def train_batch(self, msg: p.Batch) -> None:
        if not self.trained and self.aborted is None and msg.batch_id == 3:
            self.trained.append(-1)
            raise StepAborted("step 4 aborted: Connection closed by peer\n[gloo]")
        self.trained.append(msg.batch_id)


def test_an_aborted_step_waits_for_a_new_trainer_group_and_no_longer(monkeypatch):
    import runtime.rank.sides as sides

    now = [1000.0]
    monkeypatch.setattr(sides.time, "monotonic", lambda: now[0])
    side = FailingOnce()
    side.active = True
    sent: list[p.Message] = []
    side.attach(lambda m: sent.append(m) or True, 0)
    batch = p.Batch(batch_id=3, policy_version=0, samples=[])
    side.on_message(batch)
    assert side.last_batch_id == -1 and side.aborted is not None  # not trained
    assert side.waiting_on.startswith("a trainer group without the lost rank (step 4 aborted")
    assert side.waiting_on.isprintable()
    side.on_message(batch)  # sent again over the old group: not trained
    assert side.trained == [-1]
    side.step()
    assert sent == []  # the leader asks for nothing while it waits
    # a new epoch with the same trainer ranks is no regroup of the trainer
    same = LayoutChange(1, ("trainer", "rollout"), ("trainer", "gone"))
    side.on_layout(same)
    assert side.aborted is not None
    now[0] += side.regroup_wait_s + 1
    with pytest.raises(RuntimeError, match="no new trainer group within 60 s"):
        side.step()
    # within the bound, a regroup of the trainer ranks lets the batch train
    side.aborted = (StepAborted("x"), now[0])
    side.on_layout(LayoutChange(2, ("trainer", "trainer"), ("trainer", "gone")))
    assert side.aborted is None and side.waiting_on == ""
    side.on_message(batch)
    assert side.trained == [-1, 3] and side.last_batch_id == 3


def rejoin(c: Coordinator, rank: int) -> list:
    """A new process of lost ``rank`` registers and says it is ready; rank 0's answers."""
    identity = f"again-{rank}".encode()
    ((_, welcome),) = c.handle(identity, p.Hello(rank=rank, world_size=6, node="n", pid=900))
    assert isinstance(welcome, p.Welcome), welcome
    assert welcome.role == "trainer" and welcome.roles[rank] == "gone"
    return c.handle(identity, p.Ready(rank=rank, role="trainer", layout_epoch=welcome.layout_epoch))


def test_a_lost_trainer_replica_group_rejoins_whole_and_between_steps():
    clock = Clock()
    c = make(clock, 6, "2:4", trainer_group=2)  # trainer replicas [0, 1] and [2, 3]
    silence(c, clock, dead=3)  # rank 2 is released with it
    finish_switch(c)
    assert c.members.lost == {2, 3} and c.trainer_ranks() == [0, 1]
    ((_, in_flight), _) = batch_to_leader(c)
    assert not any(isinstance(m, p.RoleSwitch) for _, m in rejoin(c, 3))  # half a group
    assert not any(isinstance(m, p.RoleSwitch) for _, m in rejoin(c, 2))  # a step under way
    assert c.members.rejoining == {2, 3} and c.trainer_ranks() == [0, 1]
    version = c.cfg.train.version_at(1)
    done = p.StepDone(
        rank=0, step=1, policy_version=version, batch_id=in_flight.batch_id, metrics={}
    )
    c.handle(ident(0), done)
    # the step report is no point to regroup at: the next request is
    assert c.members.lost == {2, 3}
    out = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=in_flight.batch_id))
    switch = next(m for _, m in out if isinstance(m, p.RoleSwitch))
    assert switch.roles == ["trainer"] * 4 + ["rollout"] * 2
    assert isinstance(out[-1][1], p.BatchWait) and out[-1][0] == ident(0)
    assert c.members.lost == set() and c.members.rejoining == set()
    assert sorted(x["rank"] for x in c.status()["rejoined_ranks"]) == [2, 3]
    finish_switch(c)
    batches = batch_to_leader(c, last=in_flight.batch_id)
    assert sorted(to for to, _ in batches) == sorted([ident(0), ident(1), b"again-2", b"again-3"])


def test_a_lost_trainer_rank_without_its_group_is_never_taken_back():
    clock = Clock()
    c = make(clock, 6, "2:4", trainer_group=2)
    silence(c, clock, dead=3)
    finish_switch(c)
    rejoin(c, 3)
    for _ in range(3):  # the leader asks between steps: rank 2 is still missing
        out = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
        assert not any(isinstance(m, p.RoleSwitch) for _, m in out)
    assert c.members.rejoining == {3} and 3 in c.members.lost
    assert c.epoch_roles()[2:4] == ["gone", "gone"]


def test_an_epoch_while_a_rank_waits_to_be_taken_back_waits_not_for_it():
    from runtime.control import lifecycle

    clock = Clock()
    c = make(clock, 6, "2:4", trainer_group=2)
    silence(c, clock, dead=3)
    finish_switch(c)
    rejoin(c, 3)  # ready, its partner not back: it stays gone
    identity = b"again-3"
    # a checkpoint goes to the epoch's trainer ranks only: rank 3 is in no trainer group
    c.ckpt.save = lambda *args: None  # a saver: rank 0 may ask for checkpoints
    out = lifecycle.request_checkpoint(c, then_stop=None)
    assert sorted(to for to, _ in out) == [ident(0), ident(1)]
    c.ckpt.pending = None  # not written: the test is who is asked
    # a rollout rank lost: a new epoch, rank 3 still gone in it
    out = silence(c, clock, dead=5)
    switch = next(m for _, m in out if isinstance(m, p.RoleSwitch))
    assert switch.roles == ["trainer", "trainer", "gone", "gone", "rollout", "gone"]
    assert identity in {to for to, m in out if isinstance(m, p.RoleSwitch)}  # its view follows
    assert c.workers[3].state == "idle"  # nothing to switch: not waited for
    for w in c.members.alive():
        if w.rank != 3:
            role = c.epoch_roles()[w.rank]
            done = p.RoleSwitchDone(
                rank=w.rank, role=role, layout_epoch=c.layout_epoch, duration_s=0.1
            )
            c.handle(w.identity, done)
    assert not c.rebalance.switching()
    assert c.status()["rejoined_ranks"] == []  # registered again, not taken back


class RecordingSide(PlaceholderSide):
    """A role side that records what the worker asks of it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.calls: list = []

    def activate(self) -> None:
        self.calls.append("activate")

    def deactivate(self) -> None:
        self.calls.append("deactivate")

    def on_layout(self, change: LayoutChange) -> None:
        self.calls.append(("on_layout", change.epoch))


class SentFrames:
    def __init__(self) -> None:
        self.sent: list[p.Message] = []

    def send_multipart(self, frames, flags=0) -> None:
        self.sent.append(p.decode(frames))


def test_a_rank_not_taken_back_follows_an_epoch_that_leaves_it_out(tmp_path):
    from runtime.rank.worker import HybridWorker
    from runtime.store.run_dir import RunPaths

    cfg = build_config({"resources": {"gpus_per_node": 4, "initial_ratio": "2:2"}})
    w = HybridWorker(rank=1, world_size=4, paths=RunPaths(tmp_path), cfg=cfg, make_sides=dict)
    w.link.sock = SentFrames()
    w.sides = {"trainer": RecordingSide("trainer"), "rollout": RecordingSide("rollout")}
    w.role, w.layout_epoch = "trainer", 1  # welcomed gone at epoch 1
    w.roles = ("trainer", "gone", "rollout", "rollout")
    w._handle(p.RoleSwitch(layout_epoch=2, roles=["trainer", "gone", "rollout", "gone"]))
    assert w.layout_epoch == 2 and w.roles == ("trainer", "gone", "rollout", "gone")
    assert w.role == "trainer" and w.sides["trainer"].calls == []  # kept as it was
    assert not any(isinstance(m, p.RoleSwitchDone) for m in w.link.sock.sent)
    # the epoch that takes it back plans from the roles it followed
    w._handle(p.RoleSwitch(layout_epoch=3, roles=["trainer", "trainer", "rollout", "gone"]))
    assert w.sides["trainer"].calls == [("on_layout", 3)]
    assert w.sides["rollout"].calls == [("on_layout", 3)]
    (done,) = [m for m in w.link.sock.sent if isinstance(m, p.RoleSwitchDone)]
    assert done.layout_epoch == 3 and done.role == "trainer"


def test_a_rank_lost_again_before_it_is_taken_back_regroups_no_one():
    clock = Clock()
    c = make(clock, 6, "2:4", trainer_group=2)
    silence(c, clock, dead=3)
    finish_switch(c)
    epoch = c.layout_epoch
    rejoin(c, 3)
    out = silence(c, clock, dead=3)  # the new process dies too: it was in no group
    assert not any(isinstance(m, p.RoleSwitch) for _, m in out)
    assert c.layout_epoch == epoch and c.state == "RUNNING"
    assert [x["rank"] for x in c.members.lost_ranks] == [3, 2, 3]
