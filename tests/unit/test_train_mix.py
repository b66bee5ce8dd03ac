"""Several training files mixed by weight (``data.train`` as a list of {path, weight}):
the recipe form, what launch checks, and the prompt stream rank 0 draws from."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest

from runtime.config.recipe import RecipeError, build_config
from runtime.data.datasets import check_dataset
from runtime.data.prompts import PromptSet, file_prompts
from runtime.data.settings import PromptsConfig

pytestmark = pytest.mark.unit


def _files(tmp_path, sizes: dict[str, int]) -> dict[str, str]:
    out = {}
    for name, n in sizes.items():
        path = tmp_path / f"{name}.jsonl"
        rows = [{"prompt": f"{name} {i}", "answer": str(i)} for i in range(n)]
        if name == "tagged":
            rows = [dict(r, data_source="mine") for r in rows]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out[name] = str(path)
    return out


def _mix(files: dict[str, str], weights: dict[str, float], **data) -> dict:
    train = [{"path": files[n], "weight": w} for n, w in weights.items()]
    return {"workload": {"kind": "math"}, "data": {"train": train, **data}}


def test_files_are_drawn_by_weight_each_through_its_own_epochs(tmp_path):
    files = _files(tmp_path, {"big": 50, "small": 5, "tagged": 5})
    cfg = build_config(_mix(files, {"big": 1.0, "small": 3.0, "tagged": 1.0}))
    assert check_dataset(cfg) == 60
    prompts = PromptSet(PromptsConfig.from_config(cfg))
    drawn = [
        p["index"] for p in itertools.islice(file_prompts(PromptsConfig.from_config(cfg)), 5000)
    ]
    by_file = Counter("big" if i < 50 else "small" if i < 55 else "tagged" for i in drawn)
    assert abs(by_file["small"] / 5000 - 0.6) < 0.03, by_file
    assert abs(by_file["big"] / 5000 - 0.2) < 0.03, by_file
    # a file's epoch is every one of its records once before any again
    small = [i for i in drawn if 50 <= i < 55]
    assert all(sorted(small[j : j + 5]) == list(range(50, 55)) for j in range(0, 500, 5))
    # verl's data_source: the record's own, else its file's name
    assert prompts.record(0)["data_source"] == "big"
    assert prompts.record(52)["data_source"] == "small"
    assert prompts.record(57)["data_source"] == "mine"
    assert prompts.text(51) == "small 1"
    # the same seed draws the same stream (a resumed run skips what it drew)
    again = [
        p["index"] for p in itertools.islice(file_prompts(PromptsConfig.from_config(cfg)), 5000)
    ]
    assert again == drawn


def test_one_file_draws_as_before(tmp_path):
    # the stream of a single file is the one it was before mixes existed (resumes and
    # seeds of earlier runs draw the same prompts)
    import random

    files = _files(tmp_path, {"one": 7})
    cfg = build_config({"workload": {"kind": "math"}, "data": {"train": files["one"]}})
    drawn = [p["index"] for p in itertools.islice(file_prompts(PromptsConfig.from_config(cfg)), 14)]
    expected = []
    for epoch in range(2):
        order = list(range(7))
        random.Random(cfg.train.seed * 1_000_003 + epoch).shuffle(order)
        expected += order
    assert drawn == expected
    assert "data_source" not in PromptSet(PromptsConfig.from_config(cfg)).record(0)


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ([], "data.train: expected a non-empty list"),
        ([{"weight": 2.0}], "data.train[0].path: a file or dataset folder is required"),
        ([{"path": "embedded:arith"}], "data.train[0].path: a file or dataset folder"),
        ([{"path": "a.jsonl", "weight": 0}], "data.train[0].weight: 0.0 is out of range"),
        ([{"path": "a.jsonl", "share": 1}], "data.train[0].share: unknown key"),
        (["a.jsonl"], "data.train[0]: expected a mapping of keys"),
    ],
)
def test_a_bad_mix_is_one_line_naming_the_entry(train, message):
    with pytest.raises(RecipeError) as err:
        build_config({"workload": {"kind": "math"}, "data": {"train": train}})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_missing_file_of_a_mix_is_named(tmp_path):
    files = _files(tmp_path, {"big": 3})
    cfg = build_config(
        _mix({**files, "gone": str(tmp_path / "gone.jsonl")}, {"big": 1.0, "gone": 1.0})
    )
    with pytest.raises(ValueError, match=r"gone\.jsonl"):
        check_dataset(cfg)


def test_a_new_config_never_gets_the_prompts_of_a_freed_one(tmp_path, monkeypatch):
    """The prompt cache was keyed by ``id(cfg)``: a config freed and a new one made at
    the same address drew the old one's prompts (make test once drew a 60-prompt mix's
    indices from a 7-prompt file). The reuse is forced here: every config gets one id."""
    from runtime.data import prompts as prompts_module

    monkeypatch.setattr(prompts_module, "_LOADED", {})
    monkeypatch.setattr(prompts_module, "id", lambda obj: 1, raising=False)
    files = _files(tmp_path, {"big": 50, "one": 7})
    big = build_config({"workload": {"kind": "math"}, "data": {"train": files["big"]}})
    assert len(prompts_module.prompt_set(PromptsConfig.from_config(big)).records) == 50
    one = build_config({"workload": {"kind": "math"}, "data": {"train": files["one"]}})
    assert len(prompts_module.prompt_set(PromptsConfig.from_config(one)).records) == 7
    drawn = [p["index"] for p in itertools.islice(file_prompts(PromptsConfig.from_config(one)), 14)]
    assert sorted(set(drawn)) == list(range(7))
