"""The two sides of a hybrid worker and the registry they are chosen from.

A :class:`HybridWorker` holds one object per role; exactly one is active. ``activate``
wakes a side (engine wake-up, weights onto the device), ``deactivate`` puts it to sleep
(KV cache freed, weights and optimizer offloaded). ``step`` does a bounded slice of work
and returns quickly so the worker can keep heartbeating and hear commands.

Sides are looked up by the names in the recipe's ``engine`` section through
:mod:`runtime.engines`.
"""

from __future__ import annotations

import time
from typing import Protocol


class RoleSide(Protocol):
    name: str

    def activate(self) -> None: ...

    def deactivate(self) -> None: ...

    def step(self) -> None: ...

    @property
    def state(self) -> str: ...


class PlaceholderSide:
    """A side with no engine: activation/deactivation are recorded, work is nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.active = False
        self.activations = 0
        self.activated_at: float | None = None

    def activate(self) -> None:
        self.active = True
        self.activations += 1
        self.activated_at = time.monotonic()

    def deactivate(self) -> None:
        self.active = False

    def step(self) -> None:
        time.sleep(0)  # nothing to do; the worker's poll timeout paces the loop

    @property
    def state(self) -> str:
        return "idle"


def placeholder_rollout(cfg: object, rank: int) -> PlaceholderSide:
    return PlaceholderSide("rollout")


def placeholder_trainer(cfg: object, rank: int) -> PlaceholderSide:
    return PlaceholderSide("trainer")
