"""LoRA in the memory plan (runtime/config/lora_memory.py) and in the simulator
(runtime/sim/lora.py): the adapter's size against a hand computation and against the
trainer's own layers, a model that fits only with LoRA, and what a LoRA run's weight sync
and trainer step cost in simulation."""

import dataclasses
import math

import pytest

from runtime.config.architectures import ArchitectureError, model_shape
from runtime.config.lora_memory import lora_adapter_params
from runtime.config.memory_plan import GIB, plan_memory
from runtime.config.recipe import build_config, load_recipe
from runtime.sim.lora import lora_costs, lora_profile
from runtime.sim.parameters import load_profiles
from runtime.sim.run import plan, simulate
from tests.helpers import REPO
from tests.unit.test_memory_plan import gpu_recipe

pytestmark = pytest.mark.unit

PROFILES = load_profiles()
ALL_7 = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Qwen3-8B's published config.json (huggingface.co/Qwen/Qwen3-8B), written out by hand.
H, MLP, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 4096, 12288, 36, 32, 8, 128


def qwen3_8b_adapter_by_hand(r: int) -> int:
    """A [r, in] + B [out, r], i.e. r (in + out), per adapted layer, 7 layers a block."""
    q = r * (H + HEADS * HEAD_DIM)  # hidden -> heads x head_dim
    k = v = r * (H + KV_HEADS * HEAD_DIM)  # hidden -> kv_heads x head_dim
    o = r * (HEADS * HEAD_DIM + H)
    gate = up = r * (H + MLP)
    down = r * (MLP + H)
    return LAYERS * (q + k + v + o + gate + up + down)


def lora_recipe(rank: int, **sections) -> dict:
    raw = gpu_recipe(**sections)
    raw["model"]["lora"] = {"rank": rank, **raw["model"].get("lora", {})}
    return raw


def test_qwen3_8b_rank_32_adapter_count_is_the_hand_computed_one():
    cfg = build_config(lora_recipe(32))
    shape = model_shape("Qwen/Qwen3-8B")
    assert lora_adapter_params(shape, cfg.model.lora) == qwen3_8b_adapter_by_hand(32)
    assert qwen3_8b_adapter_by_hand(32) == 87_293_952  # 1.07% of 8,190,735,360
    # q and v only: 36 x 32 x ((4096 + 4096) + (4096 + 1024))
    qv = build_config(lora_recipe(32, model={"lora": {"target_modules": ["q_proj", "v_proj"]}}))
    assert lora_adapter_params(shape, qv.model.lora) == 36 * 32 * (8192 + 5120) == 15_335_424


def test_the_adapter_count_is_what_the_trainer_adapts():
    import torch
    from transformers import Qwen3ForCausalLM

    from benchmarks.gpu_check import qwen3_config
    from runtime.engines.torch.lora import apply_lora, trainable

    shape = model_shape("Qwen/Qwen3-0.6B")
    config = qwen3_config(shape, max_positions=4096)
    for targets in (ALL_7, ["q_proj", "down_proj"]):
        cfg = build_config(lora_recipe(16, model={"lora": {"target_modules": targets}}))
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
        apply_lora(model, cfg.model.lora, torch.bfloat16)
        built = sum(p.numel() for p in trainable(model))
        assert built == lora_adapter_params(shape, cfg.model.lora), targets
    # lm_head is not in a block: the trainer refuses it, naming it
    cfg = build_config(lora_recipe(16, model={"lora": {"target_modules": ["q_proj", "lm_head"]}}))
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    with pytest.raises(ValueError, match="lm_head is not a linear layer"):
        apply_lora(model, cfg.model.lora, torch.bfloat16)


def test_a_target_list_with_no_linear_layer_is_one_line():
    cfg = build_config(lora_recipe(8, model={"lora": {"target_modules": ["lm_head"]}}))
    with pytest.raises(ArchitectureError, match=r"^model\.lora\.target_modules: none of"):
        plan_memory(cfg, 80 * GIB)


