"""Pluggable batch samplers and replay filters, chosen by name or dotted path.

A user sampler is any class with this signature, constructed without arguments::

    class MySampler:
        def accept_group(self, group: Sequence[Sample]) -> bool:
            '''Called once when a group completes; False evicts it ("sampler_rejected").'''
        def select(self, pool: Sequence[Sample], k: int, rng: random.Random
                   ) -> list[Sample]:
            '''Up to k distinct members of pool (unused or replay samples).'''

and a replay filter::

    class MyFilter:
        def keep(self, sample: Sample) -> bool:
            '''After training on it: True puts the sample back as a replay sample.'''

Recipes name them as ``reflow.sampler: mypkg.mymod:MySampler`` (or ``mypkg.mymod.MySampler``).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Sequence
from typing import Protocol

from runtime.data.sample import Sample


class BatchSampler(Protocol):
    def accept_group(self, group: Sequence[Sample]) -> bool: ...

    def select(self, pool: Sequence[Sample], k: int, rng: random.Random) -> list[Sample]: ...


class ReplayFilter(Protocol):
    def keep(self, sample: Sample) -> bool: ...


class RandomSampler:
    """Uniform over the pool; every completed group is accepted."""

    def accept_group(self, group: Sequence[Sample]) -> bool:
        return True

    def select(self, pool: Sequence[Sample], k: int, rng: random.Random) -> list[Sample]:
        if k >= len(pool):
            return list(pool)
        return rng.sample(pool, k)


class MediumRewardSampler(RandomSampler):
    """Only groups whose mean reward is strictly between 0 and 1 (they carry a gradient
    signal under group-normalised advantages); the others are evicted on completion."""

    def accept_group(self, group: Sequence[Sample]) -> bool:
        mean = sum(t.reward for t in group) / len(group)
        return 0.0 < mean < 1.0


class AcceptAll:
    def keep(self, sample: Sample) -> bool:
        return True


SAMPLERS: dict[str, type] = {"random": RandomSampler, "medium_reward": MediumRewardSampler}
REPLAY_FILTERS: dict[str, type] = {"accept_all": AcceptAll}


class PluginError(ValueError):
    """A sampler or filter name that does not resolve to a usable class."""


def resolve(name: str, registry: dict[str, type], required: tuple[str, ...]) -> type:
    """A registered class by name, or a user class by ``module:Class`` / ``module.Class``."""
    if name in registry:
        return registry[name]
    module, sep, attr = name.partition(":")
    if not sep:
        module, _, attr = name.rpartition(".")
    if not module or not attr:
        raise PluginError(f"{name!r} is not one of {', '.join(registry)} nor a dotted path")
    try:
        cls = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise PluginError(f"{name!r} cannot be imported ({exc})") from None
    missing = [m for m in required if not callable(getattr(cls, m, None))]
    if missing:
        raise PluginError(f"{name!r} lacks method(s) {', '.join(missing)}")
    return cls


def make_sampler(name: str) -> BatchSampler:
    return resolve(name, SAMPLERS, ("accept_group", "select"))()


def make_replay_filter(name: str) -> ReplayFilter:
    return resolve(name, REPLAY_FILTERS, ("keep",))()
