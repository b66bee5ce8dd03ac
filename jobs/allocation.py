"""What a launch would start: ranks per node and the initial role of every rank."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.layout import Role, initial_layout
from runtime.config.schema import Config


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node: int
    local_rank: int
    role: Role
    group: int


def plan_ranks(cfg: Config) -> list[RankPlan]:
    layout = initial_layout(cfg)
    per_node = cfg.resources.gpus_per_node
    return [
        RankPlan(r, r // per_node, r % per_node, layout.role_of(r), layout.group_index(r))
        for r in range(cfg.world_size)
    ]
