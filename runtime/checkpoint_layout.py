"""How a mixture of experts' weights are laid out: in the trainer's model, and in a
checkpoint and a weight sync.

transformers 5 holds a block's experts as two fused tensors (``mlp.experts.gate_up_proj``
[E, 2m, h], ``mlp.experts.down_proj`` [E, h, m]); the checkpoints on the hub and vLLM's
loader name each expert (``mlp.experts.<i>.{gate,up,down}_proj.weight``). Everything that
leaves the trainer as weights (a sync's buckets, a policy folder, an in-place load) is in
the hub's layout (:func:`to_hub`), and what comes back into a trainer's model in the
trainer's (:func:`to_fused`). Dense models pass as they are. The lowest layer: the embedded
models write their folders with it, the weight path sends with it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GATE_UP = "mlp.experts.gate_up_proj"
DOWN = "mlp.experts.down_proj"
_PER_EXPERT = re.compile(r"^(.*mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight$")


def is_fused_experts(name: str) -> bool:
    """A trainer tensor that holds every expert of a block."""
    return name.endswith(GATE_UP) or name.endswith(DOWN)


def hub_names(name: str, shape: tuple[int, ...]) -> Iterator[tuple[str, int, slice]]:
    """The hub's tensors a trainer tensor ``name`` of ``shape`` becomes: (name, expert
    index, the rows of that expert's matrix it takes); a dense tensor is itself
    (index -1)."""
    if name.endswith(GATE_UP):
        prefix, m = name.removesuffix("gate_up_proj"), shape[1] // 2
        for i in range(shape[0]):
            yield f"{prefix}{i}.gate_proj.weight", i, slice(0, m)
            yield f"{prefix}{i}.up_proj.weight", i, slice(m, 2 * m)
    elif name.endswith(DOWN):
        prefix = name.removesuffix("down_proj")
        for i in range(shape[0]):
            yield f"{prefix}{i}.down_proj.weight", i, slice(0, shape[1])
    else:
        yield name, -1, slice(None)


def to_hub(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A trainer state dict (tensors) in the hub's layout: each fused expert tensor split
    into per-expert views (no copy), the rest as it is, in the same order."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        for hub, i, rows in hub_names(name, tuple(tensor.shape)):
            out[hub] = tensor if i < 0 else tensor[i][rows]
    return out


def to_fused(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of :func:`to_hub`: per-expert tensors stacked into the trainer's fused
    ones (every expert of a block must be there, numbered 0..E-1)."""
    import torch

    parts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        m = _PER_EXPERT.match(name)
        if m is None:
            out[name] = tensor
            continue
        prefix, index, kind = m.group(1), int(m.group(2)), m.group(3)
        parts.setdefault(prefix, {}).setdefault(index, {})[kind] = tensor
    for prefix, experts in parts.items():
        if sorted(experts) != list(range(len(experts))):
            raise ValueError(f"{prefix}: experts {sorted(experts)} are not 0..{len(experts) - 1}")
        rows = [experts[i] for i in range(len(experts))]
        for i, e in enumerate(rows):
            for kind in ("gate", "up", "down"):
                if kind not in e:
                    raise ValueError(f"{prefix}{i}.{kind}_proj.weight is missing")
        out[prefix + "gate_up_proj"] = torch.stack([torch.cat([e["gate"], e["up"]]) for e in rows])
        out[prefix + "down_proj"] = torch.stack([e["down"] for e in rows])
    return out
