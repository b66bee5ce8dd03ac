"""Routing replay (R3) in the trainer's forward: a mixture of experts' routers use the
experts the rollout policy chose (the sample's routes, runtime/data/routes.py) instead of
their own top-k, and still weigh them (softmax over the router's own logits, gathered at
the replayed experts, normalised as the model does), so the router keeps its gradient.

Installed on every top-k router of the model (transformers' ``Qwen3MoeTopKRouter``: a
``weight`` [experts, hidden], ``top_k``, ``norm_topk_prob``); a forward without routes set
is the model's own. The routes stay set from :meth:`RouteReplay.set` to
:meth:`RouteReplay.clear`, so a backward that recomputes a block (activation
checkpointing) routes as its forward did. Each replayed forward also counts how often the
router's own choice differs from the replayed one (``router_disagreement``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MethodType
from typing import Any

import torch
import torch.nn.functional as F

from runtime.data.routes import ExpertRoutes, route_positions
from runtime.data.sample import Sample


def top_k_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k routers, in layer order (none: a dense model)."""
    return [
        m
        for m in model.modules()
        if hasattr(m, "top_k") and hasattr(m, "norm_topk_prob") and hasattr(m, "weight")
    ]


def freeze_routers(model: torch.nn.Module) -> None:
    """``algorithm.freeze_router``: every top-k router's weight kept as loaded (no gradient,
    no optimizer state; the experts and the rest train)."""
    routers = top_k_routers(model)
    if not routers:
        raise ValueError(f"{type(model).__name__} has no top-k router to freeze")
    for router in routers:
        router.weight.requires_grad_(False)


class RouteReplay:
    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = top_k_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no top-k router to replay routes on")
        self.top_k = int(self.routers[0].top_k)
        self.experts = int(self.routers[0].weight.shape[0])
        self.given: torch.Tensor | None = None  # [tokens, layers, top_k], -1: the router's own
        self.differ = 0  # (position, layer) pairs whose own choice differed from the given
        self.compared = 0
        self.with_routes = 0  # rows set with routes, of ``rows`` set
        self.rows = 0
        # A step sets a sample's routes for each of its replaying forwards (the old
        # log-probs, the update's micro-batches; the own-routes comparison runs without
        # them): each is decoded once a step and kept to its end only (:meth:`step_done`).
        # A process-wide cache of a count of entries would hold ~50 MB each at a 30B-A3B
        # sample's length (16k positions x 48 layers x 8 experts, int64).
        self._decoded: dict[bytes, torch.Tensor] = {}
        for layer, router in enumerate(self.routers):
            router.forward = MethodType(_replaying_forward(self, layer), router)

    @property
    def shape(self) -> tuple[int, int, int]:
        """(MoE layers, top_k, experts): what a sample's routes must fit."""
        return len(self.routers), self.top_k, self.experts

    def set(self, rows: Sequence[Sample], width: int, device: torch.device) -> int:
        """The routes of ``rows`` for a forward over ``[len(rows), width]`` right-padded
        ids; the rows that have none route on their own. The rows with routes."""
        given = torch.full((max(len(rows), 1), width, *self.shape[:2]), -1, dtype=torch.long)
        with_routes = 0
        for i, s in enumerate(rows):
            if s.routes is None:
                continue
            ids = self._decoded.get(s.routes)
            if ids is None:
                ids = self._decoded[s.routes] = decoded(s.routes)
            n = route_positions(len(s.prompt_token_ids), len(s.token_ids))
            if ids.shape[1:] != self.shape[:2] or ids.shape[0] != n:
                raise ValueError(f"sample {s.sample_id}: routes do not fit the model or sample")
            given[i, :n] = ids
            with_routes += 1
        self.given = given.reshape(-1, *self.shape[:2]).to(device) if with_routes else None
        self.with_routes += with_routes
        self.rows += len(rows)
        return with_routes

    def clear(self) -> None:
        self.given = None

    def step_done(self) -> None:
        """The step's forwards are over: its decoded routes are let go."""
        self._decoded.clear()
        self.clear()

    def take_counts(self) -> tuple[int, int]:
        """(differing, compared) since the last call."""
        out = (self.differ, self.compared)
        self.differ = self.compared = 0
        return out

    def take_rows(self) -> tuple[int, int]:
        """(rows with routes, rows) set since the last call."""
        out = (self.with_routes, self.rows)
        self.with_routes = self.rows = 0
        return out


def decoded(routes: bytes) -> torch.Tensor:
    """``routes`` (runtime/data/routes.py bytes) as a ``[positions, layers, top_k]`` tensor."""
    return torch.from_numpy(ExpertRoutes.from_bytes(routes).array())


def _replaying_forward(replay: RouteReplay, layer: int) -> Any:
    def forward(router: torch.nn.Module, hidden_states: torch.Tensor):
        hidden = hidden_states.reshape(-1, router.weight.shape[1])
        logits = F.linear(hidden, router.weight)
        probs = torch.softmax(logits, dtype=torch.float, dim=-1)
        top_value, chosen = torch.topk(probs, router.top_k, dim=-1)
        given = replay.given
        if given is not None:
            if given.shape[0] != chosen.shape[0]:
                raise RuntimeError(
                    f"routes set for {given.shape[0]} positions, a forward of {chosen.shape[0]}"
                )
            mine = given[:, layer]
            has = mine[:, 0] >= 0
            with torch.no_grad():
                same = (mine.sort(-1).values == chosen.sort(-1).values).all(-1)
                replay.differ += int((has & ~same).sum())
                replay.compared += int(has.sum())
            chosen = torch.where(has[:, None], mine, chosen)
            top_value = probs.gather(-1, chosen)
        if router.norm_topk_prob:
            top_value = top_value / top_value.sum(dim=-1, keepdim=True)
        return logits, top_value.to(logits.dtype), chosen

    return forward


@torch.no_grad()
def routes_of(model: torch.nn.Module, prompt: Sequence[int], response: Sequence[int]) -> Any:
    """The routes ``model``'s own routers choose for the input positions of ``prompt`` +
    ``response`` (one forward), ``[positions, layers, top_k]`` as a numpy array: what the
    policy that generated the response routed, given its weights."""
    routers = top_k_routers(model)
    ids = torch.tensor([[*prompt, *response]])
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), output_router_logits=True)
    n = route_positions(len(prompt), len(response))
    k = int(routers[0].top_k)
    # per layer [positions, experts]: the same top-k as the router's (softmax keeps order)
    chosen = [torch.topk(logits.float(), k, dim=-1).indices[:n] for logits in out.router_logits]
    return torch.stack(chosen, dim=1).numpy()
