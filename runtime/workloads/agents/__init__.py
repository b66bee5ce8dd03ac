"""Agent loops: how one request becomes a scored trajectory on the rollout side.

An agent drives the engine turn by turn through
:class:`runtime.workloads.agents.base.AgentEnv` (generation, the sandbox and rewards in a
process pool), builds an :class:`~runtime.workloads.agents.base.Episode` whose environment
tokens (test feedback, tool output) carry loss mask 0, and scores it. Agents are chosen by
``workload.kind`` from :data:`runtime.workloads.agents.registry.AGENTS`, which reads them
from the kinds' records (:mod:`runtime.config.workload_kinds`).
"""
