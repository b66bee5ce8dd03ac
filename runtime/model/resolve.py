"""Where a recipe's ``model.path`` points: an HF folder, or the embedded warm-started model."""

from __future__ import annotations

from runtime.config import Config

EMBEDDED = "embedded:tiny-qwen3"


def resolve_model_path(cfg: Config) -> str:
    if cfg.model.path == EMBEDDED:
        from runtime.model.warm_start import embedded_model_path

        return str(embedded_model_path())
    return cfg.model.path
