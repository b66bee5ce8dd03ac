"""LoRA in the trainer (model.lora): a frozen base, adapters that train and publish in
peft's format, a merged sync equal to the adapted model, state kept bit-exact."""

import json

import pytest
import torch
from safetensors.torch import load_file

from runtime.config.lora_config import LoraConfig
from runtime.config.recipe import RecipeError, build_config
from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.lora import LoraLinear
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.weights import lora_format
from tests.unit.test_trainer import batch

LORA = {"rank": 4, "alpha": 8.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return save_pretrained(build_model(seed=3), build_tokenizer(), path)


def cfg(lora=LORA, **train):
    return build_config({"train": {"lr": 1e-2, **train}, "model": {"path": "x", "lora": lora}})


def state(t: TorchTrainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in t.model.state_dict().items()}


def logits(t: TorchTrainer, ids: list[int]) -> torch.Tensor:
    t.model.eval()
    with torch.no_grad():
        out = t.model(input_ids=torch.tensor([ids])).logits
    t.model.train()
    return out


def test_only_the_adapters_train_and_step_zero_is_the_base(model_dir):
    full = TorchTrainer(TorchTrainerConfig.from_config(cfg(lora={"rank": 0})), str(model_dir))
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    adapted = [m for m in t.model.modules() if isinstance(m, LoraLinear)]
    assert len(adapted) == 2 * 7  # two blocks, every linear layer of each
    names = [n for n, p in t.model.named_parameters() if p.requires_grad]
    assert names and all(lora_format.is_adapter_name(n + "") for n in names)
    opt_params = [p for g in t.opt.param_groups for p in g["params"]]
    assert len(opt_params) == len(names)  # AdamW holds no state for the frozen base
    ids = batch(0)[0].prompt_token_ids
    assert torch.allclose(logits(t, ids), logits(full, ids), atol=1e-6)  # B = 0
    before = state(t)
    t.train_step(batch(0))
    after = state(t)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(lora_format.is_adapter_name(k) for k in changed)
    assert any(k.endswith("lora_B.weight") for k in changed)
    assert all(p.grad is None for n, p in t.model.named_parameters() if not p.requires_grad)


def test_a_merged_sync_is_the_adapted_model(model_dir):
    t = TorchTrainer(
        TorchTrainerConfig.from_config(cfg(lora={**LORA, "sync": "merged"})), str(model_dir)
    )
    t.train_step(batch(1))
    merged = t.for_rollout(t.export_weights())
    assert not any(lora_format.is_adapter_name(k) for k in merged)
    plain = TorchTrainer(TorchTrainerConfig.from_config(cfg(lora={"rank": 0})), str(model_dir))
    missing, unexpected = plain.model.load_state_dict(merged, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    ids = batch(1)[0].prompt_token_ids
    assert torch.allclose(logits(plain, ids), logits(t, ids), atol=1e-5)


def test_an_adapter_sync_and_the_published_folder_are_peft_format(model_dir, tmp_path):
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    t.train_step(batch(2))
    sent = t.for_rollout(t.export_weights())
    assert sent and all(k.startswith("base_model.model.model.layers.") for k in sent)
    assert all(v.dtype == torch.float32 for v in sent.values())
    folder = t.publish(tmp_path / "weights")
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    assert config["target_modules"] == sorted(LoraConfig().target_modules)
    on_disk = load_file(str(folder / "adapter_model.safetensors"))
    assert on_disk.keys() == sent.keys()
    assert all(torch.equal(on_disk[k], sent[k]) for k in sent)
    assert not (folder / "model.safetensors").exists()
    _, read = lora_format.read_adapter(folder)
    assert read.keys() == sent.keys()


def test_adapters_and_their_optimizer_state_survive_save_and_load(model_dir, tmp_path):
    a = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    a.train_step(batch(1))
    a.save_state(tmp_path / "state")
    a.train_step(batch(2))
    b = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    b.load_state(tmp_path / "state")
    b.train_step(batch(2))
    after_a, after_b = state(a), state(b)
    assert all(torch.equal(after_a[k], after_b[k]) for k in after_a)


def test_offload_copies_the_base_once_and_keeps_everything_bit_exact(model_dir):
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    with torch.no_grad():  # an allocation of its own per parameter, as on CUDA
        for p in t.model.parameters():
            p.data = p.data.clone()
    t.train_step(batch(1))
    nbytes = {
        train: sum(
            p.numel() * p.element_size() for p in t.model.parameters() if p.requires_grad == train
        )
        for train in (True, False)
    }
    first = t.offload(move=True)
    assert all(p.untyped_storage().nbytes() == 0 for p in t.model.parameters())
    assert first.bytes >= 3 * nbytes[True] + nbytes[False]  # adapters, moments, base
    t.reload()
    t.train_step(batch(2))
    before = state(t)
    moments = {id(p): {k: v.clone() for k, v in s.items()} for p, s in t.opt.state.items()}
    second = t.offload(move=True)
    assert second.bytes < first.bytes - nbytes[False] // 2  # the base was not copied again
    assert second.bytes >= 3 * nbytes[True]
    t.reload()
    assert all(torch.equal(before[k], v) for k, v in state(t).items())
    for p, s in t.opt.state.items():
        assert all(torch.equal(moments[id(p)][k], v) for k, v in s.items())
    t.train_step(batch(3))  # and it trains on


def test_a_target_that_is_no_linear_layer_is_one_line_naming_the_field(model_dir):
    with pytest.raises(ValueError, match=r"model.lora.target_modules"):
        TorchTrainer(
            TorchTrainerConfig.from_config(cfg(lora={"rank": 4, "target_modules": ["qproj"]})),
            str(model_dir),
        )


def test_the_recipe_checks_lora_fields():
    with pytest.raises(RecipeError, match=r"model.lora.sync"):
        cfg(lora={"rank": 4, "sync": "nccl"})
    with pytest.raises(RecipeError, match=r"model.lora.rank"):
        cfg(lora={"rank": -1})
    assert not cfg(lora={"rank": 0}).model.lora.enabled
    with pytest.raises(RecipeError, match=r"model.lora.rank.*engine.trainer: torch"):
        build_config({"model": {"lora": {"rank": 4}}, "engine": {"trainer": "synthetic"}})


def test_a_lora_engine_keeps_its_base_when_it_sleeps():
    """Level 2 drops the engine's weights, to be replaced by the next sync; a LoRA run's
    syncs send the adapter only, so its engine sleeps at level 1 (the base kept)."""
    from types import SimpleNamespace

    from runtime.engines.vllm.rollout import VLLMRolloutSide

    def level(serves_adapter: bool) -> int:
        engine = SimpleNamespace(serves_adapter=serves_adapter)
        return VLLMRolloutSide.sleep_level(SimpleNamespace(sync=object(), engine=engine))

    assert level(serves_adapter=False) == 2
    assert level(serves_adapter=True) == 1


def test_activation_checkpointing_and_micro_batches_train_the_same_adapters(model_dir):
    """Every block recomputed in the backward (the frozen base's inputs carry no gradient:
    the non-reentrant checkpoint still reaches the adapters) and the batch in micro-batches:
    the adapters end where one plain pass leaves them."""
    plain = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    other = TorchTrainer(
        TorchTrainerConfig.from_config(
            cfg(activation_checkpointing=True, micro_batch_tokens=64, mini_batches=1)
        ),
        str(model_dir),
    )
    assert other.config.train.activation_checkpointing
    start = state(plain)
    plain.train_step(batch(4))
    m = other.train_step(batch(4))
    assert m["micro_steps"] > 1
    a, b = state(plain), state(other)
    assert any(not torch.equal(a[k], start[k]) for k in a if k.endswith("lora_B.weight"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_a_sharded_leaders_eval_copy_carries_the_adapters(model_dir):
    """The plain model a sharded trainer's leader generates with (evals) is the trained
    policy, its adapters merged in, not the base with them dropped."""
    from runtime.engines.torch.policy_files import plain_model

    t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    t.train_step(batch(5))
    t.train_step(batch(6))
    copy = plain_model(str(model_dir), t.export_weights(), t.config.model)
    ids = batch(5)[0].prompt_token_ids
    base = logits(
        TorchTrainer(TorchTrainerConfig.from_config(cfg(lora={"rank": 0})), str(model_dir)), ids
    )
    assert not torch.allclose(logits(t, ids), base, atol=1e-4)  # the adapters matter
    copy.eval()
    with torch.no_grad():
        got = copy(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(got, logits(t, ids), rtol=0, atol=1e-5)


def test_a_bfloat16_base_keeps_float32_buffers_and_generates_outside_autocast(model_dir):
    """train.param_dtype bfloat16 (CUDA's default): the frozen base's parameters in
    bfloat16, its buffers (rotary inv_freq) still float32 as the rollout engine's, and the
    model generates with no autocast (an eval) though its adapters are float32."""
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg(param_dtype="bfloat16")), str(model_dir))
    base = [p for p in t.model.parameters() if not p.requires_grad]
    assert base and all(p.dtype == torch.bfloat16 for p in base)
    assert all(p.dtype == torch.float32 for p in t.model.parameters() if p.requires_grad)
    assert all(b.dtype == torch.float32 for n, b in t.model.named_buffers() if "inv_freq" in n)
    t.train_step(batch(1))
    t.model.eval()
    ids = torch.tensor([batch(1)[0].prompt_token_ids])
    with torch.no_grad():
        out = t.model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def test_dropout_leaves_the_old_policys_logprobs_deterministic(model_dir):
    """With adapter dropout the update trains through it, but the old policy's log-probs
    (the PPO ratio's denominator) are the whole policy's: the same at the same weights."""
    t = TorchTrainer(
        TorchTrainerConfig.from_config(cfg(lora={**LORA, "dropout": 0.5})), str(model_dir)
    )
    t.train_step(batch(1))  # B != 0, so dropout on the adapters' input changes outputs
    rows = batch(2)
    plan = [list(range(len(rows)))]
    first, second = t._old_logprobs(rows, plan), t._old_logprobs(rows, plan)
    assert all(torch.equal(first[i], second[i]) for i in first)
    t.model.train()
    with torch.no_grad():
        a, b = t._forward(rows), t._forward(rows)
    assert not torch.equal(a, b)  # the training forward does drop out


def test_a_merge_keeps_a_delta_a_bfloat16_base_cannot_hold():
    w = torch.ones(4, 4, dtype=torch.bfloat16)
    a, b = torch.ones(1, 4), torch.full((4, 1), 1e-4)
    merged = lora_format.merged_weight(w, a, b, 1.0, dtype=torch.float32)
    assert merged.dtype == torch.float32
    torch.testing.assert_close(merged, torch.full((4, 4), 1.0001), rtol=0, atol=1e-6)
    assert torch.equal(lora_format.merged_weight(w, a, b, 1.0), w)  # lost in bf16


def test_every_target_must_name_a_layer(model_dir):
    with pytest.raises(ValueError, match=r"model\.lora\.target_modules: o_prj is not"):
        TorchTrainer(
            TorchTrainerConfig.from_config(
                cfg(lora={"rank": 4, "target_modules": ["q_proj", "o_prj"]})
            ),
            str(model_dir),
        )
