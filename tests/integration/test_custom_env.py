"""``workload.kind: custom`` with ``workload.agent``: your own multi-turn environment,
played by runtime/workloads/agents/environment.py's loop (scripted model turns)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runtime.config.schema import Config
from runtime.workloads.agents.environment import EnvAgent
from runtime.workloads.agents.pool import RewardPool
from tests.helpers import REPO, reflow
from tests.integration.agent_harness import ScriptedEngine, chat_codec, run_agent, segments

GAME = REPO / "examples" / "number_game" / "env.py"

ENVS = """
import asyncio, time
from runtime.workloads.agents.environment import Environment, Step

class Raises(Environment):
    def step(self, action):
        raise ZeroDivisionError("bad move")

class Slow(Environment):
    def step(self, action):
        time.sleep(3)  # past the 1 s timeout; a thread cannot be stopped, only left

class Malformed(Environment):
    def step(self, action):
        return {"reward": 1.0}

class Silent(Environment):
    def step(self, action):
        return Step(reward=0.5)  # neither done nor an observation

class AsyncTools(Environment):
    async def reset(self, record, tools):
        result = await tools.run_python("print(6 * 7)")
        self.truth = result.stdout.strip()

    async def step(self, action):
        return Step(reward=float(action.strip() == self.truth), done=True, info={"t": 1.0})
"""


@pytest.fixture(scope="module")
def envs(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("envs") / "envs.py"
    path.write_text(ENVS)
    return path


def config(agent: str, max_turns: int = 4, timeout_s: float = 5.0) -> Config:
    cfg = Config()
    cfg.workload.kind = "custom"
    cfg.workload.agent = agent
    cfg.workload.max_turns = max_turns
    cfg.workload.max_response_tokens = 64
    cfg.workload.reward_timeout_s = timeout_s
    cfg.model.max_seq_len = 2048
    return cfg


def test_the_environments_turns_go_between_the_models_masked_out():
    codec = chat_codec()
    engine = ScriptedEngine(codec, ["8", "I say 4", "6!"])
    ep, _ = run_agent(EnvAgent(), config(f"{GAME}:NumberGame"), engine, "guess", {"target": 6})
    assert ep.reward == pytest.approx(1 / 3) and ep.info["turns"] == 3
    assert ep.info["env/guesses"] == 3
    segs = segments(ep)
    assert [m for m, _ in segs] == [1, 0, 1, 0, 1]
    assert segs[1][1] == codec.user_turn_ids("lower", True)  # after "8": lower
    assert segs[3][1] == codec.user_turn_ids("higher", True)  # after "4": higher
    # the model saw each observation: its next turn was generated on that context
    assert engine.contexts[1] == ep.prompt_ids + segs[0][1] + segs[1][1]


def test_the_episode_ends_after_max_turns_with_the_steps_rewards_summed():
    codec = chat_codec()
    engine = ScriptedEngine(codec, ["1", "2"])
    cfg = config(f"{GAME}:NumberGame", max_turns=2)
    ep, _ = run_agent(EnvAgent(), cfg, engine, "guess", {"target": 9})
    assert ep.reward == 0.0 and ep.info["turns"] == 2
    assert [m for m, _ in segments(ep)] == [1, 0, 1]  # no observation after the last turn


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("Raises", "environment step: ZeroDivisionError: bad move"),
        ("Slow", "environment step: timed out after 1 s"),
        ("Malformed", "environment step: TypeError: step returned dict, not a Step"),
        ("Silent", "environment step: TypeError: step returned no observation and not done"),
    ],
)
def test_an_environment_that_fails_scores_0_and_says_why(name, says, envs):
    codec = chat_codec()
    cfg = config(f"{envs}:{name}", timeout_s=1.0)
    ep, env = run_agent(EnvAgent(), cfg, ScriptedEngine(codec, ["5"]), "?", {})
    assert ep is not None and ep.reward == 0.0 and ep.info["reward_error"] == says
    assert env.in_tools == 0  # the slot accounting came back


def test_an_async_environment_uses_the_sandbox(envs):
    codec = chat_codec()
    pool = RewardPool(1, 30.0)
    try:
        cfg = config(f"{envs}:AsyncTools")
        ep, _ = run_agent(EnvAgent(), cfg, ScriptedEngine(codec, ["42"]), "?", {}, pool)
    finally:
        pool.close()
    assert ep.reward == 1.0 and ep.info["env/t"] == 1.0, ep.info


def test_the_recipes_reward_fn_scores_a_custom_environment(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text(
        "def f(data_source, solution_str, ground_truth, extra_info):\n"
        "    return float('higher' in solution_str)\n"
    )
    codec = chat_codec()
    cfg = config(f"{GAME}:NumberGame")
    cfg.workload.reward_fn = f"{reward}:f"
    pool = RewardPool(1, 30.0)
    try:
        engine = ScriptedEngine(codec, ["1", "16", "3"])
        ep, _ = run_agent(EnvAgent(), cfg, engine, "?", {"target": 3}, pool)
    finally:
        pool.close()
    assert ep.reward == 1.0  # the environment's own would be 1/3


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["workload.kind=custom"], "workload.agent: an environment class goes with"),
        ([f"workload.agent={GAME}:NumberGame"], "workload.agent: an environment class goes"),
        (
            ["workload.kind=custom", f"workload.agent={GAME}:Nope"],
            f"workload.agent: {GAME} has no Nope",
        ),
        (
            ["workload.kind=custom", "workload.agent=json:dumps"],
            "workload.agent: json:dumps is not a class",
        ),
    ],
)
def test_launch_refuses_an_environment_it_cannot_use_in_one_line(sets, says, runs_dir):
    args = [x for s in sets for x in ("--set", s)]
    r = reflow("launch", "recipes/demo.yaml", "--local", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert says in line and "\n" not in line, line
    assert not runs_dir.exists()


def test_the_number_game_checks_its_moves():
    sys.path.insert(0, str(REPO))
    from examples.number_game.env import NumberGame

    game = NumberGame()
    game.reset({"target": 5}, None)  # type: ignore[arg-type]
    assert game.step("maybe").observation == "Answer with one number."
    assert game.step("10").observation == "lower"
    last = game.step("so 5")
    assert last.done and last.reward == pytest.approx(1 / 3)
    assert json.dumps(last.info) == '{"guesses": 3}'
