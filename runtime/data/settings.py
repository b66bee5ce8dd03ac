"""What the prompt stream takes of a run's config: its own sections, bundled once at the
edge (the engine registry, the rollout side, the trainer-side eval) by
:meth:`PromptsConfig.from_config`, so runtime/data/prompts.py reads no other part of it."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.schema import Config, DataConfig


@dataclass(frozen=True)
class PromptsConfig:
    data: DataConfig
    """The files, their format, fields, weights, template and shuffling."""
    kind: str
    """``workload.kind``: which fields a record must have (``REQUIRED_FIELDS``)."""
    max_seq_len: int
    """``model.max_seq_len``: a prompt that leaves no room for a response is skipped."""
    max_response_tokens: int
    """``workload.max_response_tokens``: the room a prompt must leave (at most 16 of it)."""
    model_path: str
    """``model.path`` as the recipe gives it: the tokenizer that renders prompts."""
    seed: int
    """``train.seed``: epochs are shuffled with it, a mix's files drawn with it."""

    @classmethod
    def from_config(cls, cfg: Config) -> PromptsConfig:
        return cls(
            data=cfg.data,
            kind=cfg.workload.kind,
            max_seq_len=cfg.model.max_seq_len,
            max_response_tokens=cfg.workload.max_response_tokens,
            model_path=cfg.model.path,
            seed=cfg.train.seed,
        )
