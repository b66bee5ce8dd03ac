"""A scripted engine for agent-loop tests: it replays given model turns (as the real
engine returns them: token ids, log-probs, spans, finish, stop string) so a test knows
exactly which tokens are the model's and which the environment's."""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.config.schema import Config
from runtime.data.codec import ChatCodec
from runtime.workloads.agents.base import AgentEnv, Generation
from runtime.workloads.agents.pool import RewardPool
from runtime.workloads.agents.settings import AgentEnvConfig


class ScriptedEngine:
    def __init__(self, codec: ChatCodec, turns: list[str], stop_on: str | None = None) -> None:
        self.codec, self.turns, self.stop_on = codec, list(turns), stop_on
        self.contexts: list[list[int]] = []
        self.version = 3

    async def generate_turn(self, request_id, prompt_ids, max_tokens, stop) -> Generation:
        self.contexts.append(list(prompt_ids))
        text = self.turns.pop(0)
        stopped = bool(stop) and any(text.endswith(s) for s in stop)
        ids = self.codec.encode(text)
        if not stopped:
            ids.append(self.codec.eos_id)  # a turn that ends normally ends with EOS
        ids = ids[:max_tokens]
        logprobs = [-0.25] * len(ids)
        reason = next((s for s in stop or [] if text.endswith(s)), None)
        return Generation(ids, logprobs, [(self.version, 0, len(ids))], "stop", reason)


def chat_codec() -> ChatCodec:
    from runtime.embedded.tiny_chat import build_tokenizer

    return ChatCodec(tokenizer=build_tokenizer())


def run_agent(
    agent,
    cfg: Config,
    engine: ScriptedEngine,
    prompt_text: str,
    record: dict,
    pool: RewardPool | None = None,
):
    codec = engine.codec
    own = pool is None
    pool = pool or RewardPool(1, cfg.workload.reward_timeout_s + 30)
    env = AgentEnv(AgentEnvConfig.from_config(cfg), codec, engine, lambda i: record, pool)
    prompt: dict[str, Any] = {"index": 0, "prompt_ids": codec.prompt_ids(prompt_text)}
    try:
        return asyncio.run(agent.run(env, "s1", prompt)), env
    finally:
        if own:
            pool.close()


def segments(ep) -> list[tuple[int, list[int]]]:
    """The episode as runs of (mask value, token ids)."""
    out: list[tuple[int, list[int]]] = []
    for t, m in zip(ep.token_ids, ep.loss_mask, strict=True):
        if out and out[-1][0] == m:
            out[-1][1].append(t)
        else:
            out.append((m, [t]))
    return out
