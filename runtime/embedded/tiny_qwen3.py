"""Build the embedded ``tiny-qwen3``: a character tokenizer and a few-hundred-thousand-
parameter Qwen3 with tied embeddings, saved as an ordinary Hugging Face folder
(``config.json``, ``model.safetensors``, ``tokenizer.json``), so everything downstream
loads it through the same code path as a real Qwen3 checkpoint.
"""

from __future__ import annotations

from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789+-*=;#?SQA: ")
VOCAB = SPECIALS + CHARS
PAD, BOS, EOS = 0, 1, 2


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        unk_token="<unk>",
    )


def build_model(
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    *,
    vocab_size: int = len(VOCAB),
    specials: tuple[int, int, int] = (BOS, EOS, PAD),
    max_positions: int = 512,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,  # the CPU attention kernels of vLLM support 32, not 24
):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = _config_fields(
        hidden, layers, vocab_size, specials, max_positions, heads, kv_heads, head_dim
    )
    config = Qwen3Config(**fields)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(config)


def build_moe_model(
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    *,
    experts: int = 4,
    experts_per_token: int = 2,
    moe_intermediate: int = 192,
    norm_topk_prob: bool = True,
    vocab_size: int = len(VOCAB),
    specials: tuple[int, int, int] = (BOS, EOS, PAD),
    max_positions: int = 512,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
):
    """A tiny Qwen3 mixture of experts (transformers' ``Qwen3MoeForCausalLM``): the dense
    model's attention and vocabulary, every block's MLP ``experts`` gated MLPs of
    ``moe_intermediate`` with a top-``experts_per_token`` router (``intermediate_size`` is
    unused: every block is sparse). By default a token's two experts are as wide together
    as the dense model's MLP (2 x 192 = 384): the same active compute, twice the MLP
    parameters, as Qwen3-30B-A3B stands to a 3B dense model. A token's experts are weighted
    by their router probabilities renormalised over the chosen ones (``norm_topk_prob``,
    as every Qwen3 MoE checkpoint sets it; transformers' default leaves them unnormalised).
    Random weights."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    fields = _config_fields(
        hidden, layers, vocab_size, specials, max_positions, heads, kv_heads, head_dim
    )
    config = Qwen3MoeConfig(
        **fields,
        moe_intermediate_size=moe_intermediate,
        num_experts=experts,
        num_experts_per_tok=experts_per_token,
        norm_topk_prob=norm_topk_prob,
    )
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(config)


def upcycle_to_moe(dense, *, experts: int = 4, experts_per_token: int = 2, seed: int = 0):
    """A Qwen3 mixture of experts that computes exactly what ``dense`` (a ``Qwen3ForCausalLM``
    of this module's shape) computes: sparse upcycling (Komatsuzaki et al. 2022; Qwen1.5-MoE
    was upcycled from a dense Qwen). Every expert is a copy of the block's MLP (so experts
    are as wide as it: a token's two are twice its active width) and the rest is copied;
    since the chosen experts' weights are renormalised to sum to one (``norm_topk_prob``),
    the block's output is the dense MLP's whatever the router picks. The routers keep their
    random initialisation (``seed``), not zero: with every logit equal, every token would go
    to the same two experts, which would get the same gradients and stay copies, and the
    router would get none (its weights' effect cancels while the experts are equal)."""
    import torch

    config = dense.config
    shape = {
        "hidden": config.hidden_size,
        "layers": config.num_hidden_layers,
        "vocab_size": config.vocab_size,
        "specials": (config.bos_token_id, config.eos_token_id, config.pad_token_id),
        "max_positions": config.max_position_embeddings,
        "heads": config.num_attention_heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
    }
    moe = build_moe_model(
        seed,
        experts=experts,
        experts_per_token=experts_per_token,
        moe_intermediate=config.intermediate_size,
        norm_topk_prob=True,
        **shape,
    )
    weights = {k: v for k, v in dense.state_dict().items() if ".mlp." not in k}
    for i, block in enumerate(dense.model.layers):
        mlp = block.mlp
        gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])  # gate first, then up
        prefix = f"model.layers.{i}.mlp"
        down = mlp.down_proj.weight
        weights[f"{prefix}.experts.gate_up_proj"] = gate_up.expand(experts, -1, -1).clone()
        weights[f"{prefix}.experts.down_proj"] = down.expand(experts, -1, -1).clone()
        weights[f"{prefix}.gate.weight"] = moe.model.layers[i].mlp.gate.weight.detach().clone()
    moe.load_state_dict(weights, strict=True)
    return moe


def _config_fields(
    hidden: int,
    layers: int,
    vocab_size: int,
    specials: tuple[int, int, int],
    max_positions: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> dict:
    """The config fields the dense and the mixture-of-experts models share."""
    bos, eos, pad = specials
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": hidden * 3,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": pad,
        "torch_dtype": "float32",
    }


# The mid-size embedded model (``embedded:small-qwen3``, 25M parameters): big enough that
# sharding, micro-batching and sharded checkpoints move real amounts of data, small enough
# that one training step on 2 CPU cores takes seconds. Randomly initialised, not trained.
SMALL = {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4, "head_dim": 64, "seed": 0}


def save_pretrained(model, tokenizer, path: Path) -> Path:
    """An HF folder (config, weights, tokenizer) written from any rank.

    Not ``model.save_pretrained``: since transformers 5 it writes nothing on a process
    whose torch.distributed rank is not 0, and the embedded model is built by whichever
    rank gets there first, after the ranks joined their process group."""
    from safetensors.torch import save_file

    from runtime.checkpoint_layout import to_hub

    path.mkdir(parents=True, exist_ok=True)
    # what lets loaders (vLLM among them) pick the architecture: save_pretrained sets it
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(path)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(path)
    tied = getattr(model.config, "tie_word_embeddings", False)
    weights = {
        k: v.detach().contiguous().clone()
        for k, v in to_hub(model.state_dict()).items()
        if not (tied and k == "lm_head.weight")  # as HF saves tied embeddings
    }
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(path)
    if not (path / "model.safetensors").is_file() or not (path / "config.json").is_file():
        raise RuntimeError(f"{path}: model files were not written")
    return path


def encode(text: str) -> list[int]:
    """Token ids without going through ``tokenizers`` (hot path of the task code)."""
    table = {c: i for i, c in enumerate(VOCAB)}
    return [table.get(c, 3) for c in text]


def decode(ids: list[int]) -> str:
    return "".join(VOCAB[i] if 4 <= i < len(VOCAB) else "" for i in ids)
