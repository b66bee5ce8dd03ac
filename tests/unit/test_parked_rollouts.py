"""Parked rollouts kept across a stop: what a rollout rank reports (``Parked``), what rank 0
keeps of it in the checkpoint and hands out again after the resume, and how an agent
continues it (its finished turns replayed, the cut one continued from its last token)."""

from __future__ import annotations

import asyncio
import math

import pytest

from runtime.config.recipe import build_config
from runtime.control.checkpoints import PARK_TIMEOUT_S
from runtime.control.dispatcher import Dispatcher
from runtime.data.sample import ParkedRollout, Request, Turn
from runtime.engines.synthetic import SyntheticRollout
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.workloads.agents.base import AgentEnv, Generation
from runtime.workloads.agents.settings import AgentEnvConfig
from tests.unit.test_checkpoint import Saves, coordinator, one_step
from tests.unit.test_coordinator import Clock, ident, register_all
from tests.unit.test_data_plane import traj

# --- the wire ------------------------------------------------------------------------


def parked_rollout(n: int = 4, version: int = 0, turns: list[Turn] | None = None) -> ParkedRollout:
    return ParkedRollout(
        token_ids=list(range(1, n + 1)),
        logprobs=[-0.5] * n,
        loss_mask=[1] * n,
        versions=[(version, 0, n)],
        turns=turns or [Turn(0, n, "abort", None)],
    )


def encoded_parked(entry: dict, n: int = 4) -> list[bytes]:
    msg = p.Parked(
        rank=2, rollouts=[entry], blobs=(b"\x01\x00\x00\x00" * n, b"\x00\x00\x00\xbf" * n)
    )
    return p.encode(msg)


GOOD = {
    "sample_id": 3,
    "versions": [[0, 0, 4]],
    "turns": [
        {"start": 0, "end": 2, "finish": "stop", "stop": "</code>"},
        {"start": 3, "end": 4, "finish": "abort", "stop": None},
    ],
}


def test_a_parked_rollout_with_turns_over_the_model_tokens_is_accepted():
    msg = p.decode(encoded_parked(GOOD))
    (got,) = wire.parked(msg).values()
    assert got.turns == [Turn(0, 2, "stop", "</code>"), Turn(3, 4, "abort", None)]
    assert got.loss_mask == [1, 1, 0, 1]  # the turns' tokens: the mask is not sent


@pytest.mark.parametrize(
    "over, reason",
    [
        ({"loss_mask": [1, 1, 1, 1]}, "wrong type"),  # a field nobody reads
        (
            {
                "turns": [
                    {"start": 0, "end": 2, "finish": "abort", "stop": None},
                    {"start": 3, "end": 4, "finish": "stop", "stop": None},
                ]
            },
            "only the last turn",
        ),
        (
            {
                "turns": [
                    {"start": 3, "end": 4, "finish": "stop", "stop": None},
                    {"start": 0, "end": 2, "finish": "stop", "stop": None},
                ]
            },
            "out of order",
        ),
        (
            {"turns": [{"start": 0, "end": 9, "finish": "stop", "stop": None}]},
            "outside the tokens",
        ),
        (
            {
                "turns": [
                    {"start": 0, "end": 2, "finish": "won", "stop": None},
                    {"start": 3, "end": 4, "finish": "abort", "stop": None},
                ]
            },
            "bad turn",
        ),
        ({"turns": []}, "no model turns"),
        ({"versions": [[0, 0, 3]]}, "spans do not cover"),
    ],
)
def test_a_parked_rollout_that_cannot_be_a_generation_is_refused(over, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(encoded_parked({**GOOD, **over}))


def test_long_parked_rollouts_of_many_requests_fit_one_report_and_one_work():
    # 300 requests cut off 4,000 tokens in: a per-token mask in the header was 1.2 MB,
    # over the 1 MiB limit, and the whole report (or the resumed Work) was refused.
    long = {sid: parked_rollout(4000) for sid in range(300)}
    got = wire.parked(p.decode(p.encode(wire.parked_message(2, long))))
    assert len(got) == 300 and got[7].loss_mask == [1] * 4000
    work = wire.work_message([Request(s, 0, 0, {}, resume=r) for s, r in long.items()], 0)
    assert len(wire.requests(p.decode(p.encode(work)))) == 300


def test_a_parked_rollout_in_work_must_be_its_requests_and_have_its_frames():
    ok = wire.work_message([Request(3, 0, 0, {}, resume=parked_rollout())], 0)
    assert wire.requests(p.decode(p.encode(ok)))[0].resume == wire.requests(ok)[0].resume
    other = {**ok.requests[0], "resume": {**ok.requests[0]["resume"], "sample_id": 9}}
    with pytest.raises(p.ProtocolError, match="another request"):
        p.decode(p.encode(p.Work(policy_version=0, requests=[other], blobs=ok.blobs)))
    with pytest.raises(p.ProtocolError, match="frames"):
        p.decode(p.encode(p.Work(policy_version=0, requests=ok.requests, blobs=())))
    with pytest.raises(p.ProtocolError, match="frames"):  # frames nobody asked for
        p.decode(p.encode(p.Work(policy_version=0, requests=[], blobs=ok.blobs)))


# --- rank 0 ----------------------------------------------------------------------------


def stopping_coordinator(clock: Clock):
    """A run two steps in with requests out at rank 2, asked to stop: the checkpoint has
    gone to the trainers and ``Park`` to the rollout drivers."""
    saves = Saves()
    c = coordinator(clock, saves, checkpoint_every=0)
    register_all(c)
    one_step(c, clock)
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=3))
    out = c.request_stop("SIGTERM")
    parked_to = sorted(to for to, m in out if isinstance(m, p.Park))
    assert parked_to == [ident(2), ident(3)]
    return c, saves, [r["sample_id"] for r in work.requests]


