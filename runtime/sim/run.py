"""From a recipe and a GPU count to a simulated run and its figures (``reflow simulate``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.config.modes import POLICIES
from runtime.config.recipe import RecipeError, rebuild
from runtime.config.schema import Config
from runtime.config.workload_kinds import KINDS
from runtime.sim.cluster import SimCluster, SimResult
from runtime.sim.lora import lora_profile, sync_bytes
from runtime.sim.parameters import DEFAULT_PROFILES, ProfileError, Profiles, load_profiles

# The workload model a recipe's agent loop maps to, when --workload is not given.
WORKLOAD_OF_KIND = {name: k.sim_workload for name, k in KINDS.items() if k.sim_workload}

# The measurement protocol, the same for every mode: (warm-up, measured) RL iterations, an
# iteration being what verl and the papers call a step: one generation batch and its
# updates, which here is one weight-sync interval (train.sync_every trainer steps; the
# shipped recipes' batch sizes follow "Make replay pay at cluster scale"). Agent workloads
# vary more from iteration to iteration (turns, tool calls), so they measure longer. A
# workload not named here gets DEFAULT_PROTOCOL.
PROTOCOL = {"math": (5, 5), "apps_agent": (10, 10), "retool": (10, 10)}
DEFAULT_PROTOCOL = PROTOCOL["math"]


class ProtocolError(RecipeError):
    """A run too short for the measurement protocol (a RecipeError: it is train.steps that
    is too small, and the CLI prints those as one line)."""


def model_name(cfg: Config) -> str:
    """qwen3-8b for model.path .../Qwen3-8B; the profile key of a recipe's model."""
    tail = cfg.model.path.rstrip("/").rsplit("/", 1)[-1].lower()
    return tail.replace("-instruct", "").replace("-base", "")


@dataclass(frozen=True)
class SimPlan:
    cfg: Config
    model: str
    workload: str


def mode_definition(cfg: Config, mode: str | None, sets: Sequence[str] = ()) -> dict[str, Any]:
    """The config changes that make ``cfg`` run as ``mode`` (None: none, the recipe as it
    is), as each mode is defined: a baseline keeps its initial placement and fixed concurrency
    caps and replays nothing; ``reflow`` is async plus replay, the allocator and adaptive
    caps. A field the user set (``sets``, the ``--set FIELD=VALUE`` items the recipe was
    loaded with) is left as set: ``--set scheduler.adaptive_caps=false`` is an ablation of
    reflow, and a baseline with the allocator on is refused by the recipe's own check
    rather than silently turned off."""
    if mode is None:  # the recipe as written (its own checks hold a baseline to its definition)
        return {}
    target = mode
    # (a name that is no mode gets a baseline's changes: rebuild refuses it in one line)
    p = POLICIES.get(target)
    adaptive = p is not None and not p.baseline  # the allocator and adaptive caps
    changes: dict[str, Any] = {
        "scheduler.auto_rebalance": adaptive,
        "scheduler.adaptive_caps": adaptive,
    }
    if not adaptive:  # a baseline never lends; reflow lends where the recipe says so
        changes["scheduler.lend_trainer"] = False
        changes["reflow.max_stragglers"] = None  # and waits for whole groups (its default)
    if p is None or not p.replay:
        changes["reflow.sigma"] = 0.0  # sigma must be 0 where replay is off
    elif target != cfg.reflow.mode:
        changes["reflow.sigma"] = None  # the mode's default replay share
    given = given_fields(sets)
    changes = {k: v for k, v in changes.items() if k not in given and _get(cfg, k) != v}
    if target != cfg.reflow.mode:  # --mode wins over a --set reflow.mode
        changes["reflow.mode"] = target
        # the split is the new mode's (colocated_sync has none): from rollout_fraction,
        # unless the user set it (plan() puts a --set one back after resizing)
        changes["resources.initial_ratio"] = None
    return changes


