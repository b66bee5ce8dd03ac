"""Which rank plays which role: replica groups and the rollout:trainer split.

Ranks ``0 .. T-1`` form the trainer pool and ``T .. W-1`` the rollout pool, each cut into
contiguous replica groups (``trainer_gpus_per_replica`` resp. ``rollout_gpus_per_replica``
ranks). Moving the boundary ``T`` by whole groups is a rebalance; keeping both pools
contiguous means a rebalance moves only the ranks between the old and new boundary, and a
rollout replica never straddles a node (its size divides ``gpus_per_node`` and every
boundary is a multiple of it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.config.schema import Config


class Role(str, Enum):
    ROLLOUT = "rollout"
    TRAINER = "trainer"


class LayoutError(ValueError):
    """A split that the replica-group sizes or the world size do not allow."""


# ranks of one pool: ASCII digits, at most 6 (str.isdigit takes "²" and full-width
# digits, and int() took a 23-digit count that no message could carry)
_RANKS = re.compile(r"[0-9]{1,6}", re.ASCII)


def parse_ratio(text: str) -> tuple[int, int]:
    """``"24:8"`` -> ``(24, 8)`` (rollout ranks, trainer ranks)."""
    parts = str(text).split(":")
    if len(parts) != 2 or not all(_RANKS.fullmatch(p.strip(" ")) for p in parts):
        shown = repr(text) if len(str(text)) <= 40 else repr(str(text)[:40]) + "..."
        raise LayoutError(
            f"{shown} is not of the form ROLLOUT:TRAINER in ASCII digits (at most 6 each), "
            "e.g. 24:8"
        )
    return int(parts[0]), int(parts[1])


@dataclass(frozen=True)
class Layout:
    world_size: int
    gpus_per_node: int
    trainer_group_size: int
    rollout_group_size: int
    n_trainer_ranks: int

    @classmethod
    def from_ratio(
        cls,
        rollout: int,
        trainer: int,
        *,
        world_size: int,
        gpus_per_node: int,
        trainer_group_size: int,
        rollout_group_size: int,
    ) -> Layout:
        check_split(
            rollout,
            trainer,
            world_size=world_size,
            trainer_group_size=trainer_group_size,
            rollout_group_size=rollout_group_size,
        )
        return cls(world_size, gpus_per_node, trainer_group_size, rollout_group_size, trainer)

    def with_ratio(self, rollout: int, trainer: int) -> Layout:
        return Layout.from_ratio(
            rollout,
            trainer,
            world_size=self.world_size,
            gpus_per_node=self.gpus_per_node,
            trainer_group_size=self.trainer_group_size,
            rollout_group_size=self.rollout_group_size,
        )

    def all_playing(self, role: Role) -> Layout:
        """A colocated phase: every rank plays ``role`` (mode ``colocated_sync`` alternates
        the two; no split check: both pools cover the whole world in turn)."""
        n_trainer = self.world_size if role is Role.TRAINER else 0
        return Layout(
            self.world_size,
            self.gpus_per_node,
            self.trainer_group_size,
            self.rollout_group_size,
            n_trainer,
        )

    @property
    def n_rollout_ranks(self) -> int:
        return self.world_size - self.n_trainer_ranks

    @property
    def ratio(self) -> str:
        return f"{self.n_rollout_ranks}:{self.n_trainer_ranks}"

    def role_of(self, rank: int) -> Role:
        if not 0 <= rank < self.world_size:
            raise LayoutError(f"rank {rank} is outside 0..{self.world_size - 1}")
        return Role.TRAINER if rank < self.n_trainer_ranks else Role.ROLLOUT

    def roles(self) -> list[Role]:
        return [self.role_of(r) for r in range(self.world_size)]

    def ranks(self, role: Role) -> list[int]:
        """The ranks with ``role``, in rank order."""
        return ranks_with([r.value for r in self.roles()], role.value)

    def groups(self, role: Role) -> list[tuple[int, ...]]:
        """Replica groups of one role, each a tuple of consecutive ranks."""
        if role is Role.TRAINER:
            start, stop, size = 0, self.n_trainer_ranks, self.trainer_group_size
        else:
            start, stop, size = self.n_trainer_ranks, self.world_size, self.rollout_group_size
        return [tuple(range(s, s + size)) for s in range(start, stop, size)]

    def group_index(self, rank: int) -> int:
        role = self.role_of(rank)
        for i, group in enumerate(self.groups(role)):
            if rank in group:
                return i
        raise LayoutError(f"rank {rank} is in no group")  # unreachable for a valid layout

    def moved_ranks(self, other: Layout) -> list[int]:
        """Ranks whose role differs between two layouts of the same world."""
        return [r for r in range(self.world_size) if self.role_of(r) != other.role_of(r)]


def check_split(
    rollout: int,
    trainer: int,
    *,
    world_size: int,
    trainer_group_size: int,
    rollout_group_size: int,
) -> None:
    """Raise :class:`LayoutError` with a one-line reason when ``rollout:trainer`` is infeasible."""
    if rollout + trainer != world_size:
        raise LayoutError(f"{rollout}:{trainer} adds up to {rollout + trainer}, not {world_size}")
    if trainer < trainer_group_size:
        raise LayoutError(
            f"{rollout}:{trainer} leaves fewer than one trainer replica "
            f"({trainer_group_size} ranks)"
        )
    if rollout < rollout_group_size:
        raise LayoutError(
            f"{rollout}:{trainer} leaves fewer than one rollout replica "
            f"({rollout_group_size} ranks)"
        )
    if trainer % trainer_group_size:
        raise LayoutError(
            f"{rollout}:{trainer}: trainer ranks must be a multiple of {trainer_group_size}"
        )
    if rollout % rollout_group_size or trainer % rollout_group_size:
        raise LayoutError(
            f"{rollout}:{trainer}: both sides must be multiples of the rollout replica "
            f"size {rollout_group_size} so replicas stay within a node"
        )


def default_split(
    world_size: int,
    trainer_group_size: int,
    rollout_group_size: int,
    rollout_fraction: float = 0.5,
) -> tuple[int, int]:
    """The feasible split whose rollout share is closest to ``rollout_fraction``."""
    best: tuple[int, int] | None = None
    for trainer in range(world_size + 1):
        try:
            check_split(
                world_size - trainer,
                trainer,
                world_size=world_size,
                trainer_group_size=trainer_group_size,
                rollout_group_size=rollout_group_size,
            )
        except LayoutError:
            continue
        target = rollout_fraction * world_size
        if best is None or abs(world_size - trainer - target) < abs(best[0] - target):
            best = (world_size - trainer, trainer)
    if best is None:
        raise LayoutError(
            f"no split of {world_size} ranks into trainer groups of {trainer_group_size} "
            f"and rollout groups of {rollout_group_size}"
        )
    return best


def ranks_with(roles: Sequence[str], role: str) -> list[int]:
    """Indices of ``roles`` (one role name per rank) that equal ``role``."""
    return [r for r, x in enumerate(roles) if x == role]


def is_rollout_driver(rank: int, rollout_group_size: int) -> bool:
    """Whether ``rank`` drives its rollout replica's engine when it plays rollout: the
    first rank of the group. Every pool boundary is a multiple of the group size, so a
    rank's place in its rollout group never changes (the others are the engine's
    tensor-parallel workers and talk to nobody)."""
    return rank % rollout_group_size == 0


def rollout_drivers(roles: Sequence[str], rollout_group_size: int) -> list[int]:
    """The rollout ranks that drive an engine: one per rollout replica."""
    return [r for r in ranks_with(roles, "rollout") if is_rollout_driver(r, rollout_group_size)]


@dataclass(frozen=True)
class LayoutChange:
    """A role switch as every rank sees it: the roles before and after, in rank order."""

    epoch: int
    before: tuple[str, ...]
    after: tuple[str, ...]

    def ranks(self, role: str, *, after: bool = True) -> list[int]:
        return ranks_with(self.after if after else self.before, role)

    def joined(self, role: str) -> list[int]:
        """Ranks that have ``role`` now and did not before."""
        return [r for r in self.ranks(role) if self.before[r] != role]


def initial_layout(cfg: Config) -> Layout:
    """The layout a run starts with: ``resources.initial_ratio`` over the run's ranks; in
    mode ``colocated_sync``, every rank generating (the first phase)."""
    res = cfg.resources
    assert res.initial_ratio is not None
    if cfg.reflow.policy.colocated:  # no split: every rank generates first
        return Layout(
            cfg.world_size,
            res.gpus_per_node,
            res.trainer_gpus_per_replica,
            res.rollout_gpus_per_replica,
            0,
        )
    rollout, trainer = parse_ratio(res.initial_ratio)
    layout = Layout.from_ratio(
        rollout,
        trainer,
        world_size=cfg.world_size,
        gpus_per_node=res.gpus_per_node,
        trainer_group_size=res.trainer_gpus_per_replica,
        rollout_group_size=res.rollout_gpus_per_replica,
    )
    return layout


def group_roles(cfg: Config, roles: Sequence[str]) -> list[str]:
    """The roles the process groups are built from. Colocated ranks all belong to the one
    trainer group for the whole run (each keeps its shards across the rollout phase) and
    load their own engines in place, so their groups never change with the phase."""
    if cfg.reflow.policy.colocated:
        return [Role.TRAINER.value] * len(roles)
    return list(roles)
