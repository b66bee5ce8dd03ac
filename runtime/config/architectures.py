"""The shape of a recipe's model, read without loading it: from ``model.path``'s
``config.json`` when that folder is on this machine, else from a built-in table of known
architectures (a login node rarely has ``/models`` mounted; the shapes of the public
checkpoints are public).

A :class:`ModelShape` counts its parameters exactly from the shapes, one tensor at a time,
as Hugging Face's dense decoders (Qwen3, Qwen2, Llama, Mistral) and Qwen3's
mixture-of-experts decoder (``Qwen3MoeForCausalLM``: every block's MLP is ``experts`` gated
MLPs of ``moe_intermediate`` and a router, ``experts_per_token`` of them run per token) lay
them out; the memory plan (:mod:`runtime.config.memory_plan`) turns those counts into bytes
per GPU: every parameter for memory, the active ones for compute.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class ArchitectureError(ValueError):
    """The model's shape cannot be known; ``str()`` is one line naming ``model.path``."""


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool  # tie_word_embeddings: lm_head is the embedding matrix
    qk_norm: bool = True  # Qwen3: RMSNorm over head_dim on q and k, per layer
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    source: str = ""  # where the shape came from (a config.json, or the table's citation)
    # Mixture of experts (0 experts: a dense model). Every block is sparse (Qwen3-MoE's
    # decoder_sparse_step 1, no mlp_only_layers: the released checkpoints' layout).
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def attention_params(self) -> int:
        """One block's attention: q, k, v, o; q_norm and k_norm; biases."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        attention = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attention += q + 2 * kv
        if self.qk_norm:
            attention += 2 * self.head_dim
        return attention

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP (gate, up, down)."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def block_params(self) -> int:
        """One decoder block: attention, the gated MLP (gate, up, down; a mixture of
        experts: every expert's and the router's ``hidden x experts``) and its two RMSNorms
        (input, post-attention)."""
        h = self.hidden
        if self.is_moe:
            mlp = self.experts * self.expert_params + h * self.experts
        else:
            mlp = 3 * h * self.intermediate
        return self.attention_params + mlp + 2 * h

    @property
    def active_block_params(self) -> int:
        """The parameters of a block one token runs through: a mixture of experts' router
        and ``experts_per_token`` experts; all of a dense block."""
        if not self.is_moe:
            return self.block_params
        h = self.hidden
        mlp = self.experts_per_token * self.expert_params + h * self.experts
        return self.attention_params + mlp + 2 * h

    @property
    def root_params(self) -> int:
        """What is not in a decoder block: the embedding, the final RMSNorm and, unless
        tied, lm_head (FSDP2's root unit in this trainer: runtime/engines/torch/parallelize.py)."""
        head = 0 if self.tied else self.vocab * self.hidden
        return self.embedding_params + self.hidden + head

    @property
    def total_params(self) -> int:
        return self.root_params + self.layers * self.block_params

    @property
    def active_params(self) -> int:
        """Per token (the compute a step costs): the root and each block's active part."""
        return self.root_params + self.layers * self.active_block_params


# The public config.json of each checkpoint (_QWEN3); the same shapes as
# THUDM/slime scripts/models/qwen3-*.sh, and ../shared/notes/cluster-profile.md section 2
# derives the same parameter counts. Every Qwen3 dense model has head_dim 128, 8 KV heads,
# q_norm/k_norm and no attention biases; the three smallest tie the embedding.
_QWEN3 = "huggingface.co/Qwen/{}/blob/main/config.json"


def _qwen3(name: str, hidden: int, layers: int, heads: int, mlp: int, tied: bool) -> ModelShape:
    return ModelShape(
        name, hidden, layers, heads, 8, 128, mlp, 151936, tied, source=_QWEN3.format(name)
    )


def _qwen3_moe(name: str, hidden: int, layers: int, heads: int, moe: int) -> ModelShape:
    """Qwen3's mixture-of-experts checkpoints: 128 experts, 8 per token, 4 KV heads of
    128, q/k norms, untied embeddings, every block sparse (the public config.json; the
    same shapes as THUDM/slime scripts/models/qwen3-30B-A3B.sh and qwen3-235B-A22B.sh)."""
    return ModelShape(
        name,
        hidden,
        layers,
        heads,
        4,
        128,
        0,
        151936,
        False,
        source=_QWEN3.format(name),
        experts=128,
        experts_per_token=8,
        moe_intermediate=moe,
    )


KNOWN: dict[str, ModelShape] = {
    shape.name.lower(): shape
    for shape in (
        _qwen3("Qwen3-0.6B", 1024, 28, 16, 3072, tied=True),
        _qwen3("Qwen3-1.7B", 2048, 28, 16, 6144, tied=True),
        _qwen3("Qwen3-4B", 2560, 36, 32, 9728, tied=True),
        _qwen3("Qwen3-8B", 4096, 36, 32, 12288, tied=False),
        _qwen3("Qwen3-14B", 5120, 40, 40, 17408, tied=False),
        _qwen3("Qwen3-32B", 5120, 64, 64, 25600, tied=False),
        _qwen3_moe("Qwen3-30B-A3B", 2048, 48, 32, 768),
        _qwen3_moe("Qwen3-235B-A22B", 4096, 94, 64, 1536),
    )
}


def _embedded() -> dict[str, ModelShape]:
    """The embedded models' shapes, as runtime/embedded builds them (build_model's
    defaults: hidden 128, 2 layers, 4 heads of 32, 2 KV heads, MLP 3 x hidden, tied; the
    mid-size one takes tiny_qwen3.SMALL; the mixture of experts build_moe_model's: 4
    experts of 192, 2 per token; the upcycled one 4 of 384). tests/unit/test_memory_plan.py
    checks these against the models transformers builds from the same code."""
    from runtime.embedded.resolve import (
        EMBEDDED,
        EMBEDDED_CHAT,
        EMBEDDED_MOE,
        EMBEDDED_MOE_SFT80,
        EMBEDDED_MOE_UPCYCLED,
        EMBEDDED_SFT86,
        EMBEDDED_SMALL,
    )
    from runtime.embedded.tiny_chat import VOCAB_SIZE
    from runtime.embedded.tiny_qwen3 import SMALL, VOCAB

    source = "runtime/embedded/tiny_qwen3.py build_model"
    small = SMALL
    moe = ModelShape(
        EMBEDDED_MOE,
        128,
        2,
        4,
        2,
        32,
        0,
        len(VOCAB),
        True,
        source="runtime/embedded/tiny_qwen3.py build_moe_model",
        experts=4,
        experts_per_token=2,
        moe_intermediate=192,
    )
    dense = ModelShape(EMBEDDED, 128, 2, 4, 2, 32, 384, len(VOCAB), True, source=source)
    return {
        EMBEDDED: dense,
        EMBEDDED_SFT86: replace(dense, name=EMBEDDED_SFT86),  # the same model, more SFT
        EMBEDDED_CHAT: ModelShape(
            EMBEDDED_CHAT, 128, 2, 4, 2, 32, 384, VOCAB_SIZE, True, source=source
        ),
        EMBEDDED_MOE: moe,
        EMBEDDED_MOE_SFT80: replace(moe, name=EMBEDDED_MOE_SFT80),  # the same model, less SFT
        # the dense model upcycled: every expert a copy of its MLP (tiny_qwen3.upcycle_to_moe)
        EMBEDDED_MOE_UPCYCLED: replace(moe, name=EMBEDDED_MOE_UPCYCLED, moe_intermediate=384),
        EMBEDDED_SMALL: ModelShape(
            EMBEDDED_SMALL,
            small["hidden"],
            small["layers"],
            small["heads"],
            small["kv_heads"],
            small["head_dim"],
            3 * small["hidden"],
            len(VOCAB),
            True,
            source=source,
        ),
    }


# Dense decoders whose config.json this module reads: the model types whose tensors the
# parameter count above lays out (Qwen2 adds q/k/v biases, Qwen3 adds q/k norms).
DENSE_TYPES = {
    "qwen3": {"qk_norm": True, "attention_bias": False},
    "qwen2": {"qk_norm": False, "attention_bias": True},
    "llama": {"qk_norm": False, "attention_bias": False},
    "mistral": {"qk_norm": False, "attention_bias": False},
}
MOE_TYPE = "qwen3_moe"  # Qwen3's mixture of experts (``Qwen3MoeForCausalLM``)


def shape_from_config(config: dict[str, Any], name: str, source: str) -> ModelShape:
    """A :class:`ModelShape` from a Hugging Face ``config.json`` (a dense decoder, or
    Qwen3's mixture of experts)."""
    text = config.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in config:
        config = text
    kind = config.get("model_type")
    if kind == MOE_TYPE:
        # a checkpoint with dense blocks among the sparse ones is not counted: no released
        # one has them
        if config.get("mlp_only_layers") or int(config.get("decoder_sparse_step", 1) or 1) != 1:
            raise ArchitectureError(
                f"model.path: {source} mixes dense and sparse blocks (mlp_only_layers or "
                "decoder_sparse_step); the memory plan counts all-sparse Qwen3-MoE models only"
            )
    elif kind not in DENSE_TYPES:
        known = ", ".join([*sorted(DENSE_TYPES), MOE_TYPE])
        raise ArchitectureError(
            f"model.path: {source} has model_type {kind!r}; the memory plan knows {known}"
        )
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        shared: dict[str, Any] = {
            "name": name,
            "hidden": hidden,
            "layers": int(config["num_hidden_layers"]),
            "heads": heads,
            "kv_heads": int(config.get("num_key_value_heads") or heads),
            "head_dim": int(config.get("head_dim") or hidden // heads),
            "vocab": int(config["vocab_size"]),
            "tied": bool(config.get("tie_word_embeddings", False)),
            "source": source,
        }
        if kind == MOE_TYPE:  # Qwen3's attention; every block's MLP the experts
            return ModelShape(
                **shared,
                intermediate=0,
                qk_norm=True,
                attention_bias=bool(config.get("attention_bias", False)),
                # the hub's configs say num_experts; transformers 5 saves num_local_experts
                experts=int(config.get("num_local_experts") or config["num_experts"]),
                experts_per_token=int(config["num_experts_per_tok"]),
                moe_intermediate=int(config["moe_intermediate_size"]),
            )
        return ModelShape(
            **shared,
            intermediate=int(config["intermediate_size"]),
            qk_norm=DENSE_TYPES[kind]["qk_norm"],
            attention_bias=bool(config.get("attention_bias", DENSE_TYPES[kind]["attention_bias"])),
        )
    except KeyError as exc:
        raise ArchitectureError(f"model.path: {source} has no {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ArchitectureError(f"model.path: {source}: {exc}") from None


def model_shape(path: str) -> ModelShape:
    """The shape of ``model.path``: an embedded model, a local folder's ``config.json``,
    else the table entry its last path component names (``/models/Qwen3-8B``,
    ``Qwen/Qwen3-8B``; a ``-Base`` suffix has the same shape)."""
    embedded = _embedded()
    if path in embedded:
        return embedded[path]
    config_file = Path(path) / "config.json"
    name = Path(path.rstrip("/")).name or path
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError) as exc:
            raise ArchitectureError(f"model.path: cannot read {config_file} ({exc})") from None
        if not isinstance(config, dict):
            raise ArchitectureError(f"model.path: {config_file} is not a JSON object")
        return shape_from_config(config, name, str(config_file))
    key = name.lower().removesuffix("-base")
    if key in KNOWN:
        return KNOWN[key]
    known = ", ".join(s.name for s in KNOWN.values())
    raise ArchitectureError(
        f"model.path: {path} has no config.json on this machine and {name!r} is not a known "
        f"architecture ({known})"
    )
