"""Routing replay in the trainer (runtime/engines/torch/route_replay.py): the experts each
block runs are the sample's routes, weighted by the trainer's own router; without routes,
or with the routes its own router picks, the forward is the model's own."""

import pytest
import torch

from runtime.data.routes import ExpertRoutes, route_positions
from runtime.embedded.tiny_qwen3 import build_moe_model, build_tokenizer, save_pretrained
from runtime.engines.torch.route_replay import routes_of
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from tests.unit.test_trainer_features import make_cfg, make_samples

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny-moe")
    return str(save_pretrained(build_moe_model(seed=5), build_tokenizer(), path))


def trainer(moe_dir: str, replay: str, **algorithm) -> TorchTrainer:
    cfg = make_cfg(moe_dir, {"routing_replay": replay, **algorithm})
    return TorchTrainer(TorchTrainerConfig.from_config(cfg), moe_dir)


def with_routes(samples, policy) -> list:
    """``samples`` carrying the routes ``policy`` (a model) chooses for them."""
    for s in samples:
        ids = routes_of(policy, s.prompt_token_ids, s.token_ids)
        s.routes = ExpertRoutes.from_array(ids, experts=4).to_bytes()
    return samples


def experts_run(t: TorchTrainer) -> list[list[torch.Tensor]]:
    """Capture the expert indices every MoE block's experts are called with."""
    seen: list[list[torch.Tensor]] = []
    for layer in t.model.model.layers:
        calls: list[torch.Tensor] = []
        layer.mlp.experts.register_forward_pre_hook(lambda m, args, c=calls: c.append(args[1]))
        seen.append(calls)
    return seen


def test_the_blocks_run_the_replayed_experts_weighted_by_their_own_router(moe_dir):
    rollout_policy = build_moe_model(seed=9)  # another policy: other routes
    samples = with_routes(make_samples()[:3], rollout_policy)
    t = trainer(moe_dir, "rollout")
    seen = experts_run(t)
    with torch.no_grad():
        replayed = t._forward(samples)
    width = max(len(s.prompt_token_ids) + len(s.token_ids) for s in samples)
    for layer, (calls,) in enumerate(seen):
        ran = calls.reshape(len(samples), width, -1)
        for i, s in enumerate(samples):
            n = route_positions(len(s.prompt_token_ids), len(s.token_ids))
            given = ExpertRoutes.from_bytes(s.routes).array()[:, layer]
            assert torch.equal(ran[i, :n].sort(-1).values, torch.from_numpy(given).sort(-1).values)
    differ, compared = t.routes.take_counts()
    assert compared == 2 * sum(
        route_positions(len(s.prompt_token_ids), len(s.token_ids)) for s in samples
    )
    assert 0 < differ < compared  # the other policy agrees on some, not all
    assert t.routes.given is None  # cleared after the forward
    with torch.no_grad():
        own = trainer(moe_dir, "disabled")._forward(samples)
    assert (replayed - own).abs().max() > 1e-3


def test_routes_the_router_would_choose_change_nothing(moe_dir):
    t = trainer(moe_dir, "rollout")
    from transformers import AutoModelForCausalLM

    same = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    samples = with_routes(make_samples()[:3], same)
    with torch.no_grad():
        replayed = t._forward(samples)
        own = trainer(moe_dir, "disabled")._forward(samples)
    torch.testing.assert_close(replayed, own, rtol=0, atol=1e-6)
    assert t.routes.take_counts()[0] == 0


def test_a_replayed_step_reports_what_the_routers_would_have_done(moe_dir):
    samples = with_routes(make_samples(), build_moe_model(seed=9))
    samples[2].routes = None  # a sample without routes routes on its own
    t = trainer(moe_dir, "rollout", recompute_old_logprobs=True)
    metrics = t.train_step(samples)
    assert 0 < metrics["router_disagreement"] < 1
    assert metrics["routed_rows_share"] == pytest.approx(8 / 9)
    assert metrics["mismatch_k3_own_routes"] >= 0 and "mismatch_k3" in metrics
    router = t.model.model.layers[0].mlp.gate.weight
    assert router.grad is not None and router.grad.abs().max() > 0  # the router still learns
    off = trainer(moe_dir, "disabled", recompute_old_logprobs=True).train_step(samples)
    assert "router_disagreement" not in off and "mismatch_k3_own_routes" not in off


