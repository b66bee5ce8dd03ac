"""``workload.reward_fn``: a reward function in verl's signature replaces the reward of any
workload kind, runs in the reward pool (processes of its own, a timeout), and is checked
once at launch (runtime/workloads/rewards/custom.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.config.schema import Config
from runtime.control.telemetry import reward_info_means
from runtime.data.sample import Sample
from runtime.workloads.agents.base import AgentEnv
from runtime.workloads.agents.code_agent import CodeAgent
from runtime.workloads.agents.pool import RewardPool
from runtime.workloads.agents.settings import AgentEnvConfig
from runtime.workloads.agents.single_turn import ArithAgent, SingleTurnAgent
from runtime.workloads.agents.tool_reasoning import ToolAgent
from tests.helpers import REPO
from tests.integration.agent_harness import ScriptedEngine, chat_codec, run_agent

REWARDS = '''
import asyncio, json, time

CALLS = []

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A verl reward file: exact answer anywhere in the text."""
    hit = str(ground_truth) in solution_str
    return {"score": 1.0 if hit else 0.0, "acc": hit, "chars": len(solution_str),
            "seen": json.dumps([data_source, extra_info])}

async def async_score(data_source, solution_str, ground_truth, extra_info):
    await asyncio.sleep(0)
    return 0.25

def hangs(data_source, solution_str, ground_truth, extra_info):
    time.sleep(60)

def raises(data_source, solution_str, ground_truth, extra_info):
    raise KeyError("gold")

def not_a_number(data_source, solution_str, ground_truth, extra_info):
    return "1.0"

def nan(data_source, solution_str, ground_truth, extra_info):
    return float("nan")

def too_few(solution_str, ground_truth):
    return 1.0
