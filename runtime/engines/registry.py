"""Registry of the engines behind the two roles, by the names recipes use.

The tables (runtime/config/engine_names.py, where the recipe check reads them) hold
``module:attribute`` strings imported here on first use, so validating a recipe (or
``--dry-run``) never imports engine code. Each factory is called as
``factory(cfg, rank, paths, collective)`` and returns a :class:`runtime.rank.sides.RoleSide`;
``collective`` is the rank's process group (:mod:`runtime.rank.collective`) for the engines
that move tensors between ranks (:data:`runtime.config.schema.WEIGHT_TRANSPORT`), else None.

With ``resources.rollout_gpus_per_replica > 1`` only the first rank of each rollout group
(its driver: :func:`runtime.config.layout.is_rollout_driver`) builds the rollout engine,
with that many tensor-parallel shards; the other ranks get a
:class:`runtime.rank.tp_member.TensorParallelMember` instead, whatever the engine (a second
engine on them would be a second replica, and on CUDA would take the driver's GPUs).
"""

from __future__ import annotations

import importlib
from typing import Any

from runtime.config.engine_names import PROMPT_SOURCES, ROLLOUT_ENGINES, TRAINER_ENGINES
from runtime.config.layout import is_rollout_driver
from runtime.config.schema import Config
from runtime.rank.sides import RoleSide
from runtime.rank.tp_member import tensor_parallel_member
from runtime.store.run_dir import RunPaths


class EngineUnavailable(RuntimeError):
    """A registered engine whose code or dependencies are not importable here."""


def _load(kind: str, name: str, target: str):
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise EngineUnavailable(f"engine.{kind}: {name!r} cannot be loaded ({exc})") from None


def build_sides(
    cfg: Config, rank: int, paths: RunPaths, collective: object = None
) -> dict[str, RoleSide]:
    e = cfg.engine
    size = cfg.resources.rollout_gpus_per_replica
    rollout: RoleSide
    if is_rollout_driver(rank, size):
        factory = _load("rollout", e.rollout, ROLLOUT_ENGINES[e.rollout])
        rollout = factory(cfg, rank, paths, collective)
    else:
        rollout = tensor_parallel_member(rank, size)
    try:
        trainer = _load("trainer", e.trainer, TRAINER_ENGINES[e.trainer])(
            cfg, rank, paths, collective
        )
    except BaseException:
        rollout.close()  # an engine left running would keep the rank's process alive
        raise
    return {"rollout": rollout, "trainer": trainer}


def build_prompts(cfg: Config):
    """The prompt stream of ``data.train``: an embedded source, or a dataset file."""
    if not cfg.data.embedded:
        from runtime.data.prompts import file_prompts
        from runtime.data.settings import PromptsConfig

        return file_prompts(PromptsConfig.from_config(cfg))
    name = str(cfg.data.train)
    if name not in PROMPT_SOURCES:
        raise EngineUnavailable(f"data.train: {name!r} has no loader in this version")
    return _load("data", name, PROMPT_SOURCES[name])(cfg.train.seed)


def build_eval_prompts(cfg: Config) -> dict[str, list[dict[str, Any]]] | None:
    """The ``data.eval`` sets' prompts as rank 0 hands them to the rollout engines (each
    set's first ``eval.max_prompts`` that leave room for a response), or None when the
    rollout engines do not play them (``Config.evals_on_rollout``)."""
    if not cfg.evals_on_rollout:
        return None
    from runtime.workloads.eval_sets import eval_prompts

    return {name: eval_prompts(cfg, path)[0] for name, path in cfg.data.eval.items()}


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
    from runtime.embedded.resolve import CHARACTER_MODELS, EMBEDDED_CHAT

    if cfg.model.path in CHARACTER_MODELS:
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
