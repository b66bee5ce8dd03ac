"""The engines and embedded prompt sources by the names recipes use, as import strings.

The config layer validates ``engine.rollout``, ``engine.trainer`` and ``data.train``
against these tables; runtime/engines/registry.py, the edge that resolves them, imports
the strings on first use (so validating a recipe imports no engine code at all).
"""

from __future__ import annotations

ROLLOUT_ENGINES: dict[str, str] = {
    "placeholder": "runtime.rank.sides:placeholder_rollout",
    "synthetic": "runtime.engines.synthetic:synthetic_rollout",
    "vllm": "runtime.engines.vllm.rollout:VLLMRolloutSide",
}
TRAINER_ENGINES: dict[str, str] = {
    "placeholder": "runtime.rank.sides:placeholder_trainer",
    "synthetic": "runtime.engines.synthetic:synthetic_trainer",
    "torch": "runtime.engines.torch.trainer_side:TorchTrainerSide",
}
# Rollout engines that play the held-out eval sets themselves (runtime/control/evals.py):
# with another engine the trainer leader plays them (runtime/engines/torch/trainer_eval.py).
EVAL_ROLLOUT_ENGINES = frozenset({"vllm"})
PROMPT_SOURCES: dict[str, str] = {
    "embedded:synthetic": "runtime.engines.synthetic:synthetic_prompts",
    "embedded:arith": "runtime.embedded.arith:arith_prompts",
    "embedded:arith-drift": "runtime.embedded.arith:arith_drift_prompts",
}
