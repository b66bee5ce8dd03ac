"""From a recipe and a GPU count to a simulated run and its figures (``reflow simulate``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config.recipe import RecipeError, rebuild
from runtime.config.schema import Config
from runtime.sim.cluster import SimCluster, SimResult
from runtime.sim.parameters import DEFAULT_PROFILES, ProfileError, Profiles, load_profiles
from runtime.workloads.kinds import KINDS

# The workload model a recipe's agent loop maps to, when --workload is not given.
WORKLOAD_OF_KIND = {name: k.sim_workload for name, k in KINDS.items() if k.sim_workload}


def model_name(cfg: Config) -> str:
    """qwen3-8b for model.path .../Qwen3-8B; the profile key of a recipe's model."""
    tail = cfg.model.path.rstrip("/").rsplit("/", 1)[-1].lower()
    return tail.replace("-instruct", "").replace("-base", "")


@dataclass(frozen=True)
class SimPlan:
    cfg: Config
    model: str
    workload: str


def plan(
    cfg: Config,
    gpus: int,
    *,
    mode: str | None = None,
    model: str | None = None,
    workload: str | None = None,
    profiles: Profiles | None = None,
) -> SimPlan:
    """The recipe resized to ``gpus`` (whole nodes) with the model's replica sizes, in
    ``mode`` if given. Both changes go through the recipe's own checks
    (:func:`runtime.config.recipe.rebuild`): an unknown mode is the one-line error that
    ``reflow.mode`` in a recipe or ``--set`` gets."""
    if mode is not None and mode != cfg.reflow.mode:
        # a baseline mode replays nothing (sigma must be 0 outside reflow); reflow gets
        # its default share
        sigma = None if mode == "reflow" else 0.0
        cfg = rebuild(cfg, {"reflow.mode": mode, "reflow.sigma": sigma}, source=f"--mode {mode}")
    profiles = profiles or load_profiles()
    name = model or model_name(cfg)
    m = profiles.model(name)
    kind = workload or WORKLOAD_OF_KIND.get(cfg.workload.kind)
    if kind is None:
        raise ProfileError(f"workload.kind {cfg.workload.kind!r} has no model: pass --workload")
    profiles.workload(kind)
    per_node = cfg.resources.gpus_per_node
    if gpus % per_node:
        raise RecipeError(f"--gpus {gpus}: not a multiple of resources.gpus_per_node={per_node}")
    resized = {
        "resources.nodes": gpus // per_node,
        "resources.trainer_gpus_per_replica": m.trainer_gpus_per_replica,
        "resources.rollout_gpus_per_replica": m.rollout_gpus_per_replica,
        "resources.initial_ratio": None,  # the split of the new size, from rollout_fraction
    }
    new = rebuild(cfg, resized, source=f"--gpus {gpus}")
    return SimPlan(new, name, kind)


def simulate(
    sim_plan: SimPlan, *, seed: int = 0, profiles_path: Path | str = DEFAULT_PROFILES
) -> SimResult:
    profiles = load_profiles(profiles_path)
    return SimCluster(
        sim_plan.cfg,
        profiles.model(sim_plan.model),
        profiles.workload(sim_plan.workload),
        seed=seed,
    ).run()


def figures(result: SimResult, gpus: int) -> dict[str, Any]:
    """Throughput, idle ratios and the ideal-throughput bound of one simulated run.

    Bound: with r the tokens one rollout GPU generates per busy second, t the tokens one
    trainer GPU trains per busy second, and a the tokens trained per token generated
    (replay reuses samples, staleness evicts some), a split of G GPUs is balanced when
    rollout supply meets trainer demand, which gives X* = G·r·a·t / (r·a + t).
    """
    s = result.summary
    x = result.trained_tokens / max(result.sim_s, 1e-9)
    r = result.rollout_tokens / max(result.rollout_gpu_busy_s, 1e-9)
    t = result.trained_tokens / max(result.trainer_gpu_busy_s, 1e-9)
    a = result.trained_tokens / max(result.rollout_tokens, 1e-9)
    bound = gpus * r * a * t / (r * a + t) if r > 0 and t > 0 else 0.0
    return {
        "mode": s["mode"],
        "steps": s["steps"],
        "sim_hours": round(result.sim_s / 3600, 3),
        "trainer_tokens_per_s": round(x, 1),
        "trainer_idle_ratio": s["trainer_idle_ratio"],
        "rollout_idle_ratio": s["rollout_idle_ratio"],
        "bound_tokens_per_s": round(bound, 1),
        "efficiency": round(x / bound, 4) if bound else None,
        "trainer_idle_by_cause": s.get("trainer_idle_by_cause", {}),
        "rollout_idle_by_cause": s.get("rollout_idle_by_cause", {}),
        "replay_share": round(
            sum(m["batch_replay"] for m in result.metrics)
            / max(sum(m["batch_unused"] + m["batch_replay"] for m in result.metrics), 1),
            4,
        ),
        "placements": [p[2] for p in result.placements],
        "lost": s["samples"]["lost"],
        "evicted": s["samples"]["evicted"],
        # in tokens (the simulator's samples count blocks of ``block`` tokens)
        "wasted_tokens": {k: v * result.block for k, v in s.get("wasted_tokens", {}).items()},
        "length_bias": {
            k: None if v is None else round(v * result.block, 1)
            for k, v in s.get("length_bias", {}).items()
        },
        "real_s": round(result.real_s, 2),
    }
