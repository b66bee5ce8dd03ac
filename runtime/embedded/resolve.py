"""Where a recipe's ``model.path`` points: an HF folder, or an embedded warm-started model
(``embedded:tiny-qwen3`` for arithmetic, ``embedded:tiny-qwen3-moe`` its mixture of
experts, ``embedded:tiny-qwen3-moe-sft80`` the same after a shorter warm start,
``embedded:tiny-qwen3-sft86`` the dense one after a longer one,
``embedded:tiny-qwen3-moe-upcycled`` the dense one upcycled into a mixture of experts,
``embedded:tiny-qwen3-chat`` for text workloads)."""

from __future__ import annotations

EMBEDDED = "embedded:tiny-qwen3"
EMBEDDED_CHAT = "embedded:tiny-qwen3-chat"
EMBEDDED_MOE = "embedded:tiny-qwen3-moe"  # 4 experts, top 2, warm-started on arithmetic
# The same mixture of experts after the dense model's own 80 SFT steps: its held-out greedy
# accuracy near the dense model's, where EMBEDDED_MOE matches its solution NLL (docs/moe.md).
EMBEDDED_MOE_SFT80 = "embedded:tiny-qwen3-moe-sft80"
# The dense model after 86 SFT steps instead of 80: its held-out greedy accuracy near
# EMBEDDED_MOE's, for comparing the demos' gains from the MoE's start (docs/moe.md).
EMBEDDED_SFT86 = "embedded:tiny-qwen3-sft86"
# The dense model (EMBEDDED) upcycled into a mixture of experts: 4 copies of its MLP, 2 per
# token; at the start the dense model's function exactly (docs/moe.md).
EMBEDDED_MOE_UPCYCLED = "embedded:tiny-qwen3-moe-upcycled"
EMBEDDED_SMALL = "embedded:small-qwen3"  # 25M parameters, random: trainer tests, benchmarks

# name -> "module:function" returning the built (cached) folder
BUILDERS = {
    EMBEDDED: "runtime.embedded.warm_start:embedded_model_path",
    EMBEDDED_CHAT: "runtime.embedded.tiny_chat:embedded_chat_model_path",
    EMBEDDED_SMALL: "runtime.embedded.warm_start:small_model_path",
    EMBEDDED_MOE: "runtime.embedded.warm_start:embedded_moe_model_path",
    EMBEDDED_MOE_SFT80: "runtime.embedded.warm_start:embedded_moe_sft80_model_path",
    EMBEDDED_SFT86: "runtime.embedded.warm_start:embedded_sft86_model_path",
    EMBEDDED_MOE_UPCYCLED: "runtime.embedded.warm_start:embedded_moe_upcycled_model_path",
}
MOE_MODELS = (EMBEDDED_MOE, EMBEDDED_MOE_SFT80, EMBEDDED_MOE_UPCYCLED)
# the warm-started models of the arithmetic task (its character vocabulary and codec)
ARITH_MODELS = (EMBEDDED, EMBEDDED_SFT86, *MOE_MODELS)
# the models on the arithmetic task's character vocabulary (runtime/embedded/tiny_qwen3.py)
CHARACTER_MODELS = (*ARITH_MODELS, EMBEDDED_SMALL)


def is_tiny_embedded(path: str) -> bool:
    """The sub-million-parameter embedded models: one rank holds them whole."""
    return path in (*ARITH_MODELS, EMBEDDED_CHAT)


def resolve_model_path(path: str) -> str:
    """The folder a ``model.path`` names: an embedded model's (built on first use), or the
    path itself."""
    if path in BUILDERS:
        import importlib

        module, _, attr = BUILDERS[path].partition(":")
        return str(getattr(importlib.import_module(module), attr)())
    return path
