"""The trainer leader's held-out eval: the arith kind's own accuracy and the ``data.eval``
sets, at the start, every ``train.eval_every`` steps, and at the end.

It generates with the trainer's own model on the leader, so it stalls that rank (its
seconds are reported as ``eval_s``, which a report of reward against time takes out:
benchmarks/learning.py). A sharded model cannot generate on one rank: a plain copy is
built from the gathered weights, or from the model folder before the first sync.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from runtime.config.schema import Config
from runtime.config.workload_kinds import workload_kind
from runtime.rank.sides import Keepalive

if TYPE_CHECKING:
    from runtime.engines.torch.trainer import TorchTrainer


def eval_names(figures: dict[str, float], when: str) -> dict[str, float]:
    """The metric names of held-out figures taken at the run's ``start`` or ``end``:
    ``eval_reward_start`` / ``_end`` for the arith kind's own, ``eval_start/<set>/...``
    for a set's at the start (the ones after a step keep ``eval/<set>/...``)."""
    out = {}
    for key, value in figures.items():
        if key == "eval_reward":
            out[f"eval_reward_{when}"] = value
        elif when == "start":
            out["eval_start/" + key.removeprefix("eval/")] = value
        else:
            out[key] = value
    return out


def eval_generators(cfg: Config, model: torch.nn.Module, version: int) -> tuple[Any, Any]:
    """The eval sets' generators over ``model``: greedy, and at ``eval.temperature``."""
    from runtime.data.codec import codec_for
    from runtime.embedded.resolve import resolve_model_path
    from runtime.engines.torch.generate import ModelGenerator

    codec = codec_for(resolve_model_path(cfg.model.path), cfg.model.path)
    return (
        ModelGenerator(model, codec, 0.0, version),
        ModelGenerator(model, codec, cfg.eval.temperature, version),
    )


class HeldOutEval:
    """When the leader evaluates, and what: figures of the current policy, by name."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.trainer_eval = workload_kind(cfg.workload.kind).trainer_eval
        # the data.eval sets, unless the rollout engines play them (rank 0's eval rounds)
        self.sets_here = bool(cfg.data.eval) and not cfg.evals_on_rollout
        self.enabled = self.trainer_eval or self.sets_here
        self.at_start: dict[str, float] | None = None  # before the first step (None: not yet)
        self._reward_pool: Any = None  # for the sets' rewards and tools, started on first use

    def due(self, step: int, final: bool) -> bool:
        """Whether the step just taken is followed by an eval (the final one has its own)."""
        every = self.cfg.train.eval_every
        return self.enabled and bool(every) and step % every == 0 and not final

    def timed(
        self,
        trainer: TorchTrainer,
        gathered: dict[str, torch.Tensor] | None,
        keepalive: Keepalive,
        metrics: dict[str, float],
        when: str | None = None,
    ) -> None:
        """The figures into ``metrics`` (named for ``when``, if given) with their seconds
        as ``eval_s``."""
        started = time.perf_counter()
        figures = self.evaluate(trainer, gathered, keepalive)
        metrics.update(figures if when is None else eval_names(figures, when))
        metrics["eval_s"] = time.perf_counter() - started

    def evaluate(
        self,
        trainer: TorchTrainer,
        gathered: dict[str, torch.Tensor] | None,
        keepalive: Keepalive,
    ) -> dict[str, float]:
        """Held-out figures of ``trainer``'s policy (the leader alone): the arith kind's
        ``eval_reward`` (greedy accuracy on its embedded problems), and per ``data.eval``
        set ``eval/<set>/greedy``, ``mean@k`` and ``pass@k`` (runtime/workloads/
        eval_sets.py). ``gathered``: a sharded model's full weights."""
        from runtime.embedded.warm_start import greedy_accuracy
        from runtime.engines.torch.policy_files import plain_model
        from runtime.workloads import eval_sets

        cfg = self.cfg
        model = trainer.model
        if trainer.sharded:
            model = plain_model(trainer.model_path, gathered, cfg.model)
        model.eval()
        out: dict[str, float] = {}
        try:
            if self.trainer_eval:
                out["eval_reward"] = greedy_accuracy(
                    model, max_new=cfg.workload.max_response_tokens
                )
            if self.sets_here:
                if self._reward_pool is None:
                    from runtime.workloads.agents.pool import RewardPool

                    timeout_s = cfg.workload.reward_timeout_s + 30
                    self._reward_pool = RewardPool(
                        cfg.sandbox.reward_workers, timeout_s, cfg.sandbox.concurrency
                    )
                version = trainer.version
                generators = eval_generators(cfg, model, version)
                out.update(
                    eval_sets.evaluate(cfg, generators, version, self._reward_pool, keepalive)
                )
            return out
        finally:
            trainer.model.train()

    def close(self) -> None:
        if self._reward_pool is not None:
            self._reward_pool.close()
            self._reward_pool = None
