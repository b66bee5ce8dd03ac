"""The pure parts of ``workload.reward_fn`` (runtime/workloads/rewards/custom.py): what a
reference may be, what a function may return, where verl's arguments come from."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from runtime.workloads.rewards.custom import RewardFnError, as_result, resolve, verl_arguments


def test_a_reference_is_a_file_or_a_module_and_a_name(tmp_path):
    assert resolve("rewards/r.py:score", base=tmp_path) == f"{tmp_path}/rewards/r.py:score"
    assert resolve("/abs/r.py:score") == "/abs/r.py:score"
    assert resolve("my_pkg.rewards:score") == "my_pkg.rewards:score"  # a module: as is
    for bad in ("score", "r.py:", ":score", "r.py:not-a-name"):
        with pytest.raises(RewardFnError, match=r"workload\.reward_fn: .* is not PATH\.py:NAME"):
            resolve(bad)


def test_what_a_reward_function_may_return():
    assert as_result(1) == {"score": 1.0, "info": {}}
    assert as_result(True) == {"score": 1.0, "info": {}}
    got = as_result({"score": 0.5, "acc": True, "pred": "42", "arr": [1, 2]})
    assert got == {"score": 0.5, "info": {"acc": 1.0, "pred": "42", "arr": "[1, 2]"}}

    class Scalar:  # numpy's float64 or a 0-d tensor: float() works
        def __float__(self) -> float:
            return 0.75

    assert as_result(Scalar())["score"] == 0.75
    for bad, says in [
        ("1.0", "returned str, not a number"),
        (None, "returned NoneType, not a number"),
        ([1.0], "returned list, not a number"),
        ({"acc": 1.0}, "returned a dict without 'score'"),
        ({"score": "high"}, "returned str, not a number"),
    ]:
        with pytest.raises(TypeError, match=says):
            as_result(bad)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="returned a score of"):
            as_result(bad)


def test_verls_arguments_from_a_record():
    verl = {
        "data_source": "openai/gsm8k",
        "reward_model": {"ground_truth": "18"},
        "extra_info": {"index": 3},
    }
    assert verl_arguments(verl, "train") == ("openai/gsm8k", "18", {"index": 3})
    # this project's records: answer, and no data_source or extra_info
    assert verl_arguments({"answer": 7, "index": 2, "prompt": "x"}, "gsm8k") == (
        "gsm8k",
        7,
        {"index": 2},
    )
    assert verl_arguments({"ground_truth": "a"}, "d")[1] == "a"


def test_the_loader_names_the_field_and_the_file(tmp_path: Path):
    from runtime.workloads.rewards.custom import check

    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    with pytest.raises(RewardFnError) as e:
        check(f"{broken}:f")
    assert str(e.value) == (
        f"workload.reward_fn: {broken}: ModuleNotFoundError: No module named "
        "'not_a_module_anywhere'"
    )
    ok = tmp_path / "ok.py"
    ok.write_text("def f(**kwargs):\n    return 1.0\nNOT_CALLABLE = 3\n")
    assert check("ok.py:f", base=tmp_path) == f"{ok}:f"
    with pytest.raises(RewardFnError, match=r"ok\.py:NOT_CALLABLE is a int, not a function"):
        check(f"{ok}:NOT_CALLABLE")
