"""Named held-out sets (runtime/workloads/eval_sets.py): the figures per set, the stop
strings of the trainer's own generator, and the names the figures travel under."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from runtime.config.recipe import RecipeError, load_recipe
from runtime.control.telemetry import eval_sets
from runtime.data.codec import CharCodec
from runtime.data.eval_scores import SetScores, pass_at_k
from runtime.embedded.tiny_qwen3 import build_model
from runtime.engines.torch.generate import ModelGenerator, cut_at_stop
from runtime.engines.torch.trainer_eval import eval_names
from runtime.workloads.eval_sets import score_set
from tests.helpers import REPO

pytestmark = pytest.mark.unit


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    # 10 samples, 3 right, k = 2: 1 - C(7, 2) / C(10, 2)
    assert math.isclose(pass_at_k(10, 3, 2), 1 - 21 / 45)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 2)


def test_a_sets_figures_are_over_its_prompts():
    s = SetScores(k=2, solved_at=1.0)
    s.add(1.0, [1.0, 0.0])  # solved once of two
    s.add(0.0, [0.5, 0.5])  # partial credit: never solved
    s.add(0.5, [0.0, 0.0])
    m = s.metrics()
    assert m == {"greedy": 0.5, "mean@2": (0.5 + 0.5 + 0.0) / 3, "pass@2": 1 / 3, "prompts": 3}
    assert SetScores(k=2, solved_at=0.5).add(0.0, [0.5, 0.0]) is None
    with pytest.raises(ValueError):
        s.add(1.0, [1.0])  # k rewards per prompt, no fewer
    assert SetScores(k=1, solved_at=1.0).metrics() == {}


class _Chars:
    eos_id = 0

    def decode(self, ids):
        return "".join(chr(96 + i) for i in ids if i)


def test_a_stop_string_ends_the_turn_where_it_first_appears():
    codec = _Chars()
    tokens = [1, 2, 3, 4, 3, 4]  # "abcdcd"
    assert cut_at_stop(tokens, ["cd"], codec) == ([1, 2, 3, 4], "cd")
    assert cut_at_stop(tokens, ["zz"], codec) == (tokens, None)


@pytest.fixture
def tiny():
    """The embedded arithmetic model (random weights, seed 0), its codec and a prompt."""
    torch.manual_seed(0)
    codec = CharCodec()
    return build_model(), codec, codec.prompt_ids("S1+2=")


def test_the_trainer_model_generates_greedy_and_sampled_turns(tiny):
    model, codec, prompt = tiny
    greedy = ModelGenerator(model, codec, 0.0, version=3)
    a = asyncio.run(greedy.generate_turn("g", prompt, 8))
    b = asyncio.run(greedy.generate_turn("g", prompt, 8))
    assert a.tokens == b.tokens and 1 <= len(a.tokens) <= 8
    assert a.spans == [(3, 0, len(a.tokens))] and a.logprobs == [0.0] * len(a.tokens)
    assert a.finish == ("stop" if a.tokens[-1] == codec.eos_id else "length")
    hot = ModelGenerator(model, codec, 5.0, version=3)
    draws = {tuple(asyncio.run(hot.generate_turn("s", prompt, 8)).tokens) for _ in range(6)}
    assert len(draws) > 1  # sampling at a high temperature varies


def test_figures_are_named_by_when_and_grouped_by_set():
    start = eval_names({"eval_reward": 0.2, "eval/gsm/greedy": 0.5}, "start")
    assert start == {"eval_reward_start": 0.2, "eval_start/gsm/greedy": 0.5}
    end = eval_names({"eval_reward": 0.3, "eval/gsm/greedy": 0.7}, "end")
    assert end == {"eval_reward_end": 0.3, "eval/gsm/greedy": 0.7}
    grouped = eval_sets({**start, **end, "eval/gsm/pass@4": 0.9})
    assert grouped == {"gsm": {"start": {"greedy": 0.5}, "last": {"greedy": 0.7, "pass@4": 0.9}}}


def test_eval_sets_are_named_files(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text('data: {eval: {"a b": x.jsonl}}\nworkload: {kind: custom}\n')
    with pytest.raises(RecipeError, match=r"data\.eval\.a b"):
        load_recipe(recipe)
    recipe.write_text("train: {eval_every: 5}\nworkload: {kind: math}\ndata: {train: x.jsonl}\n")
    with pytest.raises(RecipeError, match=r"train\.eval_every: nothing to evaluate"):
        load_recipe(recipe)
    # the arith kind's agent scores its generated prompts: a file's sums go to kind custom
    recipe.write_text("data: {eval: {sums: s.jsonl}}\n")
    with pytest.raises(RecipeError, match=r"data\.eval: the arith kind"):
        load_recipe(recipe)
    # one file is a set named after it; null (configs saved before named sets) is none
    recipe.write_text("data: {eval: data/gsm8k/test.jsonl}\nworkload: {kind: math}\n")
    assert load_recipe(recipe).data.eval == {"test": "data/gsm8k/test.jsonl"}
    recipe.write_text("data: {eval: null}\n")
    assert load_recipe(recipe).data.eval == {}


class _Raising:
    """An agent whose second episode of every prompt raises (a CUDA out-of-memory, say)."""

    async def run(self, env, request_id, prompt):
        if request_id.endswith("-1"):
            raise RuntimeError("CUDA out of memory")
        ep = env.episode(request_id, prompt)
        ep.reward = 1.0
        return ep


def test_an_episode_that_raises_scores_0_and_is_counted():
    cfg = load_recipe(REPO / "examples/arith_retry/recipe.yaml", ["eval.k=2"])
    prompts = [{"index": 0, "prompt_ids": [1, 2]}, {"index": 1, "prompt_ids": [1, 3]}]
    scores = asyncio.run(score_set(cfg, _Raising(), prompts, lambda i: {}, None, None, None))
    assert scores.failed == 2
    assert scores.metrics() == {"greedy": 1.0, "mean@2": 0.5, "pass@2": 1.0, "prompts": 2.0}


def test_the_model_folders_sampling_settings_do_not_apply_and_every_end_id_stops(tiny):
    # vLLM's explicit SamplingParams ignore generation_config.json; so does the eval
    model, codec, prompt = tiny
    plain = asyncio.run(ModelGenerator(model, codec, 0.0, 0).generate_turn("g", prompt, 12))
    model.generation_config.repetition_penalty = 3.0
    again = asyncio.run(ModelGenerator(model, codec, 0.0, 0).generate_turn("g", prompt, 12))
    assert again.tokens == plain.tokens and model.generation_config.repetition_penalty == 3.0
    # an end id of the generation config ends the turn, as in vLLM
    model.generation_config.repetition_penalty = 1.0
    first = plain.tokens[0]
    model.generation_config.eos_token_id = [codec.eos_id, first]
    cut = asyncio.run(ModelGenerator(model, codec, 0.0, 0).generate_turn("g", prompt, 12))
    assert cut.tokens == [first] and cut.finish == "stop"