def test_a_stop_keeps_what_was_generated_and_the_resumed_run_continues_it():
    clock = Clock()
    c, saves, out_at_2 = stopping_coordinator(clock)
    assert len(out_at_2) == 3
    # no more work while the stop takes what is in flight
    ((_, none),) = c.handle(ident(3), p.WorkRequest(rank=3, slots=4))
    assert none.requests == []
    kept, stale, _left = out_at_2
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=1, ok=True, error=""))
    assert saves.calls == []
    report = {kept: parked_rollout(5), stale: parked_rollout(3, version=7), 999: parked_rollout(2)}
    assert c.handle(ident(2), wire.parked_message(2, report)) == []
    out = c.handle(ident(3), p.Parked(rank=3, rollouts=[]))
    assert any(isinstance(m, p.Stop) for _, m in out)
    parked = c.data.dispatcher.parked
    # a version the run never had, and a request rank 2 was not running, are refused
    assert parked["kept"] == 1 and parked["kept_tokens"] == 5
    assert parked["refused_version_out_of_range"] == 1
    assert parked["refused_not_outstanding_there"] == 1
    ((_, _, state),) = saves.calls
    assert c.checkpoints[-1]["parked_rollouts"] == {"requests": 1, "tokens": 5}

    fresh = coordinator(Clock(), Saves(), checkpoint_every=0)
    fresh.load_state_dict(state, source="step")
    register_all(fresh)
    ((_, work),) = fresh.handle(ident(2), p.WorkRequest(rank=2, slots=8))
    got = {r.sample_id: r for r in wire.requests(p.decode(p.encode(work)))}
    assert got[kept].resume is not None and got[kept].resume.token_ids == [1, 2, 3, 4, 5]
    assert got[stale].resume is None  # saved from its prompt, as before
    # the sample that comes back starts with the parked rollout: its tokens were continued
    t = traj(got[kept], fresh.policy_version, worker=2)
    t.token_ids = [1, 2, 3, 4, 5, 6, 7]
    t.logprobs, t.n_valid = [-1.0] * 7, 7
    t.versions = [(0, 0, 5), (fresh.policy_version, 5, 7)]  # the spans from before the stop
    fresh.handle(ident(2), wire.sample_done(t, 2))
    regen = traj(got[stale], fresh.policy_version, worker=2)
    fresh.handle(ident(2), wire.sample_done(regen, 2))
    status = fresh.status()["buffer"]["parked_rollouts"]
    assert status["continued_tokens"] == 5 and status["regenerated_tokens"] == 0
    assert status["kept"] == 1  # carried over from the attempt that saved it


