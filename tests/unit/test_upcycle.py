"""Sparse upcycling (runtime/embedded/tiny_qwen3.upcycle_to_moe): the mixture of experts
built from a dense model computes the dense model's function, and its experts can drift
apart under training (they would stay copies if every token went to the same ones)."""

import pytest
import torch

from runtime.embedded.tiny_qwen3 import build_model, upcycle_to_moe

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def dense():
    return build_model(seed=3).eval()


def ids(seed: int = 0):
    return torch.randint(4, 26, (3, 20), generator=torch.Generator().manual_seed(seed))


def test_the_upcycled_moe_computes_the_dense_models_logits(dense):
    moe = upcycle_to_moe(dense).eval()
    with torch.no_grad():
        gap = (moe(ids()).logits - dense(ids()).logits).abs().max()
    assert gap < 1e-5
    config = moe.config
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (4, 2, True)
    assert config.moe_intermediate_size == dense.config.intermediate_size


def test_every_expert_gets_tokens_and_its_own_gradient(dense):
    moe = upcycle_to_moe(dense).train()
    out = moe(ids(1), labels=ids(1), output_router_logits=True)
    for router_logits in out.router_logits:  # every block's router spreads the tokens
        chosen = router_logits.topk(2, dim=-1).indices.flatten()
        assert set(chosen.tolist()) == {0, 1, 2, 3}
    out.loss.backward()
    for block in moe.model.layers:
        grads = block.mlp.experts.gate_up_proj.grad
        for a in range(4):
            assert grads[a].abs().sum() > 0
            for b in range(a + 1, 4):  # copies now, but each moves its own way
                assert not torch.allclose(grads[a], grads[b])
