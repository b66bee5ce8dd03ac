"""A mixture of experts' two layouts (runtime/checkpoint_layout.py): the trainer's fused
expert tensors, the hub's one matrix per expert."""

import pytest
import torch

from runtime.checkpoint_layout import to_fused, to_hub
from runtime.embedded.tiny_qwen3 import build_moe_model


def test_the_hub_layout_names_every_expert_and_round_trips():
    state = build_moe_model(seed=1).state_dict()
    hub = to_hub(state)
    assert not any(k.endswith(("experts.gate_up_proj", "experts.down_proj")) for k in hub)
    fused = state["model.layers.1.mlp.experts.gate_up_proj"]  # [E, 2m, h]
    m = fused.shape[1] // 2
    assert torch.equal(hub["model.layers.1.mlp.experts.3.gate_proj.weight"], fused[3, :m])
    assert torch.equal(hub["model.layers.1.mlp.experts.3.up_proj.weight"], fused[3, m:])
    down = state["model.layers.0.mlp.experts.down_proj"]
    assert torch.equal(hub["model.layers.0.mlp.experts.2.down_proj.weight"], down[2])
    assert hub["model.layers.0.mlp.gate.weight"] is state["model.layers.0.mlp.gate.weight"]
    back = to_fused(hub)
    assert back.keys() == state.keys()
    assert all(torch.equal(back[k], v) for k, v in state.items())


def test_a_dense_state_passes_as_it_is():
    state = {"model.layers.0.mlp.gate_proj.weight": torch.ones(2, 2)}
    assert to_hub(state) == state and to_fused(state) == state


def test_an_expert_missing_from_a_hub_state_is_named():
    hub = to_hub(build_moe_model(seed=1).state_dict())
    del hub["model.layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(ValueError, match=r"experts\.1\.up_proj\.weight is missing"):
        to_fused(hub)
    hub = to_hub(build_moe_model(seed=1).state_dict())
    del hub["model.layers.1.mlp.experts.2.down_proj.weight"]
    del hub["model.layers.1.mlp.experts.2.gate_proj.weight"]
    del hub["model.layers.1.mlp.experts.2.up_proj.weight"]
    with pytest.raises(ValueError, match=r"experts \[0, 1, 3\] are not 0..2"):
        to_fused(hub)