'''


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "my_reward.py"
    path.write_text(REWARDS)
    return path


@pytest.fixture(scope="module")
def pool():
    p = RewardPool(2, 5.0)
    yield p
    p.close()


def config(kind: str, reward_fn: str | None) -> Config:
    cfg = Config()
    cfg.workload.kind = kind
    cfg.workload.reward_fn = reward_fn
    cfg.model.max_seq_len = 4096
    cfg.workload.max_response_tokens = 512
    return cfg


@pytest.mark.parametrize(
    ("kind", "agent", "text"),
    [
        ("math", SingleTurnAgent(), "the answer is 42"),
        ("tool_reasoning", ToolAgent(), "I know it: 42"),  # no tool call: no sandbox
        ("code_agent", CodeAgent(), "```python\nprint(42)\n```"),  # the tests not run
    ],
)
def test_the_recipes_reward_replaces_every_kinds_own(kind, agent, text, reward_file, pool):
    codec = chat_codec()
    ref = f"{reward_file}:compute_score"
    record = {"answer": "42", "tests": ["assert f() == 1"], "extra_info": {"index": 7}}
    if kind == "code_agent":
        config_ = config(kind, ref)
        config_.workload.public_tests = 0
    else:
        config_ = config(kind, ref)
    ep, _ = run_agent(agent, config_, ScriptedEngine(codec, [text]), "?", record, pool)
    assert ep.reward == 1.0, ep.info  # 42 is in the text; the kind's own rule says 0
    info = ep.info["reward_info"]
    assert info["acc"] == 1.0 and info["chars"] > 0
    # data_source: the record has none, data.train is generated: the kind's name
    assert json.loads(info["seen"]) == [kind, {"index": 7}]
    assert "reward_error" not in ep.info and "hidden_passed" not in ep.info
    wrong, _ = run_agent(agent, config_, ScriptedEngine(codec, ["no idea"]), "?", record, pool)
    assert wrong.reward == 0.0 and wrong.info["reward_info"]["acc"] == 0.0


def test_the_arith_task_and_an_async_function(reward_file, pool):
    from runtime.data.codec import CharCodec

    char = CharCodec()
    cfg = config("arith", f"{reward_file}:async_score")
    env = AgentEnv(AgentEnvConfig.from_config(cfg), char, ScriptedEngine(char, ["#7"]), None, pool)
    ep = asyncio.run(ArithAgent().run(env, "a", {"prompt_ids": [1], "answer": 7}))
    assert ep.reward == 0.25  # awaited; the arith rule would give 1.0


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("hangs", "timed out after 5 s"),
        ("raises", "KeyError: 'gold'"),
        ("not_a_number", "TypeError: returned str, not a number"),
        ("nan", "ValueError: returned a score of nan"),
    ],
)
def test_a_reward_that_fails_scores_0_and_says_why(name, says, reward_file, pool):
    codec = chat_codec()
    cfg = config("math", f"{reward_file}:{name}")
    ep, _ = run_agent(
        SingleTurnAgent(), cfg, ScriptedEngine(codec, ["42"]), "?", {"answer": "42"}, pool
    )
    assert ep.reward == 0.0
    assert says in ep.info["reward_error"]


def test_verls_data_layout_reaches_the_function(reward_file, pool):
    """A record as verl's parquet files hold it: data_source, reward_model.ground_truth,
    extra_info."""
    codec = chat_codec()
    record = {
        "data_source": "openai/gsm8k",
        "reward_model": {"style": "rule", "ground_truth": "18"},
        "extra_info": {"split": "train", "index": 3},
    }
    cfg = config("math", f"{reward_file}:compute_score")
    ep, _ = run_agent(SingleTurnAgent(), cfg, ScriptedEngine(codec, ["#### 18"]), "?", record, pool)
    assert ep.reward == 1.0
    assert json.loads(ep.info["reward_info"]["seen"]) == [
        "openai/gsm8k",
        {"split": "train", "index": 3},
    ]


def test_numeric_diagnostics_are_averaged_into_the_step_line():
    def sample(i: int, info: dict) -> Sample:
        return Sample(
            sample_id=i,
            group_id=0,
            prompt_id=0,
            versions=[(0, 0, 1)],
            token_ids=[1],
            logprobs=[-1.0],
            n_valid=1,
            reward=0.0,
            info=info,
        )

    batch = [
        sample(0, {"reward_info": {"acc": 1.0, "chars": 10.0, "seen": "x"}}),
        sample(1, {"reward_info": {"acc": 0.0, "chars": 20.0}}),
        sample(2, {}),
    ]
    assert reward_info_means(batch) == {"reward_info/acc": 0.5, "reward_info/chars": 15.0}


def reflow(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "reflow_cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_reflow_reward_custom_scores_lines_as_training_does(reward_file):
    lines = "\n".join(
        [
            json.dumps({"solution_str": "x = 42", "ground_truth": 42}),
            json.dumps({"solution_str": "nothing", "ground_truth": 42}),
            "not json",
        ]
    )
    r = reflow("reward", "custom", "--fn", f"{reward_file}:compute_score", stdin=lines)
    assert r.returncode == 0, r.stderr
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["score"] for o in out] == [1.0, 0.0, None]
    assert out[0]["info"]["acc"] == 1.0 and "line 3: not valid JSON" in out[2]["error"]
    r = reflow("reward", "custom", "--fn", f"{reward_file}:raises", stdin=lines.split("\n")[0])
    assert json.loads(r.stdout) == {"score": 0.0, "error": "KeyError: 'gold'"}


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("{file}:too_few", "cannot be called with verl's keyword arguments"),
        ("{file}:missing", "has no missing"),
        ("/nonexistent/r.py:f", "/nonexistent/r.py: no such file"),
        ("no_such_module_xyz:f", "module no_such_module_xyz: ModuleNotFoundError"),
        ("justaname", "is not PATH.py:NAME or module:NAME"),
    ],
)
def test_launch_refuses_a_reward_it_cannot_call_in_one_line(ref, says, reward_file, runs_dir):
    r = reflow(
        "launch",
        "recipes/demo.yaml",
        "--local",
        "--set",
        f"workload.reward_fn={ref.format(file=reward_file)}",
    )
    assert r.returncode == 2
    line = r.stderr.strip()
    assert line.startswith("reflow: workload.reward_fn: ") and says in line, line
    assert "\n" not in line and not runs_dir.exists()  # nothing started
