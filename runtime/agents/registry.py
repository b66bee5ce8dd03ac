"""Agent loops by ``workload.kind``."""

from __future__ import annotations

from runtime.agents.base import Agent
from runtime.agents.code_agent import CodeAgent
from runtime.agents.single_turn import ArithAgent, SingleTurnAgent
from runtime.agents.tool_reasoning import ToolAgent

AGENTS: dict[str, type] = {
    "arith": ArithAgent,
    "math": SingleTurnAgent,
    "code_agent": CodeAgent,
    "tool_reasoning": ToolAgent,
}

# Workloads whose generation stops on strings: the engine needs its tokenizer for them.
NEEDS_STOP_STRINGS = {"tool_reasoning"}


def agent(kind: str) -> Agent:
    if kind not in AGENTS:
        raise KeyError(f"workload.kind: {kind!r} has no agent loop")
    return AGENTS[kind]()
