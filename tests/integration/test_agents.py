"""The agent loops against a scripted engine, with the real sandbox and reward pool: the
multi-turn structure and its loss mask are checked token by token."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest

from runtime.config.schema import Config
from runtime.data.datasets import load_records
from runtime.workloads.agents import scoring
from runtime.workloads.agents.base import AgentEnv
from runtime.workloads.agents.code_agent import CodeAgent, feedback_text
from runtime.workloads.agents.pool import RewardPool
from runtime.workloads.agents.settings import AgentEnvConfig
from runtime.workloads.agents.single_turn import ArithAgent, SingleTurnAgent
from runtime.workloads.agents.tool_reasoning import ToolAgent
from tests.helpers import SHARED_DATA, needs_full_data
from tests.integration.agent_harness import ScriptedEngine, chat_codec, run_agent, segments

pytestmark = pytest.mark.skipif(not shutil.which("bwrap"), reason="bubblewrap not installed")


def config(kind: str, **workload) -> Config:
    cfg = Config()
    cfg.workload.kind = kind
    cfg.model.max_seq_len = 4096
    cfg.workload.max_response_tokens = 512
    for key, value in workload.items():
        setattr(cfg.workload, key, value)
    return cfg


MBPP_RECORD = {
    "tests": ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 5) == 5"],
}
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
RIGHT = "Fixed.\n```python\ndef add(a, b):\n    return a + b\n```"


def test_code_agent_feeds_failures_back_and_masks_them_token_by_token():
    codec = chat_codec()
    cfg = config("code_agent", max_turns=3, public_tests=1)
    engine = ScriptedEngine(codec, [WRONG, RIGHT])
    ep, _ = run_agent(CodeAgent(), cfg, engine, "Write add(a, b).", MBPP_RECORD)
    assert ep.reward == 1.0 and ep.info["turns"] == 2 and ep.info["public_passed_at"] == 2
    assert ep.info["hidden_passed"] == ep.info["hidden_total"] == 2  # tests after the public one
    # model turn 1 (mask 1) | feedback turn (mask 0) | model turn 2 (mask 1)
    (m1, t1), (m2, t2), (m3, t3) = segments(ep)
    assert (m1, m2, m3) == (1, 0, 1)
    assert t1 == [*codec.encode(WRONG), codec.eos_id]
    assert t3 == [*codec.encode(RIGHT), codec.eos_id]
    feedback = feedback_text(
        {
            "passed": 0,
            "total": 1,
            "failure": {
                "input": "assert add(1, 2) == 3",
                "expected": None,
                "got": "",
                "status": "error",
            },
        },
        None,
    )
    assert codec.decode(t2).startswith("\nuser\nYour program passed 0 of 1 public tests.")
    assert t2 == codec.user_turn_ids(
        codec.decode(t2)[len("\nuser\n") : -len("\nassistant\n")], closed=True
    )
    assert "AssertionError" in codec.decode(t2) and feedback.split("\n")[0] in codec.decode(t2)
    # the second turn saw the first turn and the feedback
    assert engine.contexts[1] == ep.prompt_ids + t1 + t2
    # behaviour log-probs: the model's, and 0 for environment tokens
    assert all(lp == -0.25 for lp, m in zip(ep.logprobs, ep.loss_mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.loss_mask, strict=True) if not m)
    assert ep.spans == [(3, 0, len(t1) + len(t2)), (3, len(t1) + len(t2), len(ep.token_ids))]


def test_code_agent_stops_after_max_turns_with_the_hidden_reward():
    codec = chat_codec()
    cfg = config("code_agent", max_turns=2, public_tests=1)
    ep, _ = run_agent(CodeAgent(), cfg, ScriptedEngine(codec, [WRONG, WRONG]), "add", MBPP_RECORD)
    assert ep.reward == 0.0 and ep.info["turns"] == 2 and ep.info["hidden_passed"] == 0
    assert [m for m, _ in segments(ep)] == [1, 0, 1]


@needs_full_data("the APPS sample (apps/apps_train_sample_coderl.jsonl)")
def test_code_agent_on_an_apps_stdio_problem_shows_input_expected_got():
    row = next(
        r
        for r in load_records(
            SHARED_DATA / "apps/apps_train_sample_coderl.jsonl", fields={"tests": "input_output"}
        )
        if str(r["problem_id"]) == "2287"
    )
    codec = chat_codec()
    cfg = config("code_agent", max_turns=2, public_tests=1)
    engine = ScriptedEngine(codec, ["```python\nprint('No')\n```", "print('Yes')"])
    ep, _ = run_agent(CodeAgent(), cfg, engine, row["question"], row)
    feedback = codec.decode(segments(ep)[1][1])
    assert "expected: Yes\n5\n6\n6\n5\n7" in feedback and "got: No" in feedback
    assert "(wrong_answer)" in feedback
    assert ep.reward == 0.0 and ep.info["hidden_total"] == 2


def test_tool_agent_runs_code_mid_reasoning_and_masks_the_output():
    codec = chat_codec()
    cfg = config("tool_reasoning", max_turns=3)
    turns = ["Let me compute. <code>print(6 * 7)</code>", " So the answer is \\boxed{42}."]
    engine = ScriptedEngine(codec, turns)
    ep, _ = run_agent(ToolAgent(), cfg, engine, "What is 6*7?", {"answer": "42"})
    assert ep.reward == 1.0 and ep.info["tool_calls"] == 1
    (m1, t1), (m2, t2), (m3, t3) = segments(ep)
    assert (m1, m2, m3) == (1, 0, 1)
    assert t1 == codec.encode(turns[0])  # stopped at </code>: no EOS
    assert codec.decode(t2) == "\n<interpreter>\n42\n</interpreter>\n"
    assert t3 == [*codec.encode(turns[1]), codec.eos_id]
    assert engine.contexts[1] == ep.prompt_ids + t1 + t2


def test_tool_agent_contains_hostile_tool_code_and_goes_on():
    codec = chat_codec()
    cfg = config("tool_reasoning", max_turns=3)
    turns = [
        "<code>import socket; socket.create_connection(('1.1.1.1', 53), timeout=1)</code>",
        "<code>import os\nwhile True: os.fork()</code>",
        "I give up, \\boxed{0}",
    ]
    ep, _ = run_agent(ToolAgent(), cfg, ScriptedEngine(codec, turns), "?", {"answer": "1"})
    outputs = [codec.decode(t) for m, t in segments(ep) if m == 0]
    assert "unreachable" in outputs[0] or "OSError" in outputs[0]
    # contained: stopped by the process limit (BlockingIOError), by a limit's status, or,
    # where the kill cut every traceback its forks wrote, by its exit code; never described
    # by a line of its own source (a cut traceback's last line: a failure of the suite
    # under load, 2026-12-06)
    stopped = ("BlockingIOError", "[timeout]", "[memory_limit]", "[cpu_limit]", "[signal]")
    assert any(s in outputs[1] for s in (*stopped, "exit code")), outputs[1]
    assert "os.fork()" not in outputs[1], outputs[1]
    assert ep.info["tool_calls"] == 2 and ep.reward == 0.0


def test_tool_agent_without_a_tool_call_is_single_turn():
    codec = chat_codec()
    ep, _ = run_agent(
        ToolAgent(),
        config("tool_reasoning", max_turns=3),
        ScriptedEngine(codec, ["\\boxed{5}"]),
        "?",
        {"answer": "5"},
    )
    assert ep.reward == 1.0 and ep.info["tool_calls"] == 0 and set(ep.loss_mask) == {1}


def test_math_and_arith_agents_score_single_turns():
    codec = chat_codec()
    engine = ScriptedEngine(codec, ["so \\boxed{\\frac{1}{2}}"])
    ep, _ = run_agent(SingleTurnAgent(), config("math"), engine, "?", {"answer": "0.5"})
    assert ep.reward == 1.0 and set(ep.loss_mask) == {1}
    from runtime.data.codec import CharCodec

    char = CharCodec()
    cfg = config("arith")
    env = AgentEnv(
        AgentEnvConfig.from_config(cfg), char, ScriptedEngine(char, ["3+4=7;#7"]), None, None
    )
    ep = asyncio.run(
        ArithAgent().run(env, "a", {"prompt_ids": char.prompt_ids("S3+4="), "answer": 7})
    )
    assert ep.reward == 1.0
    env = AgentEnv(AgentEnvConfig.from_config(cfg), char, ScriptedEngine(char, ["#8"]), None, None)
    assert asyncio.run(ArithAgent().run(env, "b", {"prompt_ids": [1], "answer": 7})).reward == 0.0


def _crash() -> None:
    os._exit(3)


def _hang() -> None:
    time.sleep(60)


def _raise() -> None:
    raise ValueError("reward bug")


def test_reward_pool_turns_crashes_hangs_and_errors_into_recorded_failures():
    pool = RewardPool(1, timeout_s=2.0)

    async def go():
        return [
            await pool.call(_crash),
            await pool.call(_hang),
            await pool.call(_raise),
            await pool.call(scoring.math_score, "\\boxed{2}", "2"),
        ]

    try:
        crash, hang, error, ok = asyncio.run(go())
    finally:
        pool.close()
    assert crash == (None, "its process died")
    assert hang == (None, "timed out after 2 s")
    assert error == (None, "ValueError: reward bug")
    assert ok == (1.0, None)  # the pool works after all three
    assert pool.failures == {"process_died": 1, "timeout": 1, "error": 1}


def test_an_episode_in_the_sandbox_holds_no_generation_slot():
    codec = chat_codec()
    cfg = config("tool_reasoning", max_turns=2)
    engine = ScriptedEngine(codec, ["<code>import time; time.sleep(1.5)</code>", "\\boxed{1}"])
    pool = RewardPool(1, 30)
    env = AgentEnv(AgentEnvConfig.from_config(cfg), codec, engine, lambda i: {"answer": "1"}, pool)
    seen = []

    async def go():
        task = asyncio.create_task(
            ToolAgent().run(env, "s", {"index": 0, "prompt_ids": codec.prompt_ids("?")})
        )
        while not task.done():
            seen.append((env.generating, env.in_tools))
            await asyncio.sleep(0.05)
        return await task

    try:
        ep = asyncio.run(go())
    finally:
        pool.close()
    assert ep.reward == 1.0
    assert (0, 1) in seen  # in the tool: no generation slot held
    assert all(g + t <= 1 for g, t in seen)
