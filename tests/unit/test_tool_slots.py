"""An agent episode waiting on a tool call holds no generation slot: rank 0 counts only a
rank's generating episodes against its concurrency cap (``WorkRequest.in_tools``, clamped
to what rank 0 has running there), and the simulator's agent ranks say so too."""

import itertools

import pytest

from runtime.config.layout import Role
from runtime.sim import cluster as sim_cluster
from runtime.sim.parameters import load_profiles
from runtime.sim.run import plan
from runtime.transport import protocol as p
from tests.unit.test_coordinator import Clock, beat, ident, make, register_all
from tests.unit.test_sim import small

CAP = 4


def coordinator(**scheduler):
    prompts = ({"prompt_ids": [1] * 10} for _ in itertools.count())
    clock = Clock()
    c = make(
        clock,
        prompts=prompts,
        scheduler={"max_concurrency": CAP, **scheduler},
        algorithm={"group_size": 2},
        train={"steps": 5, "batch_size": 64},
    )
    register_all(c)
    assert c.layout.role_of(2) == Role.ROLLOUT
    return c, clock


def ask(c, slots: int, in_tools: int) -> int:
    ((_, work),) = c.handle(ident(2), p.WorkRequest(rank=2, slots=slots, in_tools=in_tools))
    return len(work.requests)


def test_a_rank_whose_episodes_wait_in_a_slow_tool_still_receives_work_up_to_its_cap():
    c, _ = coordinator()
    assert ask(c, 16, 0) == CAP  # the cap, not the 16 asked for
    # all four now wait on a slow sandbox: none generates, the rank may run CAP more
    assert ask(c, 16, CAP) == CAP and c.data.dispatcher.running_at(2) == 2 * CAP
    # the first four still in the tool, the next four generating: the cap is reached
    blocked = c.data.dispatcher.blocked["concurrency_cap"]
    assert ask(c, 16, CAP) == 0 and c.data.dispatcher.blocked["concurrency_cap"] > blocked
    # three of them are done with the tool: the rank generates 7 of its 8, over its cap
    assert ask(c, 16, 1) == 0
    assert c.messages.rejected["in_tools_over_running"] == 0


def test_a_rank_claiming_more_in_tools_than_it_runs_gets_no_more_than_its_cap():
    c, _ = coordinator()
    assert ask(c, 16, 1000) == CAP  # it runs nothing here: nothing of it can be in a tool
    assert c.messages.rejected["in_tools_over_running"] == 1
    # running CAP, claiming 1000 in tools: taken as CAP, so at most CAP more, like an
    # honest rank whose every episode waits in a tool; never 1000 + CAP
    assert ask(c, 16, 1000) == CAP and c.data.dispatcher.running_at(2) == 2 * CAP
    assert c.messages.rejected["in_tools_over_running"] == 2


def test_the_empty_share_of_a_ranks_slots_does_not_count_its_episodes_in_tools():
    c, _ = coordinator()
    ask(c, CAP, 0)
    # CAP running, all in a tool: the engine's 2 x CAP slots are all free; CAP granted
    # leaves half of them empty (counting the episodes in tools as slots said a third)
    assert ask(c, 2 * CAP, CAP) == CAP
    rank = c.idle._ranks[2]
    assert rank.state == "concurrency_cap" and rank.unused == pytest.approx(0.5)


def test_with_token_admission_a_tool_waiting_rank_still_receives_work_up_to_its_cap():
    c, clock = coordinator()
    # the rank's engine reported its KV budget: the token router admits each request
    beat(c, 2, clock, kv_util=0.1, kv_tokens=1_000_000, running=0, waiting=0, preemptions=0)
    assert 2 in c.generation.router.workers
    assert ask(c, 16, 0) == CAP
    assert ask(c, 16, CAP) == CAP and c.data.dispatcher.running_at(2) == 2 * CAP


def test_simulated_agent_ranks_report_the_requests_between_turns_and_get_work_past_the_cap():
    # A cap well under what the replicas could run: the APPS agent spends seconds in the
    # sandbox between turns.
    cap = 8
    cfg = plan(small("apps_coding.yaml", 4, f"scheduler.max_concurrency={cap}"), 32).cfg
    profiles = load_profiles()
    sim = sim_cluster.SimCluster(
        cfg, profiles.model("qwen3-8b"), profiles.workload("apps_agent"), seed=1
    )
    pool, dispatcher = sim.pool, sim.coord.data.dispatcher
    # An oracle of its own: the requests between turns, from the tool calls the pool
    # schedules and resumes (not from the count the pool computes).
    in_tool: dict[int, set[int]] = {}
    turn_finished, next_turn = pool._turn_finished, pool._next_turn

    def on_turn_finished(leader: int, sid: int) -> None:
        turn_finished(leader, sid)
        if sid in pool.loops[leader].running:  # not its last turn: a tool call now
            in_tool.setdefault(leader, set()).add(sid)

    def on_next_turn(leader: int, sid: int) -> None:
        in_tool.get(leader, set()).discard(sid)
        next_turn(leader, sid)

    pool._turn_finished, pool._next_turn = on_turn_finished, on_next_turn
    asked: list[tuple[int, int, int]] = []  # (in_tools reported, oracle, rank 0's running)
    send = sim._send

    def spy(rank: int, msg: p.Message) -> bool:
        if isinstance(msg, p.WorkRequest):
            expected = len(in_tool.get(rank, set()) & set(pool.loops[rank].running))
            asked.append((msg.in_tools, expected, dispatcher.running_at(rank)))
        return send(rank, msg)

    for leader, loop in pool.loops.items():
        loop.attach(lambda m, r=leader: spy(r, m), leader)
    original_add = pool.add

    def add(leader: int, *, frozen_for: float = 0.0) -> None:
        original_add(leader, frozen_for=frozen_for)
        pool.loops[leader].attach(lambda m, r=leader: spy(r, m), leader)

    pool.add = add
    peak = 0
    finished = dispatcher.finished

    def count_peak(sample_id: int, worker: int):
        nonlocal peak
        peak = max(peak, dispatcher.running_at(worker))
        return finished(sample_id, worker)

    dispatcher.finished = count_peak
    res = sim.run()
    assert res.summary["steps"] == 4 and res.summary["samples"]["lost"] == 0
    assert all(reported == expected for reported, expected, _ in asked)
    assert any(reported > 0 for reported, _, _ in asked)
    assert all(reported <= running for reported, _, running in asked)
    assert sim.coord.messages.rejected["in_tools_over_running"] == 0
    # episodes in the sandbox left room under the cap: ranks ran more than it at once
    assert peak > cap