@pytest.mark.parametrize(
    ("gpu_gib", "trainer_gpus"),
    [(80, 4), (140, 1)],  # 4 x 80 GB (H100/H800), one H200 (about 140 GiB as torch reports)
)
def test_qwen3_32b_fits_its_trainer_replica_only_with_lora(gpu_gib, trainer_gpus):
    def plan_of(rank: int):
        raw = lora_recipe(
            rank,
            model={"path": "Qwen/Qwen3-32B"},
            resources={"trainer_gpus_per_replica": trainer_gpus, "rollout_gpus_per_replica": 4},
        )
        return plan_memory(build_config(raw, source="recipes/x.yaml"), gpu_gib * GIB)

    full, lora = plan_of(0), plan_of(32)
    n = model_shape("Qwen/Qwen3-32B").total_params
    # hidden 5,120, 64 heads and 8 KV heads of 128, MLP 25,600, 64 layers
    adapters = 64 * 32 * (2 * (5120 + 8192) + 2 * (5120 + 1024) + 3 * (5120 + 25600))
    assert lora.trainer.lora.adapter_params == adapters == 268_435_456
    # full: 16 B a parameter of state alone is more than the GPU holds
    line = full.refusal()
    assert line is not None and "\n" not in line and "its state alone needs" in line
    assert full.trainer.state_bytes == 16 * math.ceil(n / trainer_gpus)
    # LoRA: the base in bf16 without gradients or AdamW, the float32 adapters with both
    t = lora.trainer
    assert lora.refusal() is None and t.total_bytes <= gpu_gib * GIB
    assert t.base_bytes == 2 * math.ceil(n / trainer_gpus)
    local = math.ceil(adapters / trainer_gpus)
    assert (t.adapter_bytes, t.grads_bytes, t.optimizer_bytes) == (4 * local, 4 * local, 8 * local)
    assert t.state_bytes == t.base_bytes + 16 * local
    # activations: the base's, plus A's output (r values in bf16) of each adapted layer
    extra = 7 * 32 * 2
    tokens = t.tokens_per_pass
    assert t.activations_checkpointed - full.trainer.activations_checkpointed == tokens * extra
    assert t.activations_full - full.trainer.activations_full == tokens * 64 * extra
    assert t.largest_pass_tokens is not None and full.trainer.largest_pass_tokens is None


def test_the_lora_line_and_the_state_rows():
    t = plan_memory(build_config(lora_recipe(32)), 80 * GIB).trainer
    a = qwen3_8b_adapter_by_hand(32)
    line = t.lora.line()
    assert line.startswith(
        f"LoRA rank 32 on {', '.join(ALL_7)}: {a:,} adapter parameters (1.07% of "
        "8,190,735,360), base frozen in bfloat16; a weight sync sends the adapter, "
        "0.16 GiB (1.07% of the model's 15.26 GiB)"
    )
    labels = [label for label, _, _ in t.state_rows()]
    assert labels == [
        "frozen base (bfloat16)",
        "LoRA adapters r=32 (float32)",
        "adapter gradients (float32)",
        "adapter AdamW state (2 x float32)",
    ]
    assert sum(n for _, n, _ in t.state_rows()) == t.state_bytes
    merged = plan_memory(build_config(lora_recipe(32, model={"lora": {"sync": "merged"}})), None)
    assert merged.trainer.lora.sync_bytes == merged.trainer.lora.full_sync_bytes
    assert "sends the merged model" in merged.trainer.lora.line()
    full = plan_memory(build_config(gpu_recipe()), 80 * GIB).trainer
    assert full.lora is None and full.state_rows()[0][0] == "parameters (float32 master)"


def test_a_replicated_lora_trainer_keeps_its_bf16_base_on_a_rollout_rank():
    raw = lora_recipe(16, model={"path": "Qwen/Qwen3-1.7B", "max_seq_len": 4096})
    raw["workload"]["max_response_tokens"] = 2048
    raw["train"]["strategy"] = "replicate"
    p = plan_memory(build_config(raw), 80 * GIB)
    shape = model_shape("Qwen3-1.7B")
    adapters = p.trainer.lora.adapter_params
    assert p.rollout.resident_trainer_bytes == 2 * shape.total_params + 12 * adapters
    # autocast casts only the float32 adapters; the base is bf16 already
    assert p.trainer.working_bytes == 2 * adapters


# --- the simulator --------------------------------------------------------------------


def agent_recipe(*sets: str):
    """The APPS agent recipe (Qwen3-8B) cut to 8 steps, a weight sync every 2."""
    return load_recipe(
        REPO / "recipes" / "apps_coding.yaml", ["train.steps=8", "train.sync_every=2", *sets]
    )


