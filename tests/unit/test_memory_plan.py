"""The memory plan (runtime/config/memory_plan.py) against figures worked out by hand, the
model shapes (runtime/config/architectures.py) against the models transformers builds, and
the refusal line of a recipe that cannot fit."""

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from runtime.config.architectures import KNOWN, ArchitectureError, model_shape
from runtime.config.memory_plan import (
    GIB,
    ROLLOUT_RESERVE_BYTES,
    VLLM_GPU_MEMORY_UTILIZATION,
    kv_bytes_per_token,
    plan_memory,
)
from runtime.config.recipe import build_config, load_recipe

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GPU_80 = 80 * GIB

# Qwen3-8B (huggingface.co/Qwen/Qwen3-8B config.json), written out here by hand.
H, LAYERS, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 4096, 36, 32, 8, 128, 12288, 151936


def qwen3_8b_parameters_by_hand() -> int:
    embedding = VOCAB * H
    q = H * (HEADS * HEAD_DIM)
    k = v = H * (KV_HEADS * HEAD_DIM)
    o = (HEADS * HEAD_DIM) * H
    q_norm = k_norm = HEAD_DIM
    gate = up = down = H * MLP
    norms = 2 * H  # input_layernorm, post_attention_layernorm
    layer = q + k + v + o + q_norm + k_norm + gate + up + down + norms
    final_norm = H
    lm_head = VOCAB * H  # not tied in Qwen3-8B
    return embedding + LAYERS * layer + final_norm + lm_head