def test_tokens_are_continued_only_with_the_versions_that_generated_them():
    d = Dispatcher(
        prompts=iter(()), group_size=1, B_max=1, delta=1, batch_size=1, clock=lambda: 0.0
    )
    request = Request(1, 1, 0, [9], 0.0, 0, parked_rollout(4, version=2))
    for versions, continued in (
        ([(2, 0, 4), (3, 4, 6)], 4),
        ([(2, 0, 6)], 4),  # one span merged over the resumed part
        ([(3, 0, 6)], 0),  # the same tokens under the new policy: generated again
        ([(2, 0, 2), (3, 2, 6)], 2),
    ):
        d.parked.clear()
        t = traj(request, 3, worker=2)
        t.token_ids, t.versions = [1, 2, 3, 4, 5, 6], versions
        d.resumed(request, t)
        assert d.parked["continued_tokens"] == continued, versions
        assert d.parked["regenerated_tokens"] == 4 - continued


def test_a_parked_rollout_of_a_rank_lost_after_its_report_is_kept_and_counted():
    from runtime.transport.states import WorkerState

    c, saves, out_at_2 = stopping_coordinator(Clock())
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=1, ok=True, error=""))
    c.handle(ident(2), wire.parked_message(2, {out_at_2[0]: parked_rollout(5)}))
    lost = c.workers[2]
    lost.state = WorkerState.DEAD
    c.lose_rank(lost, "killed")  # its requests go back to the queue, the parked rollout with them
    c.handle(ident(3), p.Parked(rank=3, rollouts=[]))
    assert c.checkpoints[-1]["parked_rollouts"] == {"requests": 1, "tokens": 5}
    ((_, _, state),) = saves.calls
    pending = state["data"]["dispatcher"]["pending"]
    assert [d["sample_id"] for d in pending if d.get("resume")] == [out_at_2[0]]


def test_a_driver_that_never_reports_holds_the_stop_for_a_bounded_time():
    clock = Clock()
    c, saves, _ = stopping_coordinator(clock)
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=1, ok=True, error=""))
    c.handle(ident(3), p.Parked(rank=3, rollouts=[]))
    waits = c.status()["waits"]
    assert any(w["from"] == [2] and "parked rollouts" in w["what"] for w in waits), waits
    clock.t += PARK_TIMEOUT_S / 2
    for w in c.workers.values():
        w.last_seen = clock.t
    assert not any(isinstance(m, p.Stop) for _, m in c.tick())
    clock.t += PARK_TIMEOUT_S
    for w in c.workers.values():
        w.last_seen = clock.t
    out = c.tick()
    assert any(isinstance(m, p.Stop) for _, m in out) and len(saves.calls) == 1
    assert c.data.dispatcher.parked["ranks_not_reported"] == 1
    # its requests are saved from their prompts
    assert all(d.get("resume") is None for d in saves.calls[0][2]["data"]["dispatcher"]["pending"])


def test_a_saved_trainer_half_is_not_timed_out_while_the_drivers_report():
    clock = Clock()
    c, saves, out_at_2 = stopping_coordinator(clock)
    object.__setattr__(c.cfg.control, "checkpoint_timeout_s", 1.0)  # under PARK_TIMEOUT_S
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=1, ok=True, error=""))
    c.handle(ident(3), p.Parked(rank=3, rollouts=[]))
    clock.t += PARK_TIMEOUT_S / 2  # past the checkpoint timeout, the trainer's half saved
    for w in c.workers.values():
        w.last_seen = clock.t
    c.tick()
    assert saves.calls == [] and c.checkpoints == []  # not recorded failed
    c.handle(ident(2), wire.parked_message(2, {out_at_2[0]: parked_rollout(5)}))
    assert len(saves.calls) == 1 and c.checkpoints[-1]["ok"]


def test_a_parked_rollout_with_a_turn_over_the_turn_budget_is_refused():
    c, _, out_at_2 = stopping_coordinator(Clock())
    n = c.cfg.workload.max_response_tokens + 1
    c.handle(ident(2), wire.parked_message(2, {out_at_2[0]: parked_rollout(n)}))
    assert c.data.dispatcher.parked["refused_turn_too_long"] == 1


