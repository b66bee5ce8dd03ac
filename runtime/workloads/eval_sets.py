"""Named held-out eval sets (``data.eval``), played by the workload's own agent loop.

Each set's prompts (the first ``eval.max_prompts`` of its file, in file order) are played
once greedily and ``eval.k`` times at ``eval.temperature``, each episode by the same agent
and reward as training (a custom environment, a ``workload.reward_fn``, the code sandbox),
so a held-out number means what the training reward means. Per set:

- ``greedy``: the mean reward of the greedy episodes;
- ``mean@k``: the mean reward of the ``k`` sampled episodes per prompt, over prompts;
- ``pass@k``: the share of prompts with at least one of its ``k`` sampled episodes solved
  (reward at least ``eval.solved_at``). With ``n = k`` samples this is the unbiased
  estimator of Chen et al. (2021), ``1 - C(n - c, k) / C(n, k)``, at ``n = k``.

The generator is any :class:`runtime.workloads.agents.base.Generator`: the trainer leader
uses its own model (runtime/engines/torch/generate.py). An episode that ends with no score
(aborted, or an exception anywhere in it: the generation, the agent) scores 0 and is
counted (``unscored``, logged with its reason); an environment or reward that fails scores
0 inside the agent, as in training. Nothing is skipped, so a set's figures are always over
all of its prompts, and an eval never ends the run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.config.schema import Config
from runtime.data.eval_scores import SetScores
from runtime.workloads.agents.base import AgentEnv, Generator
from runtime.workloads.agents.settings import AgentEnvConfig

log = logging.getLogger(__name__)


def eval_prompts(cfg: Config, path: str) -> tuple[list[dict[str, Any]], Callable[[int], Any]]:
    """The set's prompts as the dispatcher makes them (``index``, ``prompt_ids``), the
    first ``eval.max_prompts`` that leave room for a response, and its record lookup (a
    record without a ``data_source`` gets the set's file name, as verl's files carry)."""
    from runtime.data.codec import codec_for
    from runtime.data.prompts import prompt_set
    from runtime.data.settings import PromptsConfig
    from runtime.embedded.resolve import resolve_model_path

    prompts = prompt_set(PromptsConfig.from_config(cfg), path)
    codec = codec_for(resolve_model_path(cfg.model.path), cfg.model.path)
    room = cfg.model.max_seq_len - min(cfg.workload.max_response_tokens, 16)
    out: list[dict[str, Any]] = []
    for i in range(len(prompts)):
        if len(out) >= cfg.eval.max_prompts:
            break
        ids = codec.prompt_ids(prompts.text(i))
        if len(ids) <= room:
            out.append({"index": i, "prompt_ids": ids})
    source = Path(path).stem

    def record(i: int) -> Any:
        r = prompts.record(i)
        return r if "data_source" in r else {**r, "data_source": source}

    return out, record


async def score_set(
    cfg: Config,
    agent: Any,
    prompts: list[dict[str, Any]],
    record: Callable[[int], Any],
    greedy: Generator,
    sampled: Generator,
    pool: Any,
    keepalive: Callable[[], None] = lambda: None,
) -> SetScores:
    """Play every prompt once with ``greedy`` and ``eval.k`` times with ``sampled``;
    ``keepalive`` is called between episodes (the rank's heartbeat: a set can take
    minutes)."""
    from runtime.data.codec import codec_for
    from runtime.embedded.resolve import resolve_model_path

    codec = codec_for(resolve_model_path(cfg.model.path), cfg.model.path)
    scores = SetScores(cfg.eval.k, cfg.eval.solved_at)
    envs = [
        AgentEnv(AgentEnvConfig.from_config(cfg), codec, g, record, pool) for g in (greedy, sampled)
    ]
    for n, prompt in enumerate(prompts):
        rewards = []
        for j in range(cfg.eval.k + 1):
            env, rid = envs[min(j, 1)], f"eval{n}-{j}"
            try:
                ep = await agent.run(env, rid, prompt)
            except Exception as exc:  # scored 0 and counted: an eval never ends a run
                log.warning("eval episode %s failed: %s", rid, f"{type(exc).__name__}: {exc}"[:300])
                ep = None
            finally:
                env.forget(rid)
            if ep is None:
                scores.failed += 1
            rewards.append(0.0 if ep is None else float(ep.reward))
            keepalive()
        scores.add(rewards[0], rewards[1:])
    return scores


def evaluate(
    cfg: Config,
    generators: tuple[Any, Any],
    version: int,
    pool: Any,
    keepalive: Callable[[], None],
) -> dict[str, float]:
    """Every ``data.eval`` set played by ``generators`` (greedy, then sampled at
    ``eval.temperature``: the caller's, over the policy of ``version``): figures as
    ``eval/<set>/<figure>``. The torch RNG is seeded (``train.seed`` and ``version``) and
    given back after: an eval neither depends on nor moves the training's random stream."""
    import asyncio

    import torch

    from runtime.workloads.agents import registry

    greedy, sampled = generators
    agent = registry.agent(cfg.workload.kind)
    out: dict[str, float] = {}
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(cfg.train.seed * 1_000_003 + version)
        for name, path in cfg.data.eval.items():
            prompts, record = eval_prompts(cfg, path)
            scores = asyncio.run(
                score_set(cfg, agent, prompts, record, greedy, sampled, pool, keepalive)
            )
            out.update({f"eval/{name}/{k}": v for k, v in scores.metrics().items()})
            # always written, so the last eval's count replaces an earlier one
            out[f"eval/{name}/unscored"] = float(scores.failed)
    return out
