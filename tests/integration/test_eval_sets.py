"""The held-out sets played for real: the embedded model (the demo's, warm-started) plays
examples/arith_retry's environment through runtime/workloads/eval_sets.py, as the trainer
leader does at the start and the end of a run."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from runtime.config.recipe import load_recipe
from runtime.data.codec import codec_for
from runtime.embedded.resolve import resolve_model_path
from runtime.engines.torch.generate import ModelGenerator
from runtime.engines.torch.trainer_eval import eval_generators
from runtime.workloads import eval_sets
from tests.helpers import REPO

pytestmark = pytest.mark.integration

SUMS = ["S1+2=", "S3+4=", "S5+2=", "S6+1=", "S2+2+3="]


def test_the_figures_follow_what_the_model_answers(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(REPO)  # the recipe names its environment from the repository root
    cfg = load_recipe(REPO / "examples/arith_retry/recipe.yaml")
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(cfg.model.path)).eval()
    codec = codec_for(resolve_model_path(cfg.model.path), cfg.model.path)
    greedy = ModelGenerator(model, codec, 0.0, version=0)
    said = []
    for text in SUMS:
        turn = asyncio.run(greedy.generate_turn("probe", codec.prompt_ids(text), 64))
        found = re.search(r"#(-?\d+)", codec.decode(turn.tokens))
        said.append(int(found.group(1)) if found else 10_000)
    # "agreed": the answer is what the model says greedily (its greedy reward is 1 at the
    # first try, whatever the sum is); "never": an answer no sum of digits has
    sets = {"agreed": said, "never": [-1] * len(SUMS)}
    for name, answers in sets.items():
        rows = [{"prompt": t, "answer": a} for t, a in zip(SUMS, answers, strict=True)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    files = ", ".join(f"{n}: {tmp_path / n}.jsonl" for n in sets)
    cfg = load_recipe(
        REPO / "examples/arith_retry/recipe.yaml",
        [f"data.eval={{{files}}}", "eval.k=3", "eval.max_prompts=4"],
    )
    beats: list[int] = []
    generators = eval_generators(cfg, model, 7)
    out = eval_sets.evaluate(cfg, generators, 7, None, lambda: beats.append(1))
    assert out["eval/agreed/greedy"] == 1.0 and out["eval/agreed/prompts"] == 4.0
    assert out["eval/never/greedy"] == 0.0
    assert out["eval/never/mean@3"] == 0.0 and out["eval/never/pass@3"] == 0.0
    assert len(beats) == 2 * 4 * (3 + 1)  # a heartbeat after every episode
    # the same seed and version: the same figures; the training RNG is left as it was
    import torch

    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    again = eval_sets.evaluate(cfg, eval_generators(cfg, model, 7), 7, None, lambda: None)
    assert again == out and torch.equal(torch.rand(1), before)
