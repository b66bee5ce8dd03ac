"""Where a recipe's ``model.path`` points: an HF folder, or an embedded warm-started model
(``embedded:tiny-qwen3`` for arithmetic, ``embedded:tiny-qwen3-moe`` its mixture of
experts, ``embedded:tiny-qwen3-moe-sft80`` the same after a shorter warm start,
``embedded:tiny-qwen3-chat`` for text workloads)."""

from __future__ import annotations

EMBEDDED = "embedded:tiny-qwen3"
EMBEDDED_CHAT = "embedded:tiny-qwen3-chat"
EMBEDDED_MOE = "embedded:tiny-qwen3-moe"  # 4 experts, top 2, warm-started on arithmetic
# The same mixture of experts after the dense model's own 80 SFT steps: its held-out greedy
# accuracy near the dense model's, where EMBEDDED_MOE matches its solution NLL (docs/moe.md).
EMBEDDED_MOE_SFT80 = "embedded:tiny-qwen3-moe-sft80"
EMBEDDED_SMALL = "embedded:small-qwen3"  # 25M parameters, random: trainer tests, benchmarks

# name -> "module:function" returning the built (cached) folder
BUILDERS = {
    EMBEDDED: "runtime.embedded.warm_start:embedded_model_path",
    EMBEDDED_CHAT: "runtime.embedded.tiny_chat:embedded_chat_model_path",
    EMBEDDED_SMALL: "runtime.embedded.warm_start:small_model_path",
    EMBEDDED_MOE: "runtime.embedded.warm_start:embedded_moe_model_path",
    EMBEDDED_MOE_SFT80: "runtime.embedded.warm_start:embedded_moe_sft80_model_path",
}
MOE_MODELS = (EMBEDDED_MOE, EMBEDDED_MOE_SFT80)
# the models on the arithmetic task's character vocabulary (runtime/embedded/tiny_qwen3.py)
CHARACTER_MODELS = (EMBEDDED, EMBEDDED_SMALL, *MOE_MODELS)


def is_tiny_embedded(path: str) -> bool:
    """The sub-million-parameter embedded models: one rank holds them whole."""
    return path in (EMBEDDED, EMBEDDED_CHAT, *MOE_MODELS)


def resolve_model_path(path: str) -> str:
    """The folder a ``model.path`` names: an embedded model's (built on first use), or the
    path itself."""
    if path in BUILDERS:
        import importlib

        module, _, attr = BUILDERS[path].partition(":")
        return str(getattr(importlib.import_module(module), attr)())
    return path