def gpu_recipe(**sections) -> dict:
    """A GPU recipe of Qwen3-8B on 2 nodes of 8 GPUs (one FSDP2 group of 8 and 8 TP1
    engines) that fits 80 GiB, sections overridden."""
    raw = {
        "model": {"path": "Qwen/Qwen3-8B", "dtype": "bfloat16", "max_seq_len": 8192},
        "workload": {"kind": "math", "max_response_tokens": 6144},
        "train": {"batch_size": 64, "micro_batch_tokens": 16384, "activation_checkpointing": True},
        "resources": {
            "nodes": 2,
            "gpus_per_node": 8,
            "trainer_gpus_per_replica": 8,
            "initial_ratio": "8:8",
            "device": "cuda",
        },
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


def test_qwen3_8b_parameter_count_is_the_hand_computed_one():
    n = model_shape("Qwen/Qwen3-8B").total_params
    assert n == qwen3_8b_parameters_by_hand() == 8_190_735_360
    assert model_shape("/models/Qwen3-8B").total_params == n  # the table, by the last part
    assert model_shape("Qwen/Qwen3-8B-Base").total_params == n


def test_qwen3_8b_kv_bytes_per_token_is_the_hand_computed_one():
    shape = model_shape("Qwen/Qwen3-8B")
    assert kv_bytes_per_token(shape, "bfloat16", 1) == 2 * 36 * 8 * 128 * 2 == 147_456
    assert kv_bytes_per_token(shape, "bfloat16", 2) == 147_456 // 2
    assert kv_bytes_per_token(shape, "float32", 1) == 2 * 147_456
    # 16 GPUs, 8 KV heads: vLLM replicates a head on each GPU rather than split it
    assert kv_bytes_per_token(shape, "bfloat16", 16) == 2 * 36 * 1 * 128 * 2


def test_the_dapo_recipe_plan_per_shard_and_per_engine():
    cfg = load_recipe(REPO / "recipes" / "dapo_math.yaml", ["resources.nodes=16"])
    plan = plan_memory(cfg, GPU_80)
    n = qwen3_8b_parameters_by_hand()
    t, r = plan.trainer, plan.rollout
    # fsdp2 over trainer_gpus_per_replica = 8 ranks: float32 master, grads, two moments
    assert (t.strategy, t.shard_ranks, t.param_dtype) == ("fsdp2", 8, "bfloat16")
    assert t.params_bytes == t.grads_bytes == 4 * math.ceil(n / 8)
    assert t.optimizer_bytes == 8 * math.ceil(n / 8)
    # the recipe's micro-batches: 45,056 tokens a pass, under its 87,040 that fit; without
    # them a pass would take the rank's share of an update, 512 samples over the 32 trainer
    # ranks of 128 (rollout 0.75), which does not fit
    assert t.tokens_per_pass == 45_056 and t.largest_pass_tokens_checkpointed == 87_040
    assert t.activations_checkpointed < t.activations_full
    whole = plan_memory(
        load_recipe(
            REPO / "recipes" / "dapo_math.yaml",
            ["resources.nodes=16", "train.micro_batch_tokens=null"],
        ),
        GPU_80,
    )
    assert whole.trainer.tokens_per_pass == (512 // 32) * 22528
    assert whole.refusal() is not None
    # vLLM at TP1: bf16 weights, then 0.92 x 80 GiB - weights - reserve of KV cache, in
    # blocks of 16 tokens of 147,456 B
    assert r.weights_bytes == 2 * n
    kv = math.floor(0.92 * 80 * 2**30) - 2 * n - 4 * 2**30
    assert r.kv_bytes == kv
    assert r.kv_tokens == kv // (147_456 * 16) * 16 == 395_712
    assert r.largest_response_tokens == 395_712 - (22528 - 20480)
    assert r.fits_max_seq_len


def test_a_whole_qwen3_32b_per_rank_is_refused_with_one_line():
    cfg = build_config(
        gpu_recipe(model={"path": "Qwen/Qwen3-32B"}, train={"strategy": "replicate"}),
        source="recipes/x.yaml",
    )
    plan = plan_memory(cfg, GPU_80)
    n = model_shape("Qwen/Qwen3-32B").total_params
    assert plan.trainer.params_bytes == 4 * n  # a whole float32 copy
    line = plan.refusal()
    assert line is not None and "\n" not in line
    needed = plan.trainer.total_bytes / GIB
    assert needed > 16 * n / GIB  # weights, gradients and AdamW alone are 16 B a parameter
    assert line.startswith(
        f"trainer role needs {needed:.1f} GiB per GPU, 80.0 GiB available "
        "(Qwen3-32B, replicate: a whole copy per rank)"
    )
    assert "train.strategy: fsdp2" in line


def test_fsdp2_over_too_few_ranks_names_the_shard_group():
    cfg = build_config(
        gpu_recipe(
            model={"path": "Qwen/Qwen3-32B"},
            resources={"trainer_gpus_per_replica": 2, "initial_ratio": "14:2"},
        )
    )
    line = plan_memory(cfg, GPU_80).refusal()
    assert re.match(
        r"trainer role needs \d+\.\d GiB per GPU, 80\.0 GiB available "
        r"\(Qwen3-32B, fsdp2 over 2 ranks\); its state alone needs \d+\.\d GiB: shard it",
        line,
    ), line


def test_the_suggested_micro_batch_fits_and_the_next_size_does_not():
    raw = gpu_recipe()
    cfg = build_config(raw)
    largest = plan_memory(cfg, GPU_80).trainer.largest_pass_tokens
    assert largest is not None and largest >= 8192
    raw["train"]["micro_batch_tokens"] = largest
    assert plan_memory(build_config(raw), GPU_80).refusal() is None
    raw["train"]["micro_batch_tokens"] = largest + 1024  # rounded down to 1024s: past it
    line = plan_memory(build_config(raw), GPU_80).refusal()
    assert line.startswith("trainer role needs ") and f"<= {largest} would fit" in line


def test_rollout_is_refused_when_one_sequence_does_not_fit_the_kv_cache():
    # Qwen3-32B at TP1: 61 GiB of bf16 weights leave ~8.6 GiB of KV (35k tokens) at 0.92
    raw = gpu_recipe(
        model={"path": "Qwen/Qwen3-32B", "max_seq_len": 40960},
        workload={"max_response_tokens": 32768},
        engine={"trainer": "synthetic"},
    )
    plan = plan_memory(build_config(raw), GPU_80)
    assert plan.trainer is None and not plan.rollout.fits_max_seq_len
    line = plan.refusal()
    assert line.startswith("rollout role needs ") and "model.max_seq_len=40960" in line
    assert "GiB available (gpu_memory_utilization 0.92 of 80.0 GiB; Qwen3-32B, TP 1)" in line
    raw["resources"]["rollout_gpus_per_replica"] = 2  # half the weights, half the KV/token
    assert plan_memory(build_config(raw), GPU_80).refusal() is None


def test_a_set_kv_cache_size_is_the_engines_and_must_hold_one_sequence():
    raw = gpu_recipe(engine={"kv_cache_memory_bytes": 2**30})
    r = plan_memory(build_config(raw), GPU_80).rollout
    assert r.utilization is None and r.kv_bytes == 2**30
    assert r.kv_tokens == 2**30 // (147_456 * 16) * 16  # 7,280: under max_seq_len 8192
    line = plan_memory(build_config(raw), GPU_80).refusal()
    assert line.startswith("rollout role needs 1.1 GiB of KV cache per GPU for one sequence")


def test_the_replicated_trainer_on_a_rollout_rank_leaves_vllm_too_little():
    # replicate builds the trainer on every rank's GPU, rollout ranks included
    raw = gpu_recipe(
        model={"path": "Qwen/Qwen3-1.7B", "max_seq_len": 4096},
        workload={"max_response_tokens": 2048},
        train={"strategy": "replicate"},
    )
    plan = plan_memory(build_config(raw), GPU_80)
    n = model_shape("Qwen3-1.7B").total_params
    assert plan.trainer.total_bytes < GPU_80
    assert plan.rollout.resident_trainer_bytes == 12 * n
    line = plan.refusal()
    assert line.startswith("rollout role needs ") and "replicated trainer" in line


def test_every_shipped_recipe_plans():
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert len(recipes) >= 8
    for path in recipes:
        cfg = load_recipe(path)
        on_gpu = cfg.resources.device != "cpu"
        plan = plan_memory(cfg, GPU_80 if on_gpu else None)
        assert plan.trainer.total_bytes > 0 and plan.rollout.kv_bytes_per_token > 0, path
        if on_gpu:
            assert plan.model.name.startswith("Qwen3-"), path
            assert plan.rollout.kv_tokens > cfg.model.max_seq_len, path
        else:  # the embedded models: tiny figures, and a CPU run is never refused
            assert plan.trainer.total_bytes < GIB, path
            assert plan.refusal() is None, path


def test_a_cpu_run_is_never_refused():
    cfg = load_recipe(REPO / "recipes" / "demo.yaml", ["model.max_seq_len=100000"])
    plan = plan_memory(cfg, None)
    assert plan.gpu_bytes is None and plan.refusal() is None
    assert plan.trainer.reserve_bytes == 0 and plan.trainer.largest_pass_tokens is None


def test_known_shapes_count_what_transformers_builds():
    import torch  # a dependency of the project: a missing one is a failure, not a skip
    from transformers import Qwen3Config, Qwen3ForCausalLM

    # the parameter counts of ../shared/notes/cluster-profile.md (derived from slime's
    # model scripts), to the digits it gives
    published = {"Qwen3-4B": 4.02e9, "Qwen3-8B": 8.19e9, "Qwen3-14B": 14.77e9, "Qwen3-32B": 32.76e9}
    for shape in KNOWN.values():
        if shape.is_moe:
            continue  # the next test's
        config = Qwen3Config(
            vocab_size=shape.vocab,
            hidden_size=shape.hidden,
            intermediate_size=shape.intermediate,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            tie_word_embeddings=shape.tied,
        )
        with torch.device("meta"):
            model = Qwen3ForCausalLM(config)
        unique = {id(p): p.numel() for p in model.parameters()}  # a tied head counts once
        assert sum(unique.values()) == shape.total_params, shape.name
        assert sum(p.numel() for p in model.model.layers[0].parameters()) == shape.block_params
        if shape.name in published:
            assert round(shape.total_params / 1e7) == round(published[shape.name] / 1e7)


def test_moe_shapes_count_what_transformers_builds_and_the_published_sizes():
    """Qwen3-MoE, total and active: on the meta device for the table's two, and a shape read
    from a small config.json the same way."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from runtime.config.architectures import shape_from_config

    # Qwen's model cards: 30.5B total / 3.3B activated, 235B / 22B
    published = {"Qwen3-30B-A3B": (30.5e9, 3.3e9), "Qwen3-235B-A22B": (235e9, 22e9)}
    small = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 256,
        "moe_intermediate_size": 32,
        "num_experts": 6,
        "num_experts_per_tok": 2,
        "vocab_size": 300,
        "tie_word_embeddings": False,
    }
    shapes = [s for s in KNOWN.values() if s.is_moe] + [shape_from_config(small, "s", "t")]
    assert [s.name for s in shapes] == ["Qwen3-30B-A3B", "Qwen3-235B-A22B", "s"]
    for shape in shapes:
        config = Qwen3MoeConfig(
            vocab_size=shape.vocab,
            hidden_size=shape.hidden,
            intermediate_size=1,  # no dense block: every one is sparse
            moe_intermediate_size=shape.moe_intermediate,
            num_experts=shape.experts,
            num_experts_per_tok=shape.experts_per_token,
            num_hidden_layers=shape.layers,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            tie_word_embeddings=shape.tied,
        )
        with torch.device("meta"):
            model = Qwen3MoeForCausalLM(config)
        assert sum(p.numel() for p in model.parameters()) == shape.total_params, shape.name
        assert sum(p.numel() for p in model.model.layers[0].parameters()) == shape.block_params
        if shape.name in published:
            total, active = published[shape.name]
            assert abs(shape.total_params / total - 1) < 0.01
            assert abs(shape.active_params / active - 1) < 0.02
    # a dense model is all active
    dense = KNOWN["qwen3-8b"]
    assert dense.active_params == dense.total_params and not dense.is_moe
    with pytest.raises(ArchitectureError, match="mixes dense and sparse blocks"):
        shape_from_config({**small, "mlp_only_layers": [1]}, "s", "t")


def test_embedded_shapes_are_the_models_runtime_embedded_builds():
    from runtime.embedded import tiny_chat, tiny_qwen3
    from runtime.embedded.resolve import EMBEDDED, EMBEDDED_CHAT, EMBEDDED_SMALL

    small = {k: v for k, v in tiny_qwen3.SMALL.items() if k != "seed"}
    for name, model in (
        (EMBEDDED, tiny_qwen3.build_model()),
        (EMBEDDED_CHAT, tiny_chat.build_model()),
        (EMBEDDED_SMALL, tiny_qwen3.build_model(**small)),
    ):
        shape, config = model_shape(name), model.config
        unique = {id(p): p.numel() for p in model.parameters()}
        assert sum(unique.values()) == shape.total_params, name
        got = (
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
            config.vocab_size,
            config.tie_word_embeddings,
        )
        assert got == (
            shape.hidden,
            shape.layers,
            shape.heads,
            shape.kv_heads,
            shape.head_dim,
            shape.intermediate,
            shape.vocab,
            shape.tied,
        ), name


def test_a_moe_folder_transformers_5_saved_is_read(tmp_path):
    from runtime.embedded import tiny_qwen3
    from runtime.embedded.resolve import EMBEDDED_MOE

    folder = tiny_qwen3.save_pretrained(
        tiny_qwen3.build_moe_model(), tiny_qwen3.build_tokenizer(), tmp_path / "moe"
    )
    config = json.loads((folder / "config.json").read_text())
    assert "num_local_experts" in config and "num_experts" not in config  # its own key
    shape = model_shape(str(folder))
    assert (shape.experts, shape.total_params) == (4, model_shape(EMBEDDED_MOE).total_params)


@pytest.mark.parametrize("upcycled", [False, True], ids=["moe", "moe-upcycled"])
def test_the_embedded_moe_shape_is_the_model_build_moe_model_builds(upcycled):
    from runtime.embedded import tiny_qwen3
    from runtime.embedded.resolve import EMBEDDED_MOE, EMBEDDED_MOE_UPCYCLED

    if upcycled:
        name, model = EMBEDDED_MOE_UPCYCLED, tiny_qwen3.upcycle_to_moe(tiny_qwen3.build_model())
    else:
        name, model = EMBEDDED_MOE, tiny_qwen3.build_moe_model()
    shape, config = model_shape(name), model.config
    unique = {id(p): p.numel() for p in model.parameters()}
    assert sum(unique.values()) == shape.total_params
    assert (config.num_experts, config.num_experts_per_tok, config.moe_intermediate_size) == (
        shape.experts,
        shape.experts_per_token,
        shape.moe_intermediate,
    )
    assert shape.is_moe and shape.active_params < shape.total_params


def test_a_local_config_json_wins_over_the_table(tmp_path):
    folder = tmp_path / "Qwen3-8B"  # a name in the table, but a folder with another shape
    folder.mkdir()
    config = {
        "model_type": "qwen2",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    shape = model_shape(str(folder))
    assert (shape.head_dim, shape.attention_bias, shape.qk_norm) == (16, True, False)
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + (64 + 2 * 32) + 3 * 64 * 128 + 2 * 64
    assert shape.total_params == 100 * 64 + 2 * layer + 64 + 100 * 64
    assert shape.source == str(folder / "config.json")


def test_a_shape_that_cannot_be_known_is_one_line_naming_model_path(tmp_path):
    with pytest.raises(ArchitectureError, match=r"^model.path: /nowhere/Mystery-7B has no"):
        model_shape("/nowhere/Mystery-7B")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "deepseek_v3"}))
    with pytest.raises(ArchitectureError, match=r"model_type 'deepseek_v3'.*qwen3_moe"):
        model_shape(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ArchitectureError, match="has no hidden_size"):
        model_shape(str(tmp_path))


def test_the_default_utilization_is_the_installed_vllms():
    """rollout.py passes vLLM no gpu_memory_utilization: the plan must assume vLLM's own
    default, read here from its source (importing vllm takes 10+ s)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:  # `make install` installs it; the GPU check
        pytest.skip("vLLM is not installed (the GPU check's machine has none)")
    source = (Path(spec.origin).parent / "config" / "cache.py").read_text()
    found = re.search(r"gpu_memory_utilization: float = Field\(default=([0-9.]+)", source)
    assert found is not None, "vllm/config/cache.py: no gpu_memory_utilization default found"
    assert float(found.group(1)) == VLLM_GPU_MEMORY_UTILIZATION
    assert ROLLOUT_RESERVE_BYTES == 4 * GIB


def test_the_plan_shows_the_evals_share_of_the_episodes_generated():
    """dapo_math: 1 set x 30 prompts x (1 + 4) = 150 episodes per round, every 80 steps
    of 512 samples at least half fresh (sigma 0.5): 150 / (150 + 20,480) = 0.73%."""
    from reflow_cli.plan import plan_eval_lines

    cfg = load_recipe(REPO / "recipes" / "dapo_math.yaml")
    lines = plan_eval_lines(cfg)
    assert "pinned to one policy version" in lines[0]
    assert re.search(r"per round\s+150\s+episodes: 1 set\(s\) x up to 30 prompts", lines[1])
    assert re.search(r"share\s+0\.73%.*every 80 steps against 20,480 fresh samples", lines[2])
    # colocated_sync: inside a rollout phase; by the trainer where no engine can
    coloc = load_recipe(REPO / "recipes" / "dapo_math.yaml", ["reflow.mode=colocated_sync"])
    assert "in a rollout phase that waits for them" in plan_eval_lines(coloc)[0]
    synthetic = load_recipe(
        REPO / "recipes" / "dapo_math.yaml",
        ["engine.rollout=synthetic", "engine.trainer=synthetic"],
    )
    assert "by the trainer leader; training waits" in plan_eval_lines(synthetic)[0]
    none = load_recipe(REPO / "recipes" / "dapo_math.yaml", ["data.eval={}", "train.eval_every=0"])
    assert plan_eval_lines(none) == []


def test_qwen3_235b_a22b_is_refused_on_16_gpus_and_fits_where_the_plan_says():
    """docs/memory-plan.md, "Mixture of experts": on 16 GPUs of 80 GiB neither role fits,
    and no FSDP2 shard group makes the trainer fit (two gathered MoE blocks and one 22.5k
    sequence's activations exceed 80 GiB alone); on 141 GiB GPUs the plan names the
    sizes, and the recipe at those sizes fits."""
    from runtime.config.placement_fit import placement_hint

    model = "model.path=/models/Qwen3-235B-A22B"
    cfg = load_recipe(REPO / "recipes" / "dapo_math.yaml", [model, "resources.nodes=2"])
    plan = plan_memory(cfg, 80 * GIB)
    assert plan.model.is_moe and plan.model.total_params == 235_093_634_560
    assert plan.refusal().startswith("trainer role needs")
    hint = placement_hint(cfg, plan)  # the recipe's micro-batches of 45,056 tokens
    assert "the trainer fits at no shard group size up to 1024" in hint
    assert "resources.rollout_gpus_per_replica=8 (now 1)" in hint

    base = [model, "train.micro_batch_tokens=22528"]  # one sequence of the recipe's 22.5k
    cfg = load_recipe(REPO / "recipes" / "dapo_math.yaml", [*base, "resources.nodes=2"])
    assert "resources.trainer_gpus_per_replica=1024" in placement_hint(
        cfg, plan_memory(cfg, 80 * GIB)
    )
    hint = placement_hint(cfg, plan_memory(cfg, 141 * GIB))
    assert "resources.trainer_gpus_per_replica=64 (now 8)" in hint
    placed = load_recipe(
        REPO / "recipes" / "dapo_math.yaml",
        [
            *base,
            "resources.nodes=16",
            "resources.trainer_gpus_per_replica=64",
            "resources.rollout_gpus_per_replica=8",
        ],
    )
    fits = plan_memory(placed, 141 * GIB)
    assert fits.refusal() is None and placement_hint(placed, fits) == ""
    # weights for memory, every expert; the KV cache has one of the 4 KV heads per rank
    assert fits.rollout.weights_bytes == math.ceil(235_093_634_560 * 2 / 8)

    from tests.helpers import reflow

    done = reflow("plan", str(REPO / "recipes" / "dapo_math.yaml"), "--nodes", "2", "--set", model)
    assert done.returncode == 1
    assert "would fit with resources.rollout_gpus_per_replica=8" in done.stdout


@pytest.mark.parametrize(
    ("variant", "base", "moe", "widths"),
    [
        ("embedded:tiny-qwen3-moe-sft80", "embedded:tiny-qwen3-moe", True, {}),
        ("embedded:tiny-qwen3-sft86", "embedded:tiny-qwen3", False, {}),
        # the dense model upcycled: experts as wide as its MLP
        (
            "embedded:tiny-qwen3-moe-upcycled",
            "embedded:tiny-qwen3-moe",
            True,
            {"moe_intermediate": 384},
        ),
    ],
)
def test_a_warm_start_variant_is_its_embedded_model_under_another_name(variant, base, moe, widths):
    # only its warm start (and for the upcycled MoE its experts' width) differs
    # (runtime/embedded/warm_start.py): the plan, the codec, the tiny-model handling and
    # (for a MoE) routing replay take it as its base model
    from dataclasses import replace

    from runtime.data.codec import CharCodec, codec_for
    from runtime.embedded.resolve import BUILDERS, CHARACTER_MODELS, is_tiny_embedded

    shape = model_shape(variant)
    assert shape == replace(model_shape(base), name=variant, **widths) and shape.is_moe == moe
    assert is_tiny_embedded(variant) and variant in CHARACTER_MODELS
    # its own build (the cache key holds the SFT steps), not the base model's folder
    assert BUILDERS[variant] != BUILDERS[base]
    assert isinstance(codec_for("(not read)", variant), CharCodec)
    cfg = {"model": {"path": variant}, "resources": {"device": "cpu"}}
    if moe:
        cfg["algorithm"] = {"routing_replay": "rollout"}
        assert build_config(cfg).algorithm.routing_replay == "rollout"
    else:
        assert build_config(cfg).train.strategy == "replicate"  # a tiny model: whole per rank