def test_a_refused_sample_of_a_continued_request_starts_again_from_the_prompt():
    d = Dispatcher(
        prompts=iter(()), group_size=1, B_max=4, delta=1, batch_size=1, clock=lambda: 0.0
    )
    for sid, why in ((0, "invalid:token_out_of_vocab"), (1, "undelivered")):
        d.outstanding[sid] = (Request(sid, 0, 0, {"prompt_ids": [1]}, 0.0, 0, parked_rollout(3)), 2)
        d._at_worker[2] += 1
        assert d.requeue(sid, 2, why)
    refused, lost_on_the_way = d.pending[1], d.pending[0]
    assert refused.resume is None and d.parked["dropped_after_refusal"] == 1
    assert lost_on_the_way.resume is not None  # still continued when handed out again


def test_a_dispatcher_state_saved_before_the_rename_loads_its_counts():
    # Checkpoints written before "partials" became "parked" must still resume, counts
    # included (they carry over to the resumed attempt's status).
    def dispatcher() -> Dispatcher:
        return Dispatcher(
            prompts=iter(()), group_size=1, B_max=1, delta=1, batch_size=1, clock=lambda: 0.0
        )

    saved = dispatcher()
    saved.parked.update({"kept": 2, "kept_tokens": 9, "ranks_not_reported": 1})
    state = saved.state_dict()
    assert state["parked"] == {"kept": 2, "kept_tokens": 9, "ranks_not_reported": 1}
    old = {k: v for k, v in state.items() if k != "parked"} | {"partials": state["parked"]}
    for s in (state, old):
        fresh = dispatcher()
        fresh.load_state_dict(s)
        assert fresh.parked == saved.parked
        assert fresh.stats()["parked_rollouts"] == dict(saved.parked)


def test_an_unasked_report_is_refused():
    clock = Clock()
    c = coordinator(clock, Saves(), checkpoint_every=0)
    register_all(c)
    c.handle(ident(2), wire.parked_message(2, {0: parked_rollout()}))
    assert c.messages.rejected["unexpected_parked"] == 1 and not c.data.dispatcher.parked


# --- an agent continues a parked rollout -----------------------------------------------


class Engine:
    """Records what it is asked and answers with fixed tokens of version 5."""

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = list(answers)
        self.calls: list[tuple[list[int], int]] = []

    async def generate_turn(self, request_id, prompt_ids, max_tokens, stop) -> Generation:
        self.calls.append((list(prompt_ids), max_tokens))
        ids = self.answers.pop(0)[:max_tokens]
        return Generation(ids, [-0.1] * len(ids), [(5, 0, len(ids))], "stop", None)


class TwoTurns:
    """An agent with an environment turn between two model turns: ``feedback`` tokens."""

    def __init__(self, feedback: list[int]) -> None:
        self.feedback = feedback

    async def run(self, env, request_id, prompt):
        ep = env.episode(request_id, prompt)
        for turn in range(2):
            g = await env.generate(ep, f"{request_id}-t{turn}")
            if g is None or g.finish == "abort":
                return None
            ep.add_model(g)
            if turn == 0:
                ep.add_env(self.feedback)
        return ep


def env_with(engine: Engine, max_response_tokens: int = 10) -> AgentEnv:
    cfg = build_config({"workload": {"max_response_tokens": max_response_tokens}})
    return AgentEnv(
        AgentEnvConfig.from_config(cfg), codec=None, generator=engine, record=None, pool=None
    )


PROMPT = {"prompt_ids": [100, 101]}
# turn one (3 tokens, version 1), feedback [7, 7], turn two cut off after 2 tokens (version 2)
CUT = ParkedRollout(
    token_ids=[11, 12, 13, 7, 7, 21, 22],
    logprobs=[-1.0, -1.0, -1.0, 0.0, 0.0, -2.0, -2.0],
    loss_mask=[1, 1, 1, 0, 0, 1, 1],
    versions=[(1, 0, 5), (2, 5, 7)],
    turns=[Turn(0, 3, "stop", None), Turn(5, 7, "abort", None)],
)


