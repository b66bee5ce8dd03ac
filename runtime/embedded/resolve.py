"""Where a recipe's ``model.path`` points: an HF folder, or an embedded warm-started model
(``embedded:tiny-qwen3`` for arithmetic, ``embedded:tiny-qwen3-chat`` for text workloads)."""

from __future__ import annotations

from runtime.config.schema import Config

EMBEDDED = "embedded:tiny-qwen3"
EMBEDDED_CHAT = "embedded:tiny-qwen3-chat"
EMBEDDED_SMALL = "embedded:small-qwen3"  # 25M parameters, random: trainer tests, benchmarks

# name -> "module:function" returning the built (cached) folder
BUILDERS = {
    EMBEDDED: "runtime.embedded.warm_start:embedded_model_path",
    EMBEDDED_CHAT: "runtime.embedded.tiny_chat:embedded_chat_model_path",
    EMBEDDED_SMALL: "runtime.embedded.warm_start:small_model_path",
}


def is_tiny_embedded(path: str) -> bool:
    """The sub-million-parameter embedded models: one rank holds them whole."""
    return path in (EMBEDDED, EMBEDDED_CHAT)


def resolve_model_path(cfg: Config) -> str:
    if cfg.model.path in BUILDERS:
        import importlib

        module, _, attr = BUILDERS[cfg.model.path].partition(":")
        return str(getattr(importlib.import_module(module), attr)())
    return cfg.model.path


def vocab_size(cfg: Config) -> int | None:
    """The rollout model's vocabulary size, the bound rank 0 puts on every token id a
    sample brings, read without building or loading a model (rank 0 needs it before its
    ranks register). None where rollout has no model (placeholder engines)."""
    import json
    from pathlib import Path

    if cfg.engine.rollout == "synthetic":
        from runtime.engines.synthetic import VOCAB

        return VOCAB
    if cfg.engine.rollout == "placeholder":
        return None
    if cfg.model.path in (EMBEDDED, EMBEDDED_SMALL):
        from runtime.embedded.tiny_qwen3 import VOCAB as CHARS

        return len(CHARS)
    if cfg.model.path == EMBEDDED_CHAT:
        from runtime.embedded.tiny_chat import VOCAB_SIZE

        return VOCAB_SIZE
    try:
        config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"model.path: cannot read {cfg.model.path}/config.json ({exc})") from None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"model.path: {cfg.model.path}/config.json has no vocab_size")
    return size