def test_a_lora_sync_sends_the_adapter_and_keeps_the_fixed_part():
    model = PROFILES.model("qwen3-8b")
    costs = lora_costs(model, agent_recipe("model.lora.rank=32").model)
    n = 8_190_735_360
    # the adapters over the model, both bf16: 1.07% of the parameters
    assert costs.sync_share == pytest.approx(qwen3_8b_adapter_by_hand(32) / n)
    assert 0.0105 < costs.sync_share < 0.011
    fixed = model.weight_sync_fixed_s
    assert fixed == 0.86  # profiles.yaml: 2.5 s - 16.4 GB / 10 GB/s
    assert costs.weight_sync_s == pytest.approx(fixed + (2.5 - fixed) * costs.sync_share)
    # merged: the whole model, as without LoRA
    merged = lora_costs(model, agent_recipe("model.lora.rank=32", "model.lora.sync=merged").model)
    assert merged.sync_share == 1.0 and merged.weight_sync_s == model.weight_sync_s
    assert lora_costs(model, agent_recipe().model) is None
    # a fitted profile's rates are a run's own: left alone
    fitted = dataclasses.replace(model, params_b=0.0)
    assert lora_profile(fitted, agent_recipe("model.lora.rank=32").model) == fitted


def test_a_lora_trainer_step_skips_the_base_weight_gradients():
    model = PROFILES.model("qwen3-8b")
    lora = lora_profile(model, agent_recipe("model.lora.rank=32").model)
    n, a = 8_190_735_360, qwen3_8b_adapter_by_hand(32)
    assert lora.train_tok_s == pytest.approx(model.train_tok_s * 8 * n / (6 * n + 8 * a))
    # the old log-prob pass (a forward) keeps its seconds per token
    assert lora.logprob_fraction / lora.train_tok_s == pytest.approx(
        model.logprob_fraction / model.train_tok_s
    )
    # a role switch moves the bf16 base + 16 B per adapter parameter, not 16 B a parameter
    assert lora.trainer_state_bytes_per_param == pytest.approx((2 * n + 16 * a) / n)
    to_trainer = sum(lora.switch_phases("rollout", "trainer").values())
    assert to_trainer < sum(model.switch_phases("rollout", "trainer").values())


def test_a_simulated_lora_run_syncs_1_percent_of_the_bytes_and_trains_cheaper():
    full = simulate(plan(agent_recipe(), 16, mode="reflow"))
    lora = simulate(plan(agent_recipe("model.lora.rank=32"), 16, mode="reflow"))
    for r in (full, lora):
        assert r.summary["state"] == "COMPLETED" and r.summary["samples"]["lost"] == 0
        assert r.weight_syncs >= 3
    share = lora.weight_sync_bytes / full.weight_sync_bytes
    assert share == pytest.approx(qwen3_8b_adapter_by_hand(32) / 8_190_735_360)
    assert full.weight_sync_s == 2.5 and 0.86 < lora.weight_sync_s < 0.9
    # trainer GPU-seconds per trained token: cheaper (no base weight gradients), not free
    per_token = [r.trainer_gpu_busy_s / r.trained_tokens for r in (full, lora)]
    assert 0.7 < per_token[1] / per_token[0] < 0.8


def test_the_rollout_plan_holds_vllms_adapter_slots():
    """vLLM's two adapter slots at max_lora_rank, for every LoRA module of every layer
    whatever the adapter targets, in model.dtype: Qwen3-8B at rank 32 (bf16), by hand
    36 x 32 x 2 x 2 B x ((4096+4096) + 2 (4096+1024) + (4096+4096) + 2 (4096+12288)
    + (12288+4096)) = 349,175,808 bytes out of the KV cache; a merged sync has none."""
    full = plan_memory(build_config(gpu_recipe()), 80 * GIB).rollout
    lora = plan_memory(
        build_config(lora_recipe(32, model={"lora": {"target_modules": ["q_proj"]}})), 80 * GIB
    ).rollout
    assert lora.weights_bytes - full.weights_bytes == 349_175_808
    assert full.kv_bytes - lora.kv_bytes == 349_175_808
    merged = lora_recipe(32, model={"lora": {"sync": "merged"}})
    assert plan_memory(build_config(merged), 80 * GIB).rollout.weights_bytes == full.weights_bytes
    odd = plan_memory(build_config(lora_recipe(20)), 80 * GIB).rollout  # served at rank 32
    assert odd.weights_bytes == lora.weights_bytes
