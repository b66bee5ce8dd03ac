"""The layout's messages: a role switch, a lend and its reclaim, and a rank's report of
taking one up; part of the control-plane protocol (:mod:`runtime.transport.protocol`
hands them on: a caller needs that module only)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from runtime.config.layout import Role
from runtime.transport.envelope import Message, _require, message

ROLES = tuple(r.value for r in Role)
GONE_ROLE = "gone"  # a rank lost to the run (dead or hung), in no process group
LAYOUT_ROLES = (*ROLES, GONE_ROLE)  # what a layout's roles may say of each rank

# The parts of a role switch a rank times (runtime/rank/worker.py): the side it leaves
# offloaded (trainer state to host, vLLM asleep), the side it takes woken, the process
# groups rebuilt, trainer state moved to new replicas, rollout weights received and loaded.
SWITCH_PHASES = ("offload", "wake", "regroup", "state_transfer", "weight_load")


# --- coordinator -> workers ----------------------------------------------------------


@message
@dataclass(frozen=True)
class RoleSwitch(Message):
    """Broadcast: the new role of every rank, in rank order, for ``layout_epoch``."""

    TYPE: ClassVar[str] = "role_switch"
    layout_epoch: int
    roles: list[str]

    def check(self) -> None:
        _require(all(r in LAYOUT_ROLES for r in self.roles), "unknown role")


@message
@dataclass(frozen=True)
class Lend(Message):
    """Broadcast: the trainer's ranks generate while it waits (``lent``: every live rank a
    rollout rank), or go back to training (the roles of the layout before the lend), at
    ``layout_epoch`` (runtime/control/lends.py). Unlike a :class:`RoleSwitch` no process
    group changes and no state moves: a lent rank's engine loads the published policy
    from its own trainer, whose state waits on the rank."""

    TYPE: ClassVar[str] = "lend"
    layout_epoch: int
    roles: list[str]
    lent: bool

    def check(self) -> None:
        _require(all(r in LAYOUT_ROLES for r in self.roles), "unknown role")
        if self.lent:
            _require(all(r != "trainer" for r in self.roles), "a lend leaves no trainer rank")
        else:
            _require("trainer" in self.roles, "a reclaim gives the trainer its ranks back")


# --- worker -> coordinator ------------------------------------------------------------


@message
@dataclass(frozen=True)
class RoleSwitchDone(Message):
    """The rank took up layout ``layout_epoch`` in ``duration_s``, of which ``phases``
    (:data:`SWITCH_PHASES`, seconds; a phase the rank had no part in is left out)."""

    TYPE: ClassVar[str] = "role_switch_done"
    rank: int
    role: str
    layout_epoch: int
    duration_s: float
    phases: dict[str, float] = field(default_factory=dict)

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")
        _require(
            isinstance(self.duration_s, (int, float))
            and math.isfinite(self.duration_s)
            and self.duration_s >= 0,
            "duration must be a finite non-negative number",
        )
        _require(set(self.phases) <= set(SWITCH_PHASES), "unknown switch phase")
        _require(
            all(
                isinstance(t, (int, float)) and math.isfinite(t) and t >= 0
                for t in self.phases.values()
            ),
            "switch phases must be finite non-negative seconds",
        )
        # phases are disjoint parts of the switch (a float's rounding aside)
        slack = 1e-3 + 1e-6 * self.duration_s
        _require(sum(self.phases.values()) <= self.duration_s + slack, "phases exceed the switch")
