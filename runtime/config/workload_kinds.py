"""The workload kinds: one record per ``workload.kind``, the one place that says what each
kind is made of.

A record names its agent loop by ``"module:attr"`` and imports it only when asked, so this
module imports nothing of the runtime: the recipe schema takes its choices from here, and
validating a recipe stays light (no torch, no vLLM, no sandbox). Every per-kind table
elsewhere is derived from these records:

- :mod:`runtime.config.schema`: the choices of ``workload.kind`` (:data:`KIND_NAMES`);
- :mod:`runtime.workloads.agents.registry`: the agent loops and the kinds whose generation
  stops on strings;
- :mod:`runtime.workloads.sandbox`: the kinds that run model-written code;
- :mod:`runtime.data.datasets`: the record fields each kind reads;
- :mod:`runtime.sim.run`: the simulator's workload profile of each kind;
- the trainer (:mod:`runtime.engines.torch.trainer`): whether it evaluates the policy on the
  embedded task.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadKind:
    name: str
    # The agent loop, "module:attr" of a class with ``async run(env, request_id, prompt)``.
    agent: str
    # Roles a dataset record must have (before ``data.fields`` maps them); () = none, as
    # for the embedded task, whose prompts are generated.
    fields: tuple[str, ...] = ()
    # Runs model-written code: ``reflow launch`` sets up the sandbox first.
    needs_sandbox: bool = False
    # Generation stops on strings: the rollout engine needs its tokenizer (detokenize).
    stop_strings: bool = False
    # The simulator's workload profile (runtime/sim/profiles); None = ``--workload`` needed.
    sim_workload: str | None = None
    # The embedded arith task (runtime/embedded/arith.py): the trainer measures the policy's
    # greedy accuracy on it before the first request and after the last step.
    trainer_eval: bool = False

    def agent_class(self) -> type:
        """The agent loop's class, imported now."""
        module, _, attr = self.agent.partition(":")
        return getattr(importlib.import_module(module), attr)


_AGENTS = "runtime.workloads.agents"

KINDS: dict[str, WorkloadKind] = {
    k.name: k
    for k in (
        WorkloadKind(
            "arith",
            f"{_AGENTS}.single_turn:ArithAgent",
            sim_workload="math",
            trainer_eval=True,
        ),
        WorkloadKind(
            "math",
            f"{_AGENTS}.single_turn:SingleTurnAgent",
            fields=("prompt", "answer"),
            sim_workload="math",
        ),
        WorkloadKind(
            "code_agent",
            f"{_AGENTS}.code_agent:CodeAgent",
            fields=("prompt", "tests"),
            needs_sandbox=True,
            sim_workload="apps_agent",
        ),
        WorkloadKind(
            # your own environment (workload.agent), played by one loop for all
            "custom",
            f"{_AGENTS}.environment:EnvAgent",
            fields=("prompt",),
        ),
        WorkloadKind(
            "tool_reasoning",
            f"{_AGENTS}.tool_reasoning:ToolAgent",
            fields=("prompt", "answer"),
            needs_sandbox=True,
            stop_strings=True,
            sim_workload="retool",
        ),
    )
}

# The values ``workload.kind`` may take, in the recipe reference's order.
KIND_NAMES: tuple[str, ...] = tuple(KINDS)


def workload_kind(name: str) -> WorkloadKind:
    """The record of ``name``; KeyError (one line) for a kind that has none."""
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"workload.kind: {name!r} is not one of: {', '.join(KIND_NAMES)}") from None
