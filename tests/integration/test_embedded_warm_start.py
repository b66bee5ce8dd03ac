"""The embedded mixture of experts starts RL from the dense model's fit.

The two demos are compared by what RL adds to their warm starts (docs/moe.md), so the
warm starts must fit the worked solutions alike: with the dense model's 80 SFT steps the
MoE's held-out NLL was 0.644 against the dense model's 0.512, and RL started it from a
flatter policy (sampled accuracy 14% against 20%; unnormalised expert weights then).
Its other build, renormalised, after the dense model's own 80 steps, is matched on the
held-out figure instead, and so is the dense model's other build, after 86 steps, to the
MoE's."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def apart(measure, dense_path: Path, moe_path: Path) -> float:
    """How far the MoE build is from the dense model on ``measure`` (of an HF model)."""
    from transformers import AutoModelForCausalLM

    dense = measure(AutoModelForCausalLM.from_pretrained(dense_path))
    moe = measure(AutoModelForCausalLM.from_pretrained(moe_path))
    print(f"{measure.__name__}: moe {moe:.4f}, dense {dense:.4f}")
    return abs(moe - dense)


def test_the_moe_warm_start_fits_the_solutions_as_the_dense_one_does():
    from runtime.embedded.warm_start import (
        embedded_model_path,
        embedded_moe_model_path,
        solution_nll,
    )

    assert apart(solution_nll, embedded_model_path(), embedded_moe_model_path()) < 0.03


def test_the_sft80_moe_starts_at_the_dense_models_held_out_accuracy():
    # embedded:tiny-qwen3-moe-sft80, the MoE demo's other start (docs/moe.md): matched on
    # the held-out greedy accuracy the demos are judged by (0.215 against 0.207 here), where
    # the default MoE, matched on NLL, is at 0.258
    from runtime.embedded.warm_start import (
        embedded_model_path,
        embedded_moe_sft80_model_path,
        greedy_accuracy,
    )

    assert apart(greedy_accuracy, embedded_model_path(), embedded_moe_sft80_model_path()) < 0.03


def test_the_sft86_dense_model_starts_at_the_moes_held_out_accuracy():
    # embedded:tiny-qwen3-sft86, the dense demo's other start (docs/moe.md): the MoE's
    # held-out greedy accuracy (0.250 against 0.258 here), where the default dense model
    # is at 0.207
    from runtime.embedded.warm_start import (
        embedded_moe_model_path,
        embedded_sft86_model_path,
        greedy_accuracy,
    )

    assert apart(greedy_accuracy, embedded_sft86_model_path(), embedded_moe_model_path()) < 0.03


def test_the_upcycled_moe_starts_as_the_dense_model():
    # embedded:tiny-qwen3-moe-upcycled: the dense demo's own start, every expert a copy of
    # its MLP: the same fit and the same greedy answers (docs/moe.md)
    from runtime.embedded.warm_start import (
        embedded_model_path,
        embedded_moe_upcycled_model_path,
        greedy_accuracy,
        solution_nll,
    )

    assert apart(solution_nll, embedded_model_path(), embedded_moe_upcycled_model_path()) < 1e-4
    assert apart(greedy_accuracy, embedded_model_path(), embedded_moe_upcycled_model_path()) == 0
