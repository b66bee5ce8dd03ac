"""The embedded mixture of experts starts RL from the dense model's fit.

The two demos are compared by what RL adds to their warm starts (docs/moe.md), so the
warm starts must fit the worked solutions alike: with the dense model's 80 SFT steps the
MoE's held-out NLL was 0.644 against the dense model's 0.512, and RL started it from a
flatter policy (sampled accuracy 14% against 20%)."""

import pytest

pytestmark = pytest.mark.integration


def test_the_moe_warm_start_fits_the_solutions_as_the_dense_one_does():
    from transformers import AutoModelForCausalLM

    from runtime.embedded.warm_start import (
        embedded_model_path,
        embedded_moe_model_path,
        solution_nll,
    )

    dense = solution_nll(AutoModelForCausalLM.from_pretrained(embedded_model_path()))
    moe = solution_nll(AutoModelForCausalLM.from_pretrained(embedded_moe_model_path()))
    assert abs(moe - dense) < 0.03, (moe, dense)
