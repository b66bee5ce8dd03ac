"""What an agent run takes of a run's config: its own sections, bundled once at the edge
(the rollout side, the trainer-side eval, a test) by :meth:`AgentEnvConfig.from_config`, so
agents, environments and their rewards read no other part of the run's config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from runtime.config.schema import Config, SandboxConfig, WorkloadConfig


@dataclass(frozen=True)
class AgentEnvConfig:
    workload: WorkloadConfig
    """The workload: its kind, response and turn budgets, tools, rewards and their timeouts."""
    sandbox: SandboxConfig
    """Where model-written code runs (tool calls, tests, a ReTool snippet)."""
    max_seq_len: int
    """``model.max_seq_len``: prompt and response together; an episode ends at it."""
    data_source: str
    """verl's ``data_source`` for records without one: the train file's name, or the
    workload kind for generated prompts (a mix's records carry their own file's:
    runtime/data/prompts.py)."""

    @classmethod
    def from_config(cls, cfg: Config) -> AgentEnvConfig:
        files = cfg.data.files()  # none for embedded prompts
        return cls(
            workload=cfg.workload,
            sandbox=cfg.sandbox,
            max_seq_len=cfg.model.max_seq_len,
            data_source=Path(files[0].path).stem if files else cfg.workload.kind,
        )
