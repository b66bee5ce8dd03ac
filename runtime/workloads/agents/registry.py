"""Agent loops by ``workload.kind``, as :mod:`runtime.config.workload_kinds` records them."""

from __future__ import annotations

from runtime.config.workload_kinds import KINDS
from runtime.workloads.agents.base import Agent

AGENTS: dict[str, type] = {name: k.agent_class() for name, k in KINDS.items()}

# Workloads whose generation stops on strings: the engine needs its tokenizer for them.
NEEDS_STOP_STRINGS = frozenset(name for name, k in KINDS.items() if k.stop_strings)


def agent(kind: str) -> Agent:
    if kind not in AGENTS:
        raise KeyError(f"workload.kind: {kind!r} has no agent loop")
    return AGENTS[kind]()
