"""Single-turn reasoning: prompt -> response -> reward (math-verify, or the embedded
arithmetic task's rule)."""

from __future__ import annotations

from typing import Any

from runtime.workloads.agents import scoring
from runtime.workloads.agents.base import AgentEnv, Episode


class SingleTurnAgent:
    async def run(self, env: AgentEnv, request_id: str, prompt: dict[str, Any]) -> Episode | None:
        ep = env.episode(request_id, prompt)
        g = await env.generate(ep, request_id)
        if g is None or g.finish == "abort":
            return None
        ep.add_model(g)
        ep.info["turns"] = 1
        if not await env.custom_reward(ep, prompt):
            await self.score(env, ep, prompt)
        return ep

    async def score(self, env: AgentEnv, ep: Episode, prompt: dict[str, Any]) -> None:
        text = env.codec.decode(ep.model_ids())
        value, error = await env.call(scoring.math_score, text, env.record(prompt)["answer"])
        ep.reward = float(value or 0.0)
        if error:
            ep.info["reward_error"] = error


class ArithAgent(SingleTurnAgent):
    """The embedded task: scored in-process (a regex on a short string)."""

    async def score(self, env: AgentEnv, ep: Episode, prompt: dict[str, Any]) -> None:
        from runtime.embedded.arith import reward

        ep.reward = reward(env.codec.decode(ep.model_ids()), int(prompt["answer"]))
