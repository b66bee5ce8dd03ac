"""The simulator's parameters: hardware/model rates and workload models, from one YAML file
(``runtime/sim/profiles.yaml`` by default) so users can refit them."""

from __future__ import annotations

import math
import random
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from runtime.data.lengths import ResponseLengths, drifting

DEFAULT_PROFILES = Path(__file__).with_name("profiles.yaml")


class ProfileError(ValueError):
    """A profile file or entry that cannot be used; the message names it."""


@dataclass(frozen=True)
class ModelProfile:
    name: str
    params_b: float
    kv_bytes_per_token: int
    rollout_gpus_per_replica: int
    trainer_gpus_per_replica: int
    step_base_s: float
    step_per_seq_s: float
    prefill_tok_s: float
    kv_tokens: int
    train_tok_s: float
    weight_sync_s: float
    # The part of weight_sync_s that does not grow with the bytes sent (setup, the
    # engine's load call): what a LoRA run's adapter sync keeps (runtime/sim/lora.py);
    # None: all of it scales with the bytes.
    weight_sync_fixed_s: float | None = None
    # One role switch of a rank, whatever its direction; None: the switch is the sum of
    # its phases (switch_phases, below), which then need the parts further down.
    switch_s: float | None = None
    # mode colocated_sync: the in-place weight sync of a colocated engine (trainer shards
    # gathered into the engine on the same GPUs) and one engine wake from sleep; None: the
    # profile cannot simulate that mode (a computed role switch needs wake_s too)
    colocated_sync_s: float | None = None
    wake_s: float | None = None
    # Decode: a running sequence also costs this per token of its context (its KV read
    # each step), on top of step_per_seq_s; 0 = a per-sequence cost fixed at one context.
    step_per_ctx_token_s: float = 0.0
    # Tensor parallelism: the all-reduces of one decode step (two per layer) add a fixed
    # part and a part per running sequence (its activations); 0 for TP 1.
    tp_step_s: float = 0.0
    tp_per_seq_s: float = 0.0
    # The trainer's old-policy log-prob pass (a forward over the batch), as a fraction of
    # the update's time; paid only when algorithm.recompute_old_logprobs is on.
    logprob_fraction: float = 0.0
    # Role-switch parts (used when switch_s is None): the trainer state's bytes per
    # parameter, host <-> GPU copies at offload_gb_s per GPU, the state a new trainer rank
    # receives from the current ones at state_transfer_gb_s, and the regroup's seconds.
    trainer_state_bytes_per_param: float | None = None
    offload_gb_s: float | None = None
    state_transfer_gb_s: float | None = None
    regroup_s: float | None = None

    def __post_init__(self) -> None:
        if self.switch_s is not None:
            return
        parts = ("trainer_state_bytes_per_param", "offload_gb_s", "state_transfer_gb_s")
        missing = [n for n in (*parts, "regroup_s", "wake_s") if getattr(self, n) is None]
        zero = [n for n in parts if getattr(self, n) == 0]
        if missing or zero:
            raise ProfileError(
                f"{self.name}: without switch_s a role switch is computed from its parts: "
                f"missing {missing}, zero {zero}"
            )

    def switch_phases(self, before: str, after: str) -> dict[str, float]:
        """Seconds of each phase (runtime/transport/protocol.py SWITCH_PHASES, the ones
        runtime/rank/worker.py ``_switch`` times) of one rank changing role ``before`` ->
        ``after`` in a new layout; a disaggregated layout change, not colocated phases.

        To rollout: the trainer state goes to the host (a sharded trainer's rank frees
        its shards instead, no copy: runtime/engines/torch/trainer.py ``drop``), the
        engine wakes from sleep, and it loads the leader's weights (a weight sync). To the
        trainer: the engine sleeps (its weights to the host), the trainer state comes back
        to the GPU and is overwritten by the current one from the trainer ranks. Every
        rank regroups."""
        if self.switch_s is not None:
            raise ProfileError(f"{self.name}: switch_s is given; there are no phases")
        assert self.offload_gb_s and self.state_transfer_gb_s  # __post_init__
        params = self.params_b * 1e9
        state_gb = params * (self.trainer_state_bytes_per_param or 0.0) / 1e9
        state_gb /= self.trainer_gpus_per_replica  # FSDP: each rank holds its shard
        weights_gb = 2 * params / self.rollout_gpus_per_replica / 1e9  # bf16, TP shard
        phases = {"regroup": self.regroup_s or 0.0}
        if before == after:
            return phases
        if after == "rollout":
            sharded = self.trainer_gpus_per_replica > 1
            phases["offload"] = 0.0 if sharded else state_gb / self.offload_gb_s
            phases["wake"] = self.wake_s or 0.0
            phases["weight_load"] = self.weight_sync_s
        else:
            phases["offload"] = weights_gb / self.offload_gb_s
            phases["wake"] = state_gb / self.offload_gb_s
            phases["state_transfer"] = state_gb / self.state_transfer_gb_s
        return phases

    def lend_phases(self, before: str, after: str) -> dict[str, float]:
        """Seconds of each phase of one rank's part in a lend (``after`` rollout) or its
        reclaim (``after`` trainer): runtime/control/lends.py. The lent rank's trainer
        state is the current one and stays its own: to rollout it goes to pinned host
        memory (its shard, for a sharded trainer: the KV cache needs the room), the engine
        wakes and loads the trainer's weights in place (the colocated sync's figure where
        the profile has one, else a weight sync); back, the engine sleeps and the state
        returns, with nothing to receive from other ranks. No rank regroups: a lend moves no
        process group (runtime/rank/worker.py ``lend_switch``; before 2026-12-06 this
        model charged a regroup each way, 2 s of the round trip the gate weighs)."""
        if self.switch_s is not None:
            return {} if before == after else {"weight_load": self.switch_s}
        assert self.offload_gb_s  # __post_init__
        params = self.params_b * 1e9
        state_gb = params * (self.trainer_state_bytes_per_param or 0.0) / 1e9
        state_gb /= self.trainer_gpus_per_replica
        weights_gb = 2 * params / self.rollout_gpus_per_replica / 1e9
        phases: dict[str, float] = {}
        if before == after:
            return phases
        if after == "rollout":
            phases["offload"] = state_gb / self.offload_gb_s
            phases["wake"] = self.wake_s or 0.0
            phases["weight_load"] = self.colocated_sync_s or self.weight_sync_s
        else:
            phases["offload"] = weights_gb / self.offload_gb_s
            phases["wake"] = state_gb / self.offload_gb_s
        return phases

    def lend_estimate_s(self) -> float:
        """The longer direction of a lend, before a run has measured its own."""
        return max(
            sum(self.lend_phases("trainer", "rollout").values()),
            sum(self.lend_phases("rollout", "trainer").values()),
        )