def test_a_resumed_episode_replays_its_turns_and_continues_the_cut_one():
    engine = Engine([[23, 24]])
    env = env_with(engine)
    env.resume("s1", CUT)
    ep = asyncio.run(TwoTurns([7, 7]).run(env, "s1", PROMPT))
    # one engine call: the cut turn's rest, on the whole context, within the turn's budget
    assert engine.calls == [([100, 101, 11, 12, 13, 7, 7, 21, 22], 10 - 2)]
    assert ep.token_ids == [11, 12, 13, 7, 7, 21, 22, 23, 24]
    assert ep.logprobs[:7] == CUT.logprobs and ep.loss_mask == [1, 1, 1, 0, 0, 1, 1, 1, 1]
    assert ep.spans == [(1, 0, 5), (2, 5, 7), (5, 7, 9)]
    assert ep.info["resumed_tokens"] == 5 and "resume_diverged_at" not in ep.info


def test_where_the_environment_answers_otherwise_the_rest_is_generated_anew():
    engine = Engine([[31, 32, 33]])
    env = env_with(engine)
    env.resume("s1", CUT)
    ep = asyncio.run(TwoTurns([8]).run(env, "s1", PROMPT))  # other feedback than before
    # the second turn was generated on another context: never trained on this one
    assert engine.calls == [([100, 101, 11, 12, 13, 8], 10)]
    assert ep.token_ids == [11, 12, 13, 8, 31, 32, 33]
    assert ep.info["resumed_tokens"] == 3 and ep.info["resume_diverged_at"] == 4


def test_a_replayed_turn_over_the_turn_budget_is_generated_anew():
    engine = Engine([[41, 42]])
    env = env_with(engine, max_response_tokens=2)  # turn one of CUT has 3 tokens
    env.resume("s1", CUT)
    g = asyncio.run(env.generate(env.episode("s1", PROMPT), "s1-t0"))
    assert g.tokens == [41, 42] and engine.calls == [([100, 101], 2)]
    assert env.episodes["s1"].info["resume_diverged_at"] == 0


def test_a_stop_during_the_replay_keeps_the_whole_parked_rollout():
    env = env_with(Engine([]))
    env.resume("s1", CUT)
    ep = env.episode("s1", PROMPT)
    first = asyncio.run(env.generate(ep, "s1-t0"))
    ep.add_model(first)
    ep.add_env([7, 7])
    env.parking = True  # the stop lands before the cut turn is replayed
    assert asyncio.run(env.generate(ep, "s1-t1")).finish == "abort"
    assert ep.parked_rollout() == CUT  # its cut turn's tokens too


def test_a_cut_episode_gives_back_its_turns_and_the_cut_off_tokens():
    class Cutting(Engine):
        async def generate_turn(self, request_id, prompt_ids, max_tokens, stop):
            g = await super().generate_turn(request_id, prompt_ids, max_tokens, stop)
            if len(self.calls) == 2:  # the second turn is cut off by the stop
                return Generation(g.tokens, g.logprobs, g.spans, "abort", None)
            return g

    env = env_with(Cutting([[1, 2], [3, 4, 5]]))
    ep = asyncio.run(TwoTurns([9]).run(env, "s1", PROMPT))
    assert ep is None
    got = env.episodes["s1"].parked_rollout()
    assert got.token_ids == [1, 2, 9, 3, 4, 5] and got.loss_mask == [1, 1, 0, 1, 1, 1]
    assert got.turns == [Turn(0, 2, "stop", None), Turn(3, 6, "abort", None)]
    assert got.versions == [(5, 0, 3), (5, 3, 6)]
    # and it is a parked rollout the wire accepts
    p.decode(p.encode(wire.parked_message(2, {1: got})))


def test_a_parked_env_starts_no_generation():
    engine = Engine([[1]])
    env = env_with(engine)
    env.parking = True
    assert asyncio.run(TwoTurns([9]).run(env, "s1", PROMPT)) is None and engine.calls == []


# --- the synthetic engine -------------------------------------------------------------


