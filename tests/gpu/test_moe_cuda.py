"""A mixture of experts on CUDA (docs/moe.md): one trainer step of the tiny Qwen3-MoE in
bf16 with routing replay and the router's loss. The trainer side of routing replay is the
same on CUDA; what a GPU run lacks is a route source (vLLM's routed-experts capture is not
wired, and the lent machine has no vLLM), so the routes here come from another policy's
routers, as in tests/unit/test_route_replay.py.

Marked ``gpu`` (by folder): ``make test`` leaves it out."""

from __future__ import annotations

import math

import pytest
import torch

from runtime.config.recipe import build_config
from runtime.embedded.tiny_qwen3 import build_moe_model, build_tokenizer, save_pretrained
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from tests.unit.test_route_replay import with_routes
from tests.unit.test_trainer_features import make_samples

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_moe_step_on_cuda_replays_routes_in_bf16(tmp_path):
    model = str(save_pretrained(build_moe_model(seed=5), build_tokenizer(), tmp_path / "moe"))
    cfg = build_config(
        {
            "model": {"path": model},
            "train": {"lr": 1e-3, "steps": 10, "strategy": "replicate", "param_dtype": "bfloat16"},
            "algorithm": {
                "routing_replay": "rollout",
                "router_aux_loss_coef": 0.01,
                "recompute_old_logprobs": True,
            },
            "resources": {"device": "cpu"},  # the recipe check refuses replay on GPUs...
        }
    )
    cfg.resources.device = "cuda"  # ... for want of a route source, not of the trainer side
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg), model)
    assert t.device.type == "cuda" and t.routes is not None
    m = t.train_step(with_routes(make_samples(), build_moe_model(seed=9)))
    assert math.isfinite(m["loss"]) and m["router_aux_loss"] > 0
    assert m["routed_rows_share"] == 1.0 and 0 < m["router_disagreement"] < 1
    assert m["mismatch_k3_own_routes"] >= 0
