"""An eval round played on a real vLLM engine (CPU build) gives the trainer-side path's
figures on the same weights: greedy exactly, sampled within the estimators' spread
(issue "Evaluation that never stops training"). The round is rank 0's book
(runtime/control/evals.py) and the pinned driver's player
(runtime/engines/vllm/eval_player.py), the same ones a run uses."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest

from runtime.config.recipe import load_recipe
from runtime.control.evals import EvalRounds
from runtime.data.codec import codec_for
from runtime.embedded.resolve import resolve_model_path
from runtime.engines.registry import build_eval_prompts
from runtime.engines.torch.trainer_eval import eval_generators
from runtime.workloads import eval_sets
from runtime.workloads.agents import registry
from tests.helpers import REPO

pytestmark = pytest.mark.integration

K = 4


def test_a_round_on_the_rollout_engine_equals_the_trainer_side_eval(monkeypatch):
    from transformers import AutoModelForCausalLM

    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.eval_player import EvalPlayer
    from runtime.engines.vllm.rollout import eval_records
    from runtime.engines.vllm.settings import VLLMEngineConfig
    from runtime.workloads.agents.settings import AgentEnvConfig

    monkeypatch.chdir(REPO)  # the recipe names its environment and sets from the repository
    cfg = load_recipe(
        REPO / "examples/arith_retry/recipe.yaml", ["eval.max_prompts=8", f"eval.k={K}"]
    )
    path = resolve_model_path(cfg.model.path)

    # the trainer leader's path: the model itself, version 0
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    trainer_side = eval_sets.evaluate(cfg, eval_generators(cfg, model, 0), 0, None, lambda: None)

    # the rollout path: rank 0's round, played by the player on a vLLM engine
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = VLLMEngine(path, VLLMEngineConfig.from_config(cfg))

    def submit(coro):
        return asyncio.run_coroutine_threadsafe(coro, loop)

    submit(engine.start(0)).result(300)
    try:
        book = EvalRounds(build_eval_prompts(cfg), K, cfg.eval.solved_at, 600.0, time.monotonic)
        r = book.start(version=0, step=0, when="start", rank=2)
        player = EvalPlayer(
            AgentEnvConfig.from_config(cfg),
            lambda name: eval_records(cfg, name),
            cfg.eval.temperature,
            engine,
            codec_for(path, cfg.model.path),
            None,
            registry.agent(cfg.workload.kind),
            submit,
        )
        tasks = book.take(2, 10_000)
        records = [
            {
                "task_id": t.task_id,
                "set_name": t.set_name,
                "prompt": book.prompt_of(t),
                "sample": t.sample,
            }
            for t in tasks
        ]
        player.start(2, r.round_id, 0, records)  # all at once: the engine batches them
        results: list = []
        deadline = time.monotonic() + 300
        while player.running and time.monotonic() < deadline:
            player.reap(results.append)
            time.sleep(0.05)
        player.reap(results.append)
        assert len(results) == len(tasks) == 2 * 8 * (K + 1)
        outcome = None
        for done in results:
            outcome = book.finished(
                done.rank,
                done.round_id,
                done.task_id,
                done.reward,
                done.policy_version,
                done.reason,
            )
        record = outcome
    finally:
        engine.shutdown()
        loop.call_soon_threadsafe(loop.stop)

    assert record.complete and record.version == 0
    # not a vacuous match: the warm-started model solves some of the drawn sums
    assert any(trainer_side[f"eval/{name}/greedy"] > 0 for name in cfg.data.eval)
    for name in cfg.data.eval:
        ours = {
            k.split("/")[-1]: v for k, v in record.figures.items() if k.startswith(f"eval/{name}/")
        }
        theirs = {
            k.split("/")[-1]: v for k, v in trainer_side.items() if k.startswith(f"eval/{name}/")
        }
        assert ours["prompts"] == theirs["prompts"] == 8.0
        assert ours["unscored"] == theirs["unscored"] == 0.0
        # greedy: the same episodes, token for token
        assert ours["greedy"] == theirs["greedy"], (name, ours, theirs)
        # sampled: two draws of the same estimator; rewards in [0, 1] over 8 x K episodes
        # each, so each mean's standard error is at most 0.5 / sqrt(32)
        spread = 4 * math.sqrt(2) * 0.5 / math.sqrt(8 * K)
        assert abs(ours[f"mean@{K}"] - theirs[f"mean@{K}"]) <= spread, (name, ours, theirs)
