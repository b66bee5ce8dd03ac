"""Simulator parameters for the CPU engines of this repository, from a recipe.

The synthetic engines (runtime/engines/synthetic.py) are real processes on the real control plane
whose compute is a known time model: a generation of ``n`` tokens takes
``n * engine.synthetic_token_s`` whatever runs beside it, on at most 16 slots, with
log-normal lengths (median ``max_response_tokens / 8``, sigma 0.8); a training step sleeps
``tokens * engine.synthetic_train_token_s / trainer ranks``. Comparing a real run of them
with its simulation measures what the simulator leaves out (messaging, scheduling delays,
the trainer's own compute), which is what ``tests/integration/test_sim_vs_real.py`` does.

:func:`fit_run` does the same for any finished run, the vLLM/torch ones included, from
what its folder recorded: trainer tokens per busy rank-second (``step_time_s``), the
rollout engines' decode step ``base + per_seq * c`` fitted to their measured tokens/s at
each concurrency c (``rollout_decode_by_concurrency`` in the summary, from heartbeats; see
:mod:`runtime.control.decode_rates`), the weight-sync median, the response lengths at the start
and the end of training, and a reward level at which the simulated sampler drops as many
groups as the run's did (``status.json``). Lengths are log-normal with an assumed spread
(runs record only means).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from runtime.config.recipe import load_recipe
from runtime.config.schema import Config
from runtime.control.decode_rates import fit_decode_curve
from runtime.data.lengths import synthetic_lengths
from runtime.sim.parameters import ModelProfile, WorkloadProfile

SYNTHETIC_SLOTS = 16  # runtime.engines.synthetic.SyntheticRollout: min(max_concurrency, 16)


def cpu_model(
    name: str,
    cfg: Config,
    *,
    step: tuple[float, float],
    kv_tokens: int,
    train_tok_s: float,
    weight_sync_s: float,
) -> ModelProfile:
    """A model profile for engines of this machine: decode step ``step[0] + step[1] * c``,
    no prefill cost, role switches free (they take milliseconds here)."""
    return ModelProfile(
        name=name,
        params_b=0.0,
        kv_bytes_per_token=0,
        rollout_gpus_per_replica=cfg.resources.rollout_gpus_per_replica,
        trainer_gpus_per_replica=cfg.resources.trainer_gpus_per_replica,
        step_base_s=step[0],
        step_per_seq_s=step[1],
        prefill_tok_s=1e12,
        kv_tokens=kv_tokens,
        train_tok_s=train_tok_s,
        weight_sync_s=weight_sync_s,
        switch_s=0.0,
        # CPU engines do not sleep; an in-place load costs what the measured reload did
        colocated_sync_s=weight_sync_s,
        wake_s=0.0,
    )


def synthetic_profiles(cfg: Config) -> tuple[ModelProfile, WorkloadProfile]:
    e, w = cfg.engine, cfg.workload
    model = cpu_model(
        "cpu-synthetic",
        cfg,
        step=(e.synthetic_token_s, 0.0),
        kv_tokens=e.synthetic_kv_tokens or 10**12,
        # the sleep is split over the trainer ranks: per rank, 1 / (seconds per token)
        train_tok_s=1.0 / e.synthetic_train_token_s if e.synthetic_train_token_s else 1e12,
        weight_sync_s=0.0,
    )
    lengths = synthetic_lengths(w.max_response_tokens)  # the engine's, without a schedule
    workload = WorkloadProfile(
        name="synthetic",
        prompt_tokens=1,
        median_start=lengths.base,
        median_end=lengths.base,
        sigma=lengths.sigma,
        max_tokens=w.max_response_tokens,
        turns=1,
        tool_s_median=0.0,
        reward_start=0.5,
        reward_end=0.5,
    )
    return model, workload


LENGTH_SIGMA = 0.5  # log-normal spread assumed for response lengths (runs log only means)


@dataclass(frozen=True)
class RunFit:
    cfg: Config
    model: ModelProfile
    workload: WorkloadProfile
    max_seqs: int
    tokens_per_s: float  # the run's trainer throughput over its training window


def window_throughput(lines: list[dict]) -> float:
    """Trained tokens per second between the first and the last step."""
    steps = [m for m in lines if "tokens" in m]
    if len(steps) < 2:
        raise ValueError("fewer than two training steps")
    tokens = sum(m["tokens"] for m in steps[1:])
    return tokens / max(steps[-1]["wall_s"] - steps[0]["wall_s"], 1e-9)


def fit_run(run_dir: Path | str) -> RunFit:
    """Simulator parameters measured from a finished run's folder (see the module doc)."""
    run_dir = Path(run_dir)
    cfg = load_recipe(run_dir / "config.yaml")
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "tokens" in m and m.get("step_time_s")]
    if len(steps) < 5:
        raise ValueError(f"{run_dir}: fewer than 5 timed training steps to fit")
    # the layout (rollout:trainer ranks) of each step: every trainer rank spent step_time_s
    trainer_rank_s = sum(m["step_time_s"] * int(m["layout"].split(":")[1]) for m in steps)
    train_tok_s = sum(m["tokens"] for m in steps) / trainer_rank_s
    curve = fit_decode_curve(summary.get("rollout_decode_by_concurrency") or {})
    if curve is None:  # one operating point: a rate independent of concurrency
        rollout_ranks = int(steps[0]["layout"].split(":")[0])
        busy = max(1.0 - summary["rollout_idle_ratio"], 1e-3)
        curve = (0.0, rollout_ranks * busy / summary["rollout_tokens_per_s"])
    syncs = [m["weight_sync_s"] for m in lines if "weight_sync_s" in m]
    model = cpu_model(
        "cpu-fitted",
        cfg,
        step=curve,
        kv_tokens=10**12,
        train_tok_s=train_tok_s,
        weight_sync_s=statistics.median(syncs) if syncs else 0.0,
    )
    fifth = max(1, len(steps) // 5)
    b = cfg.train.batch_size

    def median_len(part: list[dict]) -> float:  # from the mean tokens per sample
        return statistics.fmean(m["tokens"] / b for m in part) / math.exp(LENGTH_SIGMA**2 / 2)

    prompts = [len(p.get("prompt_ids") or ()) for p in _first_prompts(cfg, 64)]
    # In the simulator the reward only decides which groups a filtering sampler drops (all
    # equal rewards). Real prompts differ in difficulty, so many more groups are uniform
    # than independent draws at the batch's mean reward would give: the reward is set so
    # that the simulated drop rate is the one the run measured.
    reward = statistics.fmean(m["reward_mean"] for m in steps)
    buffer = _status(run_dir).get("buffer", {})
    if buffer.get("delivered"):
        dropped = buffer.get("evicted", {}).get("sampler_rejected", 0) / buffer["delivered"]
        reward = reward_for_drop_rate(dropped, cfg.algorithm.group_size)
    workload = WorkloadProfile(
        name="cpu-fitted",
        prompt_tokens=max(1, round(statistics.fmean(prompts))) if prompts else 1,
        median_start=median_len(steps[:fifth]),
        median_end=median_len(steps[-fifth:]),
        sigma=LENGTH_SIGMA,
        max_tokens=cfg.workload.max_response_tokens,
        turns=cfg.workload.max_turns,
        tool_s_median=0.0,
        reward_start=reward,
        reward_end=reward,
    )
    max_seqs = min(cfg.engine.max_num_seqs, cfg.scheduler.max_concurrency)
    return RunFit(cfg, model, workload, max_seqs, window_throughput(lines))


def reward_for_drop_rate(dropped: float, n: int) -> float:
    """p <= 0.5 such that a group of n independent Bernoulli(p) rewards is uniform (all 0
    or all 1) with probability ``dropped``: p**n + (1 - p)**n = dropped."""
    lo, hi = 0.0, 0.5  # the uniform probability falls from 1 at p = 0 to 2 / 2**n at 0.5
    if dropped <= 2 * 0.5**n:
        return 0.5
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid**n + (1 - mid) ** n > dropped:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _first_prompts(cfg: Config, n: int) -> list[dict]:
    from runtime.engines.registry import build_prompts

    try:
        return list(itertools.islice(build_prompts(cfg), n))
    except Exception:  # no tokenizer or data here: the prompt length stays a guess
        return []


def simulate_fit(fit: RunFit, *, seed: int = 0) -> float:
    """The fitted run simulated: its trainer tokens/s over the training window."""
    from runtime.sim.cluster import SimCluster

    result = SimCluster(
        fit.cfg,
        fit.model,
        fit.workload,
        seed=seed,
        block=1,
        heartbeat_s=fit.cfg.control.heartbeat_interval_s,
        max_seqs=fit.max_seqs,
    ).run()
    return window_throughput(result.metrics)
