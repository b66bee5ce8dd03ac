"""Simulator parameters for the CPU engines of this repository, from a recipe.

The synthetic engines (runtime/synthetic.py) are real processes on the real control plane
whose compute is a known time model: a generation of ``n`` tokens takes
``n * engine.synthetic_token_s`` whatever runs beside it, on at most 16 slots, with
log-normal lengths (median ``max_response_tokens / 8``, sigma 0.8); a training step sleeps
``tokens * engine.synthetic_train_token_s / trainer ranks``. Comparing a real run of them
with its simulation measures what the simulator leaves out (messaging, scheduling delays,
the trainer's own compute), which is what ``tests/integration/test_sim_vs_real.py`` does.
"""

from __future__ import annotations

from runtime.config import Config
from runtime.sim.profile import ModelProfile, WorkloadProfile

SYNTHETIC_SLOTS = 16  # runtime.synthetic.SyntheticRollout: min(max_concurrency, 16)


def synthetic_profiles(cfg: Config) -> tuple[ModelProfile, WorkloadProfile]:
    e, w = cfg.engine, cfg.workload
    model = ModelProfile(
        name="cpu-synthetic",
        params_b=0.0,
        kv_bytes_per_token=0,
        rollout_gpus_per_replica=cfg.resources.rollout_gpus_per_replica,
        trainer_gpus_per_replica=cfg.resources.trainer_gpus_per_replica,
        step_base_s=e.synthetic_token_s,
        step_per_seq_s=0.0,
        prefill_tok_s=1e12,
        kv_tokens=e.synthetic_kv_tokens or 10**12,
        # the sleep is split over the trainer ranks: per rank, 1 / (seconds per token)
        train_tok_s=1.0 / e.synthetic_train_token_s if e.synthetic_train_token_s else 1e12,
        weight_sync_s=0.0,
        switch_s=0.0,
    )
    median = w.max_response_tokens / 8
    workload = WorkloadProfile(
        name="synthetic",
        prompt_tokens=1,
        median_start=median,
        median_end=median,
        sigma=0.8,
        max_tokens=w.max_response_tokens,
        turns=1,
        tool_s_median=0.0,
        reward_start=0.5,
        reward_end=0.5,
    )
    return model, workload
