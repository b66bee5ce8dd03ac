"""Rank 0 against valid-shaped nonsense and lost messages: what it refuses, and how nothing
vanishes. Each test here failed on the code before this change (see the commit)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import tracemalloc

import msgpack
import numpy as np
import pytest

from runtime.data.sample import Sample
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from tests.unit.test_coordinator import Clock, ident, make, register_all, train_step

pytestmark = pytest.mark.unit


@pytest.fixture
def clock():
    return Clock()


def running(clock, **sections):
    prompts = ({"prompt_ids": [5, 6, 7], "text": f"p{i}"} for i in itertools.count())
    sections.setdefault("engine", {"rollout": "synthetic", "trainer": "synthetic"})
    sections.setdefault("model", {"max_seq_len": 64})
    sections.setdefault("workload", {"max_response_tokens": 32})
    sections.setdefault("train", {"steps": 5, "batch_size": 4})
    sections.setdefault("algorithm", {"group_size": 2})
    c = make(clock, prompts=prompts, vocab_size=100, **sections)
    register_all(c)
    return c


def take_work(c, rank=2, slots=2) -> list[dict]:
    ((_, work),) = c.handle(ident(rank), p.WorkRequest(rank=rank, slots=slots))
    assert isinstance(work, p.Work) and work.requests
    return work.requests


def done(req: dict, rank=2, **over) -> p.SampleDone:
    """A well-formed result for ``req``; ``over`` replaces fields to make it hostile."""
    n = over.pop("n", 4)
    fields = {
        "sample_id": req["sample_id"],
        "group_id": req["group_id"],
        "prompt_id": req["prompt_id"],
        "versions": [(0, 0, n)],
        "token_ids": list(range(1, n + 1)),
        "logprobs": [-0.5] * n,
        "reward": 1.0,
        "n_valid": n,
        "worker": rank,
        "prompt_token_ids": list(req["prompt"]["prompt_ids"]),
    }
    fields.update(over)
    return wire.sample_done(Sample(**fields), rank)


def frames_of(msg: p.Message) -> list[bytes]:
    return p.encode(msg)


# --- content the protocol refuses on its own -------------------------------------------


@pytest.mark.parametrize(
    "value",
    [b"raw bytes", msgpack.ExtType(7, b"x"), [b"nested"], {"k": {"deeper": b"x"}}],
    ids=["bytes", "ext", "bytes-in-list", "bytes-in-map"],
)
def test_info_with_bytes_or_extension_types_is_refused_and_the_logs_stay_json(clock, value):
    c = running(clock, logging={"samples": True})
    (req,) = take_work(c, slots=1)
    msg = done(req, info={"x": value})
    before = c.messages.rejected["malformed"]
    c.on_frames(ident(2), frames_of(msg))
    assert c.messages.rejected["malformed"] == before + 1
    assert c.data.delivered_ids == {}
    json.dumps(c.reports.new_samples)  # what the server writes to samples.jsonl
    json.dumps(c.status())


def test_a_header_of_empty_arrays_is_refused_without_building_them():
    header = b"\xdd" + (1_000_000).to_bytes(4, "big") + b"\x90" * 1_000_000
    tracemalloc.start()
    with pytest.raises(p.ProtocolError, match="too many maps and arrays"):
        p.decode([header])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 16 << 20, f"decoding took {peak >> 20} MiB"


def test_an_unregistered_peer_is_refused_before_its_message_is_decoded(clock, monkeypatch):
    c = running(clock)
    decoded = []
    real = p.decode
    monkeypatch.setattr(p, "decode", lambda frames, **kw: decoded.append(1) or real(frames, **kw))
    big = p.encode(p.StatusReply(status={"pad": "x" * 100_000}))
    assert c.on_frames(b"stranger", big) == []
    assert c.on_frames(b"stranger", [*p.encode(p.StatusRequest()), b"blob"]) == []
    assert decoded == [] and c.messages.rejected["anonymous_too_large"] == 2
    # the CLI's requests and a Hello are small: they still get through
    (reply,) = c.on_frames(b"cli", p.encode(p.StatusRequest()))
    assert isinstance(reply[1], p.StatusReply)


# --- content only the run can judge ----------------------------------------------------


HOSTILE = {
    "negative_token": ({"token_ids": [1, -5, 2, 3]}, "token_out_of_vocabulary"),
    "token_past_vocab": ({"token_ids": [1, 2, 3, 100]}, "token_out_of_vocabulary"),
    "nan_logprob": ({"logprobs": [-0.5, math.nan, -0.5, -0.5]}, "bad_logprob"),
    "inf_logprob": ({"logprobs": [-0.5, -math.inf, -0.5, -0.5]}, "bad_logprob"),
    "positive_logprob": ({"logprobs": [-0.5, 3.0, -0.5, -0.5]}, "bad_logprob"),
    "too_long": ({"n": 62}, "too_long"),  # 3 prompt + 62 > max_seq_len 64
    "missing_prompt": ({"prompt_token_ids": []}, "missing_prompt"),
    "other_prompt": ({"prompt_token_ids": [5, 6, 8]}, "wrong_prompt"),
    "future_version": ({"versions": [(9, 0, 4)]}, "version_out_of_range"),
    "other_group": ({"group_id": 99}, "mismatched_ids"),
    "huge_reward": ({"reward": 1e308}, "reward_out_of_range"),
    # a MoE's routes on a run that takes none (a dense model here)
    "routes_unexpected": ({"routes": "moe"}, "routes_unexpected"),
}


def moe_routes(positions: int, first: int = 0, second: int = 1) -> bytes:
    from runtime.data.routes import ExpertRoutes

    ids = np.array([[[first, second]] * 2] * positions)  # 2 layers, top 2
    return ExpertRoutes.from_array(ids, experts=4).to_bytes()


@pytest.mark.parametrize(
    ("routes", "refused"),
    [
        (moe_routes(6), None),  # 3 prompt + 4 response tokens: 6 input positions
        (moe_routes(6, 0, 4), "invalid:bad_routes"),  # no expert 4 of 4
        (moe_routes(6, 2, 2), "invalid:bad_routes"),  # one expert twice for a position
        # the shape alone: refused by the protocol, before the run looks
        (moe_routes(5), "malformed"),  # a position short
        (b"RT\x01", "malformed"),
    ],
    ids=["good", "expert_past_the_model", "expert_twice", "short", "malformed"],
)
def test_routes_are_checked_against_the_model_the_run_trains(clock, routes, refused):
    c = running(clock)
    c.bounds = dataclasses.replace(c.bounds, routes=(2, 2, 4))  # MoE layers, top_k, experts
    (req,) = take_work(c, slots=1)
    c.on_frames(ident(2), frames_of(done(req, routes=routes)))
    assert (req["sample_id"] in c.data.delivered_ids) is (refused is None)
    if refused == "malformed":
        assert c.messages.rejected["malformed"] == 1
    elif refused is not None:
        assert c.data.rejected[refused] == 1


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_sample_the_run_could_not_have_produced_is_refused_and_its_request_requeued(clock, name):
    over, why = HOSTILE[name]
    if over.get("routes") == "moe":
        over = {"routes": moe_routes(6)}
    c = running(clock)
    (req,) = take_work(c, slots=1)
    c.on_frames(ident(2), frames_of(done(req, **over)))
    assert c.data.rejected[f"invalid:{why}"] == 1
    assert c.data.delivered_ids == {} and not list(c.data.buffer.samples())
    # still owed: back at the front of the queue, not outstanding at the liar
    assert c.data.dispatcher.pending[0].sample_id == req["sample_id"]
    assert req["sample_id"] not in c.data.dispatcher.outstanding
    assert c.data.ledger_problems() == []


@pytest.mark.parametrize("prompt", [[5, 6, True], "567"], ids=["bool_prompt", "prompt_as_text"])
def test_a_prompt_that_is_not_a_list_of_ints_is_refused_by_the_protocol(clock, prompt):
    # prompt_token_ids is a typed field of SampleDone: the decoder refuses it before rank 0
    # looks at the run (it used to travel in a free-form dict and be caught there).
    c = running(clock)
    (req,) = take_work(c, slots=1)
    c.on_frames(ident(2), frames_of(done(req, prompt_token_ids=prompt)))
    assert c.messages.rejected["malformed"] == 1
    assert c.data.delivered_ids == {} and not list(c.data.buffer.samples())
    assert c.data.ledger_problems() == []


def test_a_negative_version_span_is_refused_by_the_protocol():
    msg = done({"sample_id": 1, "group_id": 0, "prompt_id": 0, "prompt": {"prompt_ids": [1]}})
    frames = frames_of(msg)
    header = msgpack.unpackb(frames[0])
    header["sample"]["versions"] = [[-3, 0, 4]]
    with pytest.raises(p.ProtocolError, match="negative version"):
        p.decode([msgpack.packb(header), *frames[1:]])


def test_an_ack_list_past_the_id_budget_is_refused():
    with pytest.raises(p.ProtocolError, match="too many acked"):
        p.decode(frames_of(p.HeartbeatAck(step=1, policy_version=1, acked=[0] * 70_000)))


def test_a_good_sample_is_taken_and_acknowledged_on_the_next_heartbeat(clock):
    c = running(clock)
    (req,) = take_work(c, slots=1)
    c.on_frames(ident(2), frames_of(done(req)))
    assert req["sample_id"] in c.data.delivered_ids
    ack = c.handle(ident(2), beat(2))[0][1]
    assert ack.acked == [req["sample_id"]]
    assert c.handle(ident(2), beat(2))[0][1].acked == []  # each id once
    # sent again (the ack was lost): taken as a resend, acknowledged again, not a duplicate
    c.on_frames(ident(2), frames_of(done(req)))
    assert c.data.rejected["resent"] == 1 and c.data.ledger()["duplicated"] == 0
    assert c.handle(ident(2), beat(2))[0][1].acked == [req["sample_id"]]


def beat(rank: int, epoch: int = 0, role: str = "rollout") -> p.Heartbeat:
    return p.Heartbeat(
        rank=rank,
        role=role,
        state="idle",
        layout_epoch=epoch,
        rollout_active_s=0.0,
        rollout_busy_s=0.0,
        engine={},
    )


# --- who may report a step -------------------------------------------------------------


def test_a_rollout_rank_cannot_end_the_run_with_a_forged_step(clock):
    c = running(clock)
    forged = p.StepDone(rank=2, step=10**9, policy_version=10**9, batch_id=0, metrics={})
    assert c.handle(ident(2), forged) == []
    assert c.state == "RUNNING" and c.step == 0
    assert c.messages.rejected["step_not_from_leader"] == 1


def test_the_leader_reports_only_the_next_step_for_the_batch_in_flight(clock):
    c = running(clock)
    skip = p.StepDone(rank=0, step=5, policy_version=1, batch_id=0, metrics={})
    assert c.handle(ident(0), skip) == [] and c.messages.rejected["bad_step"] == 1
    no_batch = p.StepDone(rank=0, step=1, policy_version=1, batch_id=0, metrics={})
    assert c.handle(ident(0), no_batch) == [] and c.messages.rejected["unknown_batch"] == 1
    train_step(c, 1)
    assert c.step == 1 and c.reports.new_lines[-1]["ledger_ok"] is True
    # a report sent again after its ack was lost changes nothing
    again = p.StepDone(rank=0, step=1, policy_version=1, batch_id=0, metrics={})
    assert c.handle(ident(0), again) == [] and c.step == 1


def test_a_step_report_may_not_jump_the_policy_version(clock):
    c = running(clock)
    reqs = take_work(c, slots=4)
    for r in reqs:
        c.on_frames(ident(2), frames_of(done(r)))
    ((_, batch), *_) = c.handle(ident(0), p.BatchRequest(rank=0))
    assert isinstance(batch, p.Batch)
    jump = p.StepDone(rank=0, step=1, policy_version=50, batch_id=batch.batch_id, metrics={})
    assert c.handle(ident(0), jump) == [] and c.messages.rejected["bad_policy_version"] == 1


# --- dead ranks ------------------------------------------------------------------------


def test_a_rank_declared_dead_stays_dead_until_it_registers_again(clock):
    c = running(clock)
    clock.t += 16.0  # past heartbeat_timeout_s for everyone but the ones that beat
    for r in (0, 1, 3):
        c.handle(ident(r), beat(r, role="trainer" if r < 2 else "rollout"))
    c.tick()
    assert c.workers[2].state == "dead"
    assert c.handle(ident(2), beat(2)) == []
    assert c.workers[2].state == "dead" and c.messages.rejected["dead_sender"] == 1
    # registering again is the way back
    (welcome,) = c.handle(ident(2), p.Hello(rank=2, world_size=4, node="n", pid=999))
    assert isinstance(welcome[1], p.Welcome) and c.workers[2].state == "starting"


# --- nothing vanishes ------------------------------------------------------------------


def test_work_that_could_not_be_delivered_is_requeued_at_once(clock):
    c = running(clock)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=2))
    ids = [r["sample_id"] for r in work.requests]
    c.undelivered(ident(2), work)
    assert [r.sample_id for r in list(c.data.dispatcher.pending)[:2]] == ids
    assert c.data.dispatcher.requeue_reasons["undelivered"] == 2
    assert c.status()["control"]["undeliverable"] == {"work": 1}
    assert c.data.ledger_problems() == []


def test_requests_out_too_long_are_requeued_with_a_reason(clock):
    c = running(clock, control={"request_timeout_s": 60.0, "heartbeat_timeout_s": 1000.0})
    ids = [r["sample_id"] for r in take_work(c, slots=2)]
    clock.t += 30.0
    c.tick()
    assert set(ids) <= set(c.data.dispatcher.outstanding)
    clock.t += 31.0
    c.tick()
    assert not set(ids) & set(c.data.dispatcher.outstanding)
    assert c.data.dispatcher.requeue_reasons["timeout"] == 2
    # the late result from the rank that had them is refused, not double-counted
    first = {"sample_id": ids[0], "group_id": 0, "prompt_id": 0}
    late = done({**first, "prompt": {"prompt_ids": [5, 6, 7]}})
    c.on_frames(ident(2), frames_of(late))
    assert c.data.delivered_ids == {} and c.data.ledger_problems() == []


def test_a_lost_batch_is_sent_again_when_the_leader_asks_without_it(clock):
    c = running(clock)
    for r in take_work(c, slots=4):
        c.on_frames(ident(2), frames_of(done(r)))
    ((_, batch), *_) = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
    assert isinstance(batch, p.Batch)
    # the Batch never arrived: the leader asks again, still without it
    out = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=-1))
    assert [m for to, m in out if to == ident(0)] == [batch] and c.trainer_link.resent == 1
    # it trained it but its StepDone was lost: wait for the report it sends again
    ((_, wait),) = c.handle(ident(0), p.BatchRequest(rank=0, last_batch_id=batch.batch_id))
    assert isinstance(wait, p.BatchWait) and wait.reason == "step report pending"
    report = p.StepDone(rank=0, step=1, policy_version=1, batch_id=batch.batch_id, metrics={})
    c.handle(ident(0), report)
    assert c.step == 1 and c.batch_in_flight is None


def test_a_batch_in_training_too_long_fails_the_run_with_the_reason(clock):
    c = running(clock, control={"step_timeout_s": 100.0, "heartbeat_timeout_s": 1000.0})
    for r in take_work(c, slots=4):
        c.on_frames(ident(2), frames_of(done(r)))
    ((_, batch), *_) = c.handle(ident(0), p.BatchRequest(rank=0))
    clock.t += 101.0
    c.tick()
    assert c.state == "FAILED"
    why = (
        f"no step report for batch {batch.batch_id} within 100 s (control.step_timeout_s) "
        "from the trainer leader (trainer ranks [0, 1])"
    )
    assert c.reason == why


def test_a_lost_role_switch_report_is_made_good_by_the_next_heartbeat(clock):
    c = running(clock)
    c.handle(b"cli", p.RebalanceRequest(rollout=1, trainer=3))
    assert c.status()["layout"]["switching"]
    for r in (0, 1, 3):
        role = "trainer" if r < 3 else "rollout"
        c.handle(ident(r), p.RoleSwitchDone(rank=r, role=role, layout_epoch=1, duration_s=0.1))
    assert c.status()["layout"]["switching"]  # rank 2's report was lost
    c.handle(ident(2), beat(2, epoch=1, role="trainer"))
    assert not c.status()["layout"]["switching"]


def test_acks_never_exceed_what_one_message_may_carry(clock):
    c = running(clock)
    c.workers[2].to_ack = list(range(p.MAX_IDS + 10))
    first = c.handle(ident(2), beat(2))[0][1]
    p.decode(p.encode(first))  # the rank can read it
    assert len(first.acked) == p.MAX_IDS
    assert c.handle(ident(2), beat(2))[0][1].acked == list(range(p.MAX_IDS, p.MAX_IDS + 10))


def test_a_trainer_replica_that_missed_its_batch_gets_it_again(clock):
    c = running(clock, resources={"gpus_per_node": 4, "initial_ratio": "1:3"})
    for r in take_work(c, rank=3, slots=4):
        c.on_frames(ident(3), frames_of(done(r, rank=3)))
    out = c.handle(ident(0), p.BatchRequest(rank=0))
    batch = out[0][1]
    assert isinstance(batch, p.Batch) and {to for to, _ in out} == {ident(0), ident(1), ident(2)}
    c.undelivered(ident(2), batch)  # rank 2's copy found no pipe (or a full queue)
    again = [(to, m) for to, m in c.tick() if isinstance(m, p.Batch)]
    assert again == [(ident(2), batch)]
    assert [m for _, m in c.tick() if isinstance(m, p.Batch)] == []  # once per failure


def test_a_trainer_replica_without_a_pipe_gets_its_batch_less_and_less_often(clock):
    """A dead replica has no pipe until its heartbeat timeout: its copy is not rebuilt and
    resent at every tick meanwhile (before: every 10 ms tick, 2000 in these 20 s)."""
    control = {"heartbeat_timeout_s": 1000.0, "step_timeout_s": 1000.0}
    c = running(clock, resources={"gpus_per_node": 4, "initial_ratio": "1:3"}, control=control)
    for r in take_work(c, rank=3, slots=4):
        c.on_frames(ident(3), frames_of(done(r, rank=3)))
    batch = c.handle(ident(0), p.BatchRequest(rank=0))[0][1]
    c.undelivered(ident(2), batch)
    start, sent_at = clock.t, []
    for _ in range(2000):  # 20 s of 10 ms ticks; every copy to rank 2 finds no pipe
        clock.t += 0.01
        for to, m in c.tick():
            if isinstance(m, p.Batch):
                assert to == ident(2) and m == batch
                sent_at.append(clock.t)
                c.undelivered(to, m)
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert sent_at[0] - start < 0.02  # the first again at once: a full queue clears soon
    assert max(gaps) <= 1.0 + 0.011 and 15 <= len(sent_at) <= 30
    clock.t += 1.0  # it has a pipe again: the copy goes, once
    assert [m for _, m in c.tick() if isinstance(m, p.Batch)] == [batch]
    assert [m for _, m in c.tick() if isinstance(m, p.Batch)] == []


def test_requeue_reasons_survive_a_checkpoint(clock):
    c = running(clock)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=2))
    c.undelivered(ident(2), work)
    take_work(c, slots=1)  # out at the checkpoint: requeued on restore
    state = c.data.dispatcher.state_dict()
    fresh = running(Clock())
    fresh.data.dispatcher.load_state_dict(state)
    reasons = fresh.data.dispatcher.requeue_reasons
    assert reasons["undelivered"] == 2 and reasons["out_at_checkpoint"] == 1
    d = fresh.data.dispatcher
    assert d.transitions["running->pending"] == sum(reasons.values())


def test_the_ledger_identity_is_checked_every_step(clock):
    c = running(clock)
    train_step(c, 1)
    assert c.reports.new_lines[-1]["ledger_ok"] is True
    # a request that silently vanishes (what a lost Work did before)
    sid = take_work(c, slots=1)[0]["sample_id"]
    del c.data.dispatcher.outstanding[sid]
    train_step(c, 2)
    line = c.reports.new_lines[-1]
    assert line["ledger_ok"] is False and "dispatched" in line["ledger_problems"][0]
    assert c.status()["ledger_violations"][-1]["step"] == 2
    assert c.summary()["ledger_violations"] == 1
