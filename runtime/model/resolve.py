"""Where a recipe's ``model.path`` points: an HF folder, or an embedded warm-started model
(``embedded:tiny-qwen3`` for arithmetic, ``embedded:tiny-qwen3-chat`` for text workloads)."""

from __future__ import annotations

from runtime.config import Config

EMBEDDED = "embedded:tiny-qwen3"
EMBEDDED_CHAT = "embedded:tiny-qwen3-chat"

# name -> "module:function" returning the built (cached) folder
BUILDERS = {
    EMBEDDED: "runtime.model.warm_start:embedded_model_path",
    EMBEDDED_CHAT: "runtime.model.tiny_chat:embedded_chat_model_path",
}


def resolve_model_path(cfg: Config) -> str:
    if cfg.model.path in BUILDERS:
        import importlib

        module, _, attr = BUILDERS[cfg.model.path].partition(":")
        return str(getattr(importlib.import_module(module), attr)())
    return cfg.model.path
