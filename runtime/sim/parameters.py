"""The simulator's parameters: hardware/model rates and workload models, from one YAML file
(``runtime/sim/profiles.yaml`` by default) so users can refit them."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
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
    switch_s: float


@dataclass(frozen=True)
class WorkloadProfile:
    name: str
    prompt_tokens: int
    median_start: float
    median_end: float
    sigma: float
    max_tokens: int
    turns: int
    tool_s_median: float
    reward_start: float
    reward_end: float

    @property
    def lengths(self) -> ResponseLengths:
        """Response lengths (runtime/data/lengths.py): log-normal, the median moving from
        ``median_start`` to ``median_end`` over the run's progress 0 -> 1."""
        return drifting(self.median_start, self.median_end, self.sigma, self.max_tokens)

    def reward_p(self, progress: float) -> float:
        p = min(max(progress, 0.0), 1.0)
        return self.reward_start + (self.reward_end - self.reward_start) * p

    def tool_s(self, rng: random.Random) -> float:
        if self.tool_s_median <= 0:
            return 0.0
        return rng.lognormvariate(math.log(self.tool_s_median), 0.5)


def _build(cls: type, name: str, raw: Any, source: Path) -> Any:
    if not isinstance(raw, dict):
        raise ProfileError(f"{source}: {name} is not a mapping")
    names = [f.name for f in fields(cls) if f.name != "name"]
    missing = [n for n in names if n not in raw]
    extra = sorted(set(raw) - set(names))
    if missing or extra:
        raise ProfileError(f"{source}: {name}: missing {missing}, unknown {extra}")
    values = {}
    for f in fields(cls):
        if f.name == "name":
            continue
        value = raw[f.name]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ProfileError(f"{source}: {name}.{f.name}: expected a number >= 0, got {value!r}")
        values[f.name] = int(value) if f.type == "int" else float(value)
    return cls(name=name, **values)


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