def test_the_synthetic_engine_reports_parked_rollouts_and_continues_them(monkeypatch):
    cfg = build_config(
        {
            "resources": {"gpus_per_node": 2, "initial_ratio": "1:1", "device": "cpu"},
            "engine": {"rollout": "synthetic", "trainer": "synthetic", "synthetic_token_s": 0.01},
            "data": {"train": "embedded:synthetic"},
        }
    )
    side = SyntheticRollout(cfg, 1)
    sent: list[p.Message] = []
    side.attach(sent.append, 1)
    now = [1000.0]
    monkeypatch.setattr("runtime.engines.synthetic.time.monotonic", lambda: now[0])
    monkeypatch.setattr("runtime.rank.rollout_loop.time.monotonic", lambda: now[0])
    side.on_message(wire.work_message([Request(4, 1, 1, {"success_rate": 1.0})], 0))
    g = side.loop.running[4]
    g.n_tokens = max(g.n_tokens, 50)
    g.done_at = g.started + g.n_tokens * side.token_time_s
    now[0] += 0.205  # 20 tokens
    side.on_message(p.Park(step=3))
    (report,) = [m for m in sent if isinstance(m, p.Parked)]
    (cut,) = wire.parked(p.decode(p.encode(report))).values()
    assert len(cut) == 20 and cut.turns == [Turn(0, 20, "abort", None)]
    side.on_message(wire.work_message([Request(5, 1, 1, {})], 0))
    assert side.loop.running == {}  # parked: nothing starts again

    fresh = SyntheticRollout(cfg, 1)
    out: list[p.Message] = []
    fresh.attach(out.append, 1)
    fresh.on_message(wire.work_message([Request(4, 1, 1, {}, resume=cut)], 0))
    now[0] += 1e4
    fresh.step()
    done = next(m for m in out if isinstance(m, p.SampleDone))
    s = wire.sample(done)
    assert list(s.token_ids[:20]) == [int(x) for x in cut.token_ids]
    assert all(
        math.isclose(a, b, rel_tol=1e-6) for a, b in zip(s.logprobs[:20], cut.logprobs, strict=True)
    )


def synthetic_rollout_side(monkeypatch) -> tuple[SyntheticRollout, list[p.Message], list[float]]:
    """Rank 1's synthetic rollout side at 10 ms a token on a clock the test moves: the
    side, what it sends, and the clock (``now[0]``)."""
    cfg = build_config(
        {
            "resources": {"gpus_per_node": 2, "initial_ratio": "1:1", "device": "cpu"},
            "engine": {"rollout": "synthetic", "trainer": "synthetic", "synthetic_token_s": 0.01},
            "data": {"train": "embedded:synthetic"},
        }
    )
    now = [1000.0]
    monkeypatch.setattr("runtime.engines.synthetic.time.monotonic", lambda: now[0])
    monkeypatch.setattr("runtime.rank.rollout_loop.time.monotonic", lambda: now[0])
    side = SyntheticRollout(cfg, 1)
    sent: list[p.Message] = []
    side.attach(sent.append, 1)
    return side, sent, now


def test_a_synthetic_stop_sends_what_finished_and_parks_the_rest(monkeypatch):
    side, sent, now = synthetic_rollout_side(monkeypatch)
    head = parked_rollout(20, version=0)
    side.on_message(wire.work_message([Request(4, 1, 1, {}), Request(6, 1, 1, {}, resume=head)], 0))
    finished, resumed = side.loop.running[4], side.loop.running[6]
    resumed.n_tokens = 50  # 20 before the stop, 30 to go
    resumed.done_at = resumed.started + 30 * side.token_time_s
    now[0] = resumed.started + 0.255  # 6 is 25 tokens further
    finished.done_at = now[0] - 0.001  # 4 is done, not yet reaped
    side.on_message(p.Park(step=3))
    samples = [m.sample_id for m in sent if isinstance(m, p.SampleDone)]
    (report,) = [m for m in sent if isinstance(m, p.Parked)]
    parked = wire.parked(p.decode(p.encode(report)))
    assert samples == [4] and set(parked) == {6}  # a finished one is a sample, not a parked rollout
    assert len(parked[6]) == 20 + 25 and parked[6].token_ids[:20] == head.token_ids