@dataclass(frozen=True)
class WorkloadProfile:
    name: str
    prompt_tokens: int
    median_start: float
    median_end: float
    sigma: float
    max_tokens: int
    # The most turns an episode has (tool calls + 1); every episode has this many unless
    # tool_calls_mean says how many calls it makes on average.
    turns: int
    tool_s_median: float
    reward_start: float
    reward_end: float
    # Optional (a profile may leave them out): tool calls per episode are drawn as
    # ``tool_calls_min + Binomial(turns - 1 - tool_calls_min, p)`` with the mean
    # ``tool_calls_mean``; both None = every episode makes ``turns - 1`` calls.
    tool_calls_min: int | None = None
    tool_calls_mean: float | None = None
    # A tool call's seconds are log-normal around tool_s_median with this spread, cut at
    # tool_timeout_s (the sandbox's timeout; None = no timeout).
    tool_s_sigma: float = 0.5
    tool_timeout_s: float | None = None
    # Tokens a tool call's output adds to the context (prefilled with the next turn, not
    # decoded), taken out of the response length drawn; 0 = decoded like the model's own.
    tool_output_tokens: int = 0

    def __post_init__(self) -> None:
        if self.turns < 1:
            raise ProfileError(f"{self.name}.turns: expected >= 1, got {self.turns}")
        most = self.turns - 1
        fewest, mean = self.fewest_calls, self.mean_calls
        if not 0 <= fewest <= most:
            raise ProfileError(
                f"{self.name}.tool_calls_min: expected 0..turns - 1 = {most}, got {fewest}"
            )
        if not fewest <= mean <= most:
            raise ProfileError(
                f"{self.name}.tool_calls_mean: expected tool_calls_min..turns - 1 = "
                f"{fewest}..{most}, got {mean}"
            )
        if self.tool_timeout_s is not None and self.tool_timeout_s <= 0:
            raise ProfileError(
                f"{self.name}.tool_timeout_s: expected a number > 0, got {self.tool_timeout_s}"
            )

    @property
    def fewest_calls(self) -> int:
        if self.tool_calls_min is not None:
            return self.tool_calls_min
        # with only the mean given, an episode may make no call at all
        return self.turns - 1 if self.tool_calls_mean is None else 0

    @property
    def mean_calls(self) -> float:
        return self.turns - 1 if self.tool_calls_mean is None else self.tool_calls_mean

    @property
    def lengths(self) -> ResponseLengths:
        """Response lengths (runtime/data/lengths.py): log-normal, the median moving from
        ``median_start`` to ``median_end`` over the run's progress 0 -> 1."""
        return drifting(self.median_start, self.median_end, self.sigma, self.max_tokens)

    def reward_p(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        return self.reward_start + (self.reward_end - self.reward_start) * p

    def episode_turns(self, rng: random.Random) -> int:
        """Turns of one episode: its tool calls + 1. A workload whose episodes all make the
        same number of calls draws nothing (its random stream is what it was before calls
        were drawn)."""
        fewest = self.fewest_calls
        spread = self.turns - 1 - fewest
        if spread == 0:
            return self.turns
        p = (self.mean_calls - fewest) / spread
        return 1 + fewest + sum(rng.random() < p for _ in range(spread))

    def tool_s(self, rng: random.Random) -> float:
        """Seconds of one tool call (a sandboxed code run)."""
        if self.tool_s_median <= 0:
            return 0.0
        seconds = rng.lognormvariate(math.log(self.tool_s_median), self.tool_s_sigma)
        if self.tool_timeout_s is not None:
            seconds = min(seconds, self.tool_timeout_s)  # the sandbox kills it then
        return seconds


def _build(cls: type, name: str, raw: Any, source: Path) -> Any:
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: {name} is not a mapping")
    given = [f for f in fields(cls) if f.name != "name"]
    required = [f.name for f in given if f.default is MISSING]
    missing = [n for n in required if n not in raw]
    extra = sorted(set(raw) - {f.name for f in given})
    if missing or extra:
        raise ProfileError(f"{source}: {name}: missing {missing}, unknown {extra}")
    values = {}
    for f in given:
        if f.name not in raw:
            continue  # optional: its default
        value = raw[f.name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ProfileError(f"{source}: {name}.{f.name}: expected a number >= 0, got {value!r}")
        values[f.name] = int(value) if str(f.type).startswith("int") else float(value)
    try:
        return cls(name=name, **values)
    except ProfileError as exc:
        raise ProfileError(f"{source}: {exc}") from None


@dataclass(frozen=True)
class Profiles:
    models: dict[str, ModelProfile]
    workloads: dict[str, WorkloadProfile]
    source: Path

    def model(self, name: str) -> ModelProfile:
        if name not in self.models:
            raise ProfileError(f"{self.source}: no model {name!r} (have {sorted(self.models)})")
        return self.models[name]

    def workload(self, name: str) -> WorkloadProfile:
        if name not in self.workloads:
            raise ProfileError(
                f"{self.source}: no workload {name!r} (have {sorted(self.workloads)})"
            )
        return self.workloads[name]


def load_profiles(path: Path | str = DEFAULT_PROFILES) -> Profiles:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not YAML ({exc})") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("models"), dict):
        raise ProfileError(f"{path}: expected a mapping with 'models' and 'workloads'")
    models = {n: _build(ModelProfile, n, v, path) for n, v in raw["models"].items()}
    workloads = {n: _build(WorkloadProfile, n, v, path) for n, v in raw["workloads"].items()}
    return Profiles(models, workloads, path)