def given_fields(sets: Sequence[str]) -> set[str]:
    """The dotted fields named by ``--set FIELD=VALUE`` items."""
    return {item.split("=", 1)[0].strip() for item in sets}


def _get(cfg: Config, dotted: str) -> Any:
    section, name = dotted.split(".")
    return getattr(getattr(cfg, section), name)


def plan(
    cfg: Config,
    gpus: int,
    *,
    mode: str | None = None,
    model: str | None = None,
    workload: str | None = None,
    profiles: Profiles | None = None,
    sets: Sequence[str] = (),
) -> SimPlan:
    """The recipe resized to ``gpus`` (whole nodes) with the model's replica sizes, run as
    ``mode`` (default the recipe's) by that mode's definition (:func:`mode_definition`;
    ``sets``: the ``--set`` items ``cfg`` was loaded with, which it leaves alone). Both
    changes go through the recipe's own checks (:func:`runtime.config.recipe.rebuild`):
    an unknown mode is the one-line error that ``reflow.mode`` in a recipe or ``--set``
    gets.

    The split is recomputed for the new size from ``resources.rollout_fraction``, except
    a ``--set resources.initial_ratio``: that one is the user's placement for this size
    (``reflow tune`` prints such lines) and is kept, or refused in one line if the
    resized groups cannot hold it; dropping it silently would simulate another placement.
    """
    user_ratio = (
        cfg.resources.initial_ratio if "resources.initial_ratio" in given_fields(sets) else None
    )
    changes = mode_definition(cfg, mode, sets)
    if changes:
        source = f"--mode {mode}" if mode is not None else f"reflow.mode {cfg.reflow.mode}"
        cfg = rebuild(cfg, changes, source=source)
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
        # the split of the new size, from rollout_fraction, unless the user gave one
        "resources.initial_ratio": user_ratio,
    }
    new = rebuild(cfg, resized, source=f"--gpus {gpus}")
    return SimPlan(new, name, kind)


@dataclass(frozen=True)
class Engines:
    """Where a simulation's engine models come from: a profile file's entries, or profiles
    built in code (rates fitted from a run folder, :mod:`runtime.sim.fit`), with the
    simulator's granularity for them. Fitted CPU runs use blocks of 1 token, the run's own
    heartbeat interval and its engines' sequence limit, as ``fit.simulate_fit`` does."""

    profiles: Profiles
    block: int = 16
    heartbeat_s: float = 30.0
    max_seqs: int | None = None  # per rollout replica; None: the recipe's engine.max_num_seqs

    @classmethod
    def from_file(cls, path: Path | str = DEFAULT_PROFILES) -> Engines:
        return cls(load_profiles(path))


def simulate(
    sim_plan: SimPlan,
    *,
    seed: int = 0,
    profiles_path: Path | str = DEFAULT_PROFILES,
    engines: Engines | None = None,
) -> SimResult:
    """One simulated run of ``sim_plan``, the engines from ``engines`` when given, else
    from the profile file ``profiles_path``. A recipe with ``model.lora`` runs with the
    profile's LoRA costs (:func:`runtime.sim.lora.lora_profile`)."""
    engines = engines or Engines.from_file(profiles_path)
    model = engines.profiles.model(sim_plan.model)
    result = SimCluster(
        sim_plan.cfg,
        lora_profile(model, sim_plan.cfg.model),
        engines.profiles.workload(sim_plan.workload),
        seed=seed,
        block=engines.block,
        heartbeat_s=engines.heartbeat_s,
        max_seqs=engines.max_seqs,
    ).run()
    result.weight_sync_bytes = sync_bytes(model, sim_plan.cfg.model)
    return result


