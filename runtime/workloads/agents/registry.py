"""Agent loops by ``workload.kind``."""

from __future__ import annotations

from runtime.workloads.agents.base import Agent
from runtime.workloads.agents.code_agent import CodeAgent
from runtime.workloads.agents.single_turn import ArithAgent, SingleTurnAgent
from runtime.workloads.agents.tool_reasoning import ToolAgent

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
