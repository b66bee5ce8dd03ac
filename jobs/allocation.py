"""What a launch would start: ranks per node and the initial role of every rank."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.config.layout import Layout, Role, parse_ratio
from runtime.config.schema import Config


@dataclass(frozen=True)
class RankPlan:
    rank: int
    node: int
    local_rank: int
    role: Role
    group: int


def initial_layout(cfg: Config) -> Layout:
    res = cfg.resources
    assert res.initial_ratio is not None
    rollout, trainer = parse_ratio(res.initial_ratio)
    return Layout.from_ratio(
        rollout,
        trainer,
        world_size=cfg.world_size,
        gpus_per_node=res.gpus_per_node,
        trainer_group_size=res.trainer_gpus_per_replica,
        rollout_group_size=res.rollout_gpus_per_replica,
    )


def plan_ranks(cfg: Config) -> list[RankPlan]:
    layout = initial_layout(cfg)
    per_node = cfg.resources.gpus_per_node
    return [
        RankPlan(r, r // per_node, r % per_node, layout.role_of(r), layout.group_index(r))
        for r in range(cfg.world_size)
    ]