def protocol_steps(
    workload: str | None,
    warmup_steps: int | None = None,
    measure_steps: int | None = None,
    sync_every: int = 1,
) -> tuple[int, int]:
    """(warm-up, measured) trainer steps: the ones given, else the workload's defaults,
    :data:`PROTOCOL`'s iterations of ``sync_every`` steps each."""
    warmup, measure = (n * sync_every for n in PROTOCOL.get(workload or "", DEFAULT_PROTOCOL))
    warmup = warmup if warmup_steps is None else warmup_steps
    measure = measure if measure_steps is None else measure_steps
    if warmup < 0:
        raise ProtocolError(f"--warmup-steps {warmup}: expected >= 0")
    if measure < 1:
        raise ProtocolError(f"--measure-steps {measure}: expected >= 1")
    return warmup, measure


def whole_syncs(steps: int, sync_every: int) -> int:
    """``steps`` rounded up to whole sync intervals."""
    return -(-steps // sync_every) * sync_every


def steps_needed(warmup: int, measure: int, sync_every: int) -> int:
    """The fewest steps a run needs for the protocol: warm-up and measured steps, each in
    whole sync intervals (a caller can refuse a short run before simulating it)."""
    return whole_syncs(warmup, sync_every) + whole_syncs(measure, sync_every)


def sync_interval(metrics: Sequence[dict[str, Any]]) -> int | None:
    """``train.sync_every`` as the metrics lines show it (a step's ``policy_version`` is
    step // sync_every): the first step that published a new version; None before one."""
    first = [int(m["step"]) for m in metrics if m.get("policy_version", 0) >= 1]
    return min(first, default=None)


def protocol_window(
    metrics: Sequence[dict[str, Any]],
    block: int,
    warmup: int,
    measure: int,
    sync_every: int = 1,
) -> dict[str, Any]:
    """Trainer throughput by the protocol: the trainer tokens of the ``measure`` steps after
    the first ``warmup`` over the seconds they took, i.e. the mean tokens per step over
    the mean step time. A step's time runs from the previous step's report to its own
    (the ``wall_s`` of the metrics lines; the first step's from the start of the run), so
    it holds whatever kept the trainer from the next batch: generation in a barrier mode,
    a weight sync, a role switch. A window sum, not a mean of per-step ratios, which
    would weigh a short step as much as a long one.

    Both counts are rounded up to whole sync intervals: ``colocated_sync`` generates a
    whole interval's batches before it trains the first, so a window that cuts an
    interval would hold its training steps without their generation (or the reverse),
    and every mode pays its weight sync once per interval. ``sync_every=1``: no rounding.
    """
    w, n = whole_syncs(warmup, sync_every), whole_syncs(measure, sync_every)
    lines = {int(m["step"]): m for m in metrics}
    last = w + n
    have = max(lines, default=0)
    if have < last:
        rounded = (
            f" ({warmup} and {measure} rounded up to whole syncs of {sync_every} steps)"
            if (w, n) != (warmup, measure)
            else ""
        )
        raise ProtocolError(
            f"train.steps: the run has {have} steps, the protocol needs warm-up {w} + "
            f"measured {n} = {last}{rounded}: more steps, or --warmup-steps/--measure-steps"
        )
    missing = [k for k in range(max(w, 1), last + 1) if k not in lines]
    if missing:
        raise ProtocolError(f"metrics: no line for steps {missing}")
    start = lines[w]["wall_s"] if w else 0.0
    span = lines[last]["wall_s"] - start
    if span <= 0:
        raise ProtocolError(f"metrics: steps {w + 1}..{last} took {span} s")
    tokens = sum(lines[k]["tokens"] for k in range(w + 1, last + 1)) * block
    fresh, basis = fresh_blocks([lines[k] for k in range(w + 1, last + 1)])

    def idle_s(k: int) -> float:
        return sum(lines[k]["trainer_idle_by_cause_s"].values()) if k else 0.0

    step_times = [
        lines[k]["wall_s"] - (lines[k - 1]["wall_s"] if k > 1 else 0.0)
        for k in range(w + 1, last + 1)
    ]
    return {
        "warmup_steps": w,
        "measure_steps": n,
        "sync_every": sync_every,
        "window_s": round(span, 3),
        "tokens_per_s": tokens / span,
        "fresh_tokens_per_s": fresh * block / span,
        "fresh_tokens_basis": basis,
        "tokens_per_step": tokens / n,
        "step_s_mean": span / n,
        "step_s_max": max(step_times),
        "steps_per_hour": n * 3600 / span,
        # the trainer's idle share of the same window (idle.py's cumulative causes)
        "trainer_idle_ratio": (idle_s(last) - idle_s(w)) / span,
    }


FRESH_EXACT = "metrics"  # each line's fresh_tokens: the fresh samples' own tokens
FRESH_SHARE = "sample_share"  # the step's tokens times its fresh share of samples


def fresh_blocks(lines: Sequence[dict[str, Any]]) -> tuple[float, str]:
    """Tokens (in blocks) of the samples these steps trained for the first time, and how
    they were counted. A line with ``fresh_tokens`` is exact. The metrics lines written
    today carry only the batch's ``tokens`` and its counts of fresh (``batch_unused``) and
    replayed (``batch_replay``) samples, so the fresh tokens are then the step's tokens
    times its fresh share of samples: exact when no sample was replayed (every baseline),
    an estimate under replay that assumes a replayed sample is as long as a fresh one on
    average (it was a fresh one a few versions earlier; with lengths growing over a run it
    is, if anything, shorter, and the estimate then counts too few fresh tokens)."""
    if lines and all("fresh_tokens" in m for m in lines):
        return float(sum(m["fresh_tokens"] for m in lines)), FRESH_EXACT
    total = 0.0
    for m in lines:
        samples = m["batch_unused"] + m["batch_replay"]
        total += m["tokens"] * m["batch_unused"] / samples if samples else 0.0
    return total, FRESH_SHARE


def figures(
    result: SimResult,
    gpus: int,
    *,
    workload: str | None = None,
    warmup_steps: int | None = None,
    measure_steps: int | None = None,
    sync_every: int | None = None,
) -> dict[str, Any]:
    """Throughput, idle ratios and the ideal-throughput bound of one simulated run.

    ``trainer_tokens_per_s`` is the protocol's (:func:`protocol_window`: warm-up steps
    left out, then the measured steps, both in whole sync intervals of ``sync_every``
    steps, by default read off the metrics lines; defaults per ``workload``,
    :data:`PROTOCOL`); ``fresh_tokens_per_s`` the same window's tokens of samples trained
    for the first time (:func:`fresh_blocks`; ``protocol.fresh_tokens_basis`` says how
    they were counted); ``whole_run_tokens_per_s`` all trained tokens over the whole
    simulated time, start-up included. A run with fewer steps than the protocol needs is
    a :class:`ProtocolError`.

    Bound (whole run): with r the tokens one rollout GPU generates per busy second, t the
    tokens one trainer GPU trains per busy second, and a the tokens trained per token
    generated (replay reuses samples, staleness evicts some), a split of G GPUs is
    balanced when rollout supply meets trainer demand, which gives
    X* = G·r·a·t / (r·a + t); ``efficiency`` is the whole-run throughput over it.
    """
    every = sync_every or sync_interval(result.metrics)
    if every is None:
        raise ProtocolError(
            f"train.steps: the run has {result.summary['steps']} steps and no weight sync: "
            "the protocol measures whole sync intervals (train.sync_every)"
        )
    warmup, measure = protocol_steps(workload, warmup_steps, measure_steps, every)
    window = protocol_window(result.metrics, result.block, warmup, measure, every)
    s = result.summary
    whole = result.trained_tokens / max(result.sim_s, 1e-9)
    r = result.rollout_tokens / max(result.rollout_gpu_busy_s, 1e-9)
    t = result.trained_tokens / max(result.trainer_gpu_busy_s, 1e-9)
    a = result.trained_tokens / max(result.rollout_tokens, 1e-9)
    bound = gpus * r * a * t / (r * a + t) if r > 0 and t > 0 else 0.0
    return {
        "mode": s["mode"],
        "steps": s["steps"],
        "sim_hours": round(result.sim_s / 3600, 3),
        "trainer_tokens_per_s": round(window["tokens_per_s"], 1),
        # the same window's tokens trained for the first time (replayed ones left out)
        "fresh_tokens_per_s": round(window["fresh_tokens_per_s"], 1),
        "whole_run_tokens_per_s": round(whole, 1),
        "protocol": {
            k: round(v, 4) if isinstance(v, float) else v
            for k, v in window.items()
            if k not in ("tokens_per_s", "fresh_tokens_per_s")
        },
        # from the first step to the end of the run (summary.json's)
        "trainer_idle_ratio": s["trainer_idle_ratio"],
        "rollout_idle_ratio": s["rollout_idle_ratio"],
        "bound_tokens_per_s": round(bound, 1),
        "efficiency": round(whole / bound, 4) if bound else None,
        "trainer_idle_by_cause": s.get("trainer_idle_by_cause", {}),
        # a lending run's: the trainer's groups generating (busy), and its lends
        "trainer_busy_by_cause": s.get("trainer_busy_by_cause", {}),
        "lends": s.get("lends"),
        "rollout_idle_by_cause": s.get("rollout_idle_by_cause", {}),
        # busy time by what the engine did (prefill), where the engines say
        "rollout_busy_by_cause": s.get("rollout_busy_by_cause", {}),
        "replay_share": round(
            sum(m["batch_replay"] for m in result.metrics)
            / max(sum(m["batch_unused"] + m["batch_replay"] for m in result.metrics), 1),
            4,
        ),
        "placements": [p[2] for p in result.placements],
        # the weight syncs the trainer leader paid, and what one takes and sends
        "weight_sync": {
            "syncs": result.weight_syncs,
            "s_each": round(result.weight_sync_s, 4),
            "bytes_each": result.weight_sync_bytes,
        },
        "lost": s["samples"]["lost"],
        "evicted": s["samples"]["evicted"],
        # in tokens (the simulator's samples count blocks of ``block`` tokens)
        "wasted_tokens": {k: v * result.block for k, v in s.get("wasted_tokens", {}).items()},
        "length_bias": {
            k: None if v is None else round(v * result.block, 1)
            for k, v in s.get("length_bias", {}).items()
        },
        "evals": eval_figures(result),
        "real_s": round(result.real_s, 2),
    }


def eval_figures(result: SimResult) -> dict[str, Any] | None:
    """What the held-out eval rounds cost a simulated run (None: it has none).

    ``share_of_rollout``: the rollout GPU-seconds of the rounds during training (the
    pinned replica's GPUs for each round's length: it takes no training work meanwhile,
    beyond finishing what it ran) over all rollout GPU-seconds up to the last step; None
    for colocated_sync's rounds (``shared``), which every engine plays inside a rollout
    phase that waits for them. The end's round runs after the last step, when nothing else
    is left to generate: it adds ``end_round_s`` of wall time to the run instead."""
    rounds = result.summary.get("eval_rounds") or []
    if not rounds:
        return None
    during = [r for r in rounds if r["when"] != "end"]
    end = [r for r in rounds if r["when"] == "end"]
    shared = all(r["rank"] is None for r in rounds)
    rollout_gpu_s = sum(m.get("rank_seconds", {}).get("rollout", 0.0) for m in result.metrics)
    eval_gpu_s = sum(r["seconds"] for r in during) * result.rollout_gpus_per_replica
    return {
        "rounds": len(rounds),
        "incomplete": sum(not r["complete"] for r in rounds),
        "episodes_per_round": result.eval_episodes_per_round,
        "shared": shared,
        "round_s_mean": round(sum(r["seconds"] for r in during) / len(during), 1)
        if during
        else None,
        "share_of_rollout": round(eval_gpu_s / rollout_gpu_s, 4)
        if rollout_gpu_s and not shared
        else None,
        "end_round_s": round(end[0]["seconds"], 1) if end else None,
    }