def test_routing_replay_is_refused_where_it_cannot_run(tmp_path):
    from runtime.config.recipe import RecipeError, build_config

    with pytest.raises(RecipeError, match=r"routing_replay.*not a known mixture of experts"):
        build_config({"algorithm": {"routing_replay": "rollout"}})  # the dense embedded model
    moe = {"model": {"path": "embedded:tiny-qwen3-moe"}, "algorithm": {"routing_replay": "rollout"}}
    with pytest.raises(RecipeError, match=r"routing_replay.*not wired"):
        build_config({**moe, "resources": {"device": "cuda"}})
    with pytest.raises(RecipeError, match=r"routing_replay.*engine.rollout: vllm"):
        build_config({**moe, "engine": {"rollout": "synthetic", "trainer": "torch"}})


def test_a_steps_routes_are_decoded_once_and_not_kept_after_it(moe_dir, monkeypatch):
    # Before: a process-wide cache of 1,024 decoded routes outlived every step (~50 MB an
    # entry at a 30B-A3B sample's length); now each step decodes its samples' routes once
    # for all its forwards and lets them go at its end.
    from runtime.engines.torch import route_replay

    calls: list[bytes] = []
    real = route_replay.decoded
    monkeypatch.setattr(route_replay, "decoded", lambda b: calls.append(b) or real(b))
    samples = with_routes(make_samples(), build_moe_model(seed=9))
    t = trainer(moe_dir, "rollout", recompute_old_logprobs=True)
    t.train_step(samples)
    # set for two forwards a sample (the old log-probs, the update), decoded once
    assert sorted(calls) == sorted(s.routes for s in samples)
    assert t.routes._decoded == {} and t.routes.given is None
    t.train_step(samples)  # the next step decodes them again: nothing was kept
    assert len(calls) == 2 * len(samples)


def test_a_frozen_router_keeps_its_weights_while_the_experts_train(moe_dir):
    t = trainer(moe_dir, "disabled", freeze_router=True)
    before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
    t.train_step(make_samples())
    params = dict(t.model.named_parameters())
    changed = {n for n, p in params.items() if not torch.equal(p.detach(), before[n])}
    routers = {n for n in params if n.endswith("mlp.gate.weight")}
    assert len(routers) == 2 and not routers & changed
    assert {n for n in changed if ".experts." in n}  # the experts trained
    assert all(params[n] not in t.opt.state for n in routers)  # no AdamW state for them
    # unfrozen, the same step moves them
    free = trainer(moe_dir, "disabled")
    free.train_step(make_samples())
    moved = dict(free.model.named_parameters())
    assert all(not torch.equal(moved[n].detach(), before[n]) for n in routers)


def test_a_frozen_router_is_refused_where_nothing_would_freeze():
    from runtime.config.recipe import RecipeError, build_config

    with pytest.raises(RecipeError, match=r"freeze_router.*dense model"):
        build_config({"algorithm": {"freeze_router": True}})  # the dense embedded model
    moe = {"model": {"path": "embedded:tiny-qwen3-moe"}, "algorithm": {"freeze_router": True}}
    with pytest.raises(RecipeError, match=r"freeze_router.*LoRA"):
        build_config({**moe, "model": {**moe["model"], "lora": {"rank": 4}}})
    with pytest.raises(RecipeError, match=r"freeze_router.*router_aux_loss_coef"):
        build_config({**moe, "algorithm": {"freeze_router": True, "router_aux_loss_coef": 0.01}})
    assert build_config(moe).algorithm.freeze_router is True


def test_a_resume_cannot_freeze_the_routers_of_a_run_that_trained_them(tmp_path, monkeypatch):
    # a trainer replica that joins later builds its frozen routers from model.path: after
    # a checkpoint whose routers trained, it would hold other routers than its peers
    from typer.testing import CliRunner

    from reflow_cli.main import app
    from runtime.config.recipe import build_config, dump_config

    run = tmp_path / "moe-run"
    run.mkdir()
    dump_config(build_config({"model": {"path": "embedded:tiny-qwen3-moe"}}), run / "config.yaml")
    monkeypatch.setenv("REFLOW_RUNS_DIR", str(tmp_path))
    out = CliRunner().invoke(
        app, ["launch", "--resume", str(run), "--local", "--set", "algorithm.freeze_router=true"]
    )
    # (the one-line error is printed by the entry point, reflow_cli.main.main)
    assert out.exit_code != 0 and "freeze_router is the run's from its start" in str(out.exception)
