"""Which samples each trainer rank trains on, and in which micro-batches (pure logic).

An optimizer update's samples are spread over the ``ranks`` data-parallel trainer ranks
and, on each rank, packed into micro-batches whose *padded* size (samples x the longest
one, since rows are right-padded) stays under ``train.micro_batch_tokens``:

1. **Ranks**, longest sample first, each to the rank with the fewest tokens so far (LPT
   scheduling): every rank gets about the same token load, so no rank waits on another
   that drew the long samples.
2. **Micro-batches** on each rank, longest first: a sample joins the open micro-batch if
   the padded size stays under the budget, else it opens the next one. Sorting first
   keeps samples of similar length together, so little of a micro-batch is padding. A
   sample longer than the budget gets a micro-batch of its own.
3. **Equal counts**: under FSDP2 every micro-step is collective (each forward gathers
   the parameters of the shard group, each backward reduces gradients), so every rank
   must take the same number. A rank with fewer splits its largest micro-batch in two
   until it has as many; a rank with fewer samples than that gets empty micro-batches
   (it runs a forward and backward that contributes nothing, and the others do not wait).

The plan depends only on the samples' lengths. Rank 0 makes it (:func:`rank_plans`) and
sends each trainer rank its part: the samples it trains, its micro-batches, and what the
loss's normalisers need of the whole update (every sample's valid tokens and replay flag),
so no trainer rank plans again or sees another rank's samples.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.data.sample import Sample

# rank -> its micro-batches -> indices into the update's samples
Plan = list[list[list[int]]]


def padded_tokens(lengths: Sequence[int], batch: Sequence[int]) -> int:
    """Tokens of one right-padded micro-batch: its rows times its longest row."""
    return len(batch) * max((lengths[i] for i in batch), default=0)


def assign_ranks(lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """Indices per rank, balanced by token load (longest first to the lightest rank)."""
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, not {ranks}")
    heap = [(0, r) for r in range(ranks)]
    out: list[list[int]] = [[] for _ in range(ranks)]
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        load, r = heapq.heappop(heap)
        out[r].append(i)
        heapq.heappush(heap, (load + lengths[i], r))
    return out


def pack(lengths: Sequence[int], indices: Sequence[int], budget: int | None) -> list[list[int]]:
    """``indices`` in micro-batches of at most ``budget`` padded tokens (one if None)."""
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    if budget is None:
        return [order] if order else []
    out: list[list[int]] = []
    for i in order:
        # sorted longest first: the open micro-batch's first row is its longest
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= budget:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def plan(lengths: Sequence[int], ranks: int, budget: int | None) -> Plan:
    """Every rank's micro-batches for one update; all ranks get the same number."""
    per_rank = [pack(lengths, mine, budget) for mine in assign_ranks(lengths, ranks)]
    steps = max((len(m) for m in per_rank), default=0)
    steps = max(steps, 1)  # an update with no samples still steps every rank together
    for batches in per_rank:
        while len(batches) < steps:
            largest = max(range(len(batches)), key=lambda j: len(batches[j]), default=None)
            if largest is None or len(batches[largest]) < 2:
                batches.append([])  # nothing left to split: an empty micro-step
                continue
            big = batches.pop(largest)
            half = len(big) // 2
            batches[largest:largest] = [big[:half], big[half:]]
    return per_rank


@dataclass(frozen=True)
class UpdatePlan:
    """One optimizer update (a mini-batch of the step) as one trainer rank runs it. Indices
    are into the update, whose samples are spread over the trainer ranks."""

    # every sample of the update, all ranks': the loss's denominators (valid tokens) and
    # replay weights (runtime/engines/torch/loss.py) are the whole update's
    n_valid: list[int]
    replayed: list[bool]
    # this rank's samples, in the order they are carried (the step's samples are its
    # updates' in turn)
    positions: list[int]
    # per micro-step, the positions it trains (every trainer rank takes as many: FSDP2)
    micro_batches: list[list[int]]


@dataclass(frozen=True)
class RankPlan:
    """What one trainer rank trains of a batch: the batch's samples at ``batch_positions``,
    in that order, in the step's ``updates``."""

    batch_positions: list[int]
    updates: list[UpdatePlan]


def rank_plans(
    lengths: Sequence[int],
    n_valid: Sequence[int],
    replayed: Sequence[bool],
    mini_batches: int,
    ranks: int,
    budget: int | None,
) -> list[RankPlan]:
    """Every trainer rank's part of a batch (per sample: tokens, valid tokens, replay flag).
    The step is ``mini_batches`` updates on strided mini-batches (``batch[j::k]``): the batch
    comes fresh samples first, replayed last, and every update should see both, as a
    shuffled split would."""
    per_rank = [RankPlan([], []) for _ in range(ranks)]
    for j in range(mini_batches):
        mini = list(range(j, len(lengths), mini_batches))
        micro = plan([lengths[i] for i in mini], ranks, budget)
        for mine, batches in zip(per_rank, micro, strict=True):
            positions = sorted(m for b in batches for m in b)
            mine.batch_positions.extend(mini[m] for m in positions)
            mine.updates.append(
                UpdatePlan(
                    n_valid=[n_valid[i] for i in mini],
                    replayed=[replayed[i] for i in mini],
                    positions=positions,
                    micro_batches=batches,
                )
            )
    return per_rank


def sample_plans(
    samples: Sequence[Sample], mini_batches: int, ranks: int, budget: int | None
) -> list[RankPlan]:
    """:func:`rank_plans` of a batch's samples (tokens: prompt and response)."""
    return rank_plans(
        [len(s.prompt_token_ids) + len(s.token_ids) for s in samples],
        [s.n_valid for s in samples],
        [s.replay_count > 0 for s in samples],
        mini_batches,
        ranks,
        budget,
    )


def by_update(samples: Sequence[Sample], updates: Sequence[UpdatePlan]) -> list[dict[int, Sample]]:
    """A rank's carried samples, update by update, by their index in the update."""
    if len(samples) != sum(len(u.positions) for u in updates):
        raise ValueError(f"{len(samples)} samples, not as many as the updates place")
    out, offset = [], 0
    for u in updates:
        carried = samples[offset : offset + len(u.positions)]
        out.append(dict(zip(u.positions, carried, strict=True)))
        offset += len(u.positions)
    return out
