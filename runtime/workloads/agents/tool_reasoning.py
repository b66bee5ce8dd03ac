"""Tool-interactive reasoning (ReTool-style): the model may write a code block
(``workload.tool_open`` ... ``tool_close``) mid-reasoning; generation stops at the close
tag, the code runs in the sandbox, its output is appended as
``<interpreter>...</interpreter>`` (environment tokens, loss mask 0) and generation goes
on in the same assistant turn. At most ``max_turns - 1`` tool calls; the math reward of
the model's own text at the end."""

from __future__ import annotations

from typing import Any

from runtime.workloads.agents import scoring
from runtime.workloads.agents.base import AgentEnv, Episode

MAX_TOOL_OUTPUT = 512  # characters of a tool's output put back into the context


def tool_output_text(result: Any, error: str | None) -> str:
    if result is None:
        body = f"error: {error}"
    elif result.status == "ok":
        body = result.stdout
    elif result.status == "error":
        body = result.stdout + result.describe()  # the exception's last line
    else:
        body = result.stdout + f"[{result.status}]"
    body = body.strip()
    if len(body) > MAX_TOOL_OUTPUT:
        body = body[:MAX_TOOL_OUTPUT] + "..."
    return f"\n<interpreter>\n{body}\n</interpreter>\n"


class ToolAgent:
    async def run(self, env: AgentEnv, request_id: str, prompt: dict[str, Any]) -> Episode | None:
        w = env.config.workload
        ep = env.episode(request_id, prompt)
        calls = 0
        for turn in range(w.max_turns):
            g = await env.generate(ep, f"{request_id}-t{turn}", stop=[w.tool_close])
            if g is None:
                break
            if g.finish == "abort":
                return None
            ep.add_model(g)
            text = env.codec.decode(g.tokens)
            called = g.stop_reason == w.tool_close and w.tool_open in text
            if not called or turn == w.max_turns - 1:
                break
            code = text.rsplit(w.tool_open, 1)[1].rsplit(w.tool_close, 1)[0]
            result, error = await env.call(
                scoring.run_snippet, code, env.config.sandbox, on_thread=True
            )
            calls += 1
            ids = env.codec.encode(tool_output_text(result, error))
            if len(ep.context) + len(ids) >= env.config.max_seq_len:
                break
            ep.add_env(ids)
        ep.info["tool_calls"] = calls
        if await env.custom_reward(ep, prompt):  # the recipe's own reward replaces math's
            return ep
        text = env.codec.decode(ep.model_ids())
        value, error = await env.call(scoring.math_score, text, env.record(prompt)["answer"])
        ep.reward = float(value or 0.0)
        if error:
            ep.info["reward_error"] = error
        return ep
