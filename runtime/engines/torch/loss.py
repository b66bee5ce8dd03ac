r"""Policy loss with ReFlow's normalised replay reweighting.

Per sample ``i`` with ``n_i`` valid tokens, advantage ``A_i`` and behaviour log-probs
``mu_{i,t}`` (stored with the sample when it was generated):

Replay weights (``tau`` for replay samples, 1 for unused ones), normalised by token mass
so the loss keeps the scale of the unweighted loss:

.. math::

    w_i = \begin{cases}\tau & \text{replay}\\ 1 & \text{unused}\end{cases},\qquad
    \tilde w_i = w_i \frac{\sum_j n_j}{\sum_j w_j n_j}
    \quad\Rightarrow\quad \sum_i \tilde w_i n_i = \sum_i n_i .

Importance ratio and clipped surrogate (token level, GRPO/PPO):

.. math::

    r_{i,t} = \exp(\log\pi_\theta(y_{i,t}) - \mu_{i,t}),\qquad
    \ell_{i,t} = -\min\big(r_{i,t} A_i,\ \mathrm{clip}(r_{i,t}, 1-\epsilon_l, 1+\epsilon_h) A_i\big)

Optional cap ``c`` (``algorithm.tis_cap``): for negative advantages the token loss is
bounded by ``c |A_i|`` (dual clip), so a stale sample with a huge ratio cannot dominate.

Loss, ``algorithm.loss_agg: token_mean`` (every token of the batch counts the same):

.. math::

    L = \frac{\sum_i \tilde w_i \sum_t m_{i,t}\, \ell_{i,t}}{\sum_i \sum_t m_{i,t}}

or ``seq_mean_token_mean`` (every sample counts the same, its tokens averaged; GRPO's
original form): the replay weights are then normalised by sample count,
``w~_i = w_i N / sum_j w_j``, and

.. math::

    L = \frac{1}{N} \sum_i \tilde w_i \frac{\sum_t m_{i,t}\, \ell_{i,t}}{n_i}

With ``token_mean`` long responses carry more of the gradient than short ones; with
``seq_mean_token_mean`` a short solved problem counts as much as a long one.

With equal token mass (either form), a replay fraction ``lambda`` and weight ``tau``, the
replay share of the gradient is ``alpha = lambda tau / ((1 - lambda) + lambda tau)``
(sigma = tau = 0.5 gives 1/3).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from runtime.data.sample import Sample


def replay_weights(is_replay: torch.Tensor, n_valid: torch.Tensor, tau: float) -> torch.Tensor:
    """Normalised per-sample weights ``w~`` (shape ``[B]``); ``n_valid`` is each sample's
    mass (its token count for ``token_mean``, ones for ``seq_mean_token_mean``)."""
    n = n_valid.to(torch.float64)
    w = torch.where(is_replay, torch.full_like(n, tau), torch.ones_like(n))
    total = (w * n).sum()
    if total <= 0:
        return torch.ones_like(n, dtype=torch.float32)
    return (w * n.sum() / total).to(torch.float32)


@dataclass
class LossStats:
    loss: float
    clip_fraction: float
    mean_ratio: float
    replay_weight_mass: float


def policy_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    tis_cap: float | None = None,
    denom: float | None = None,
    agg: str = "token_mean",
    n_seqs: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Shapes: ``logprobs``/``behavior_logprobs``/``mask`` ``[B, T]``; ``advantages``/
    ``weights`` ``[B]``. ``denom`` is the whole batch's token count when these rows are one
    data-parallel shard of it (then shard losses and statistics sum to the batch's), and
    ``n_seqs`` its sample count (for ``agg="seq_mean_token_mean"``).
    Returns the scalar loss and detached statistics."""
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - behavior_logprobs)
    adv = advantages[:, None].to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    objective = torch.minimum(unclipped, clipped)
    if tis_cap is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, tis_cap * adv), objective)
    token_loss = -objective * mask
    denom_t = mask.sum().clamp_min(1.0) if denom is None else torch.tensor(max(denom, 1.0))
    w = weights.to(logprobs.dtype)
    if agg == "token_mean":
        loss = (w[:, None] * token_loss).sum() / denom_t
    elif agg == "seq_mean_token_mean":
        per_seq = token_loss.sum(1) / mask.sum(1).clamp_min(1.0)
        loss = (w * per_seq).sum() / max(len(w) if n_seqs is None else n_seqs, 1)
    else:
        raise ValueError(f"unknown loss aggregation {agg!r}")
    with torch.no_grad():
        was_clipped = ((unclipped != clipped) & (mask > 0)).to(logprobs.dtype)
        stats = LossStats(
            loss=float(loss),
            clip_fraction=float(was_clipped.sum() / denom_t),
            mean_ratio=float((ratio * mask).sum() / denom_t),
            replay_weight_mass=float((weights * mask.sum(1)).sum() / denom_t),
        )
    return loss, stats


def batch_normalisers(
    samples: Sequence[Sample], tau: float, agg: str = "token_mean"
) -> tuple[torch.Tensor, float]:
    """Per-sample replay weights ``w~`` and the token count of a whole batch, from its
    samples' metadata (so every data-parallel shard can use the batch's own values)."""
    is_replay = torch.tensor([s.replay_count > 0 for s in samples])
    n_valid = torch.tensor([s.n_valid for s in samples])
    mass = n_valid if agg == "token_mean" else torch.ones_like(n_valid)
    return replay_weights(is_replay, mass, tau), float(n_valid.sum())


def batch_loss(
    logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    samples: Sequence[Sample],
    cfg,
    shard: list[int] | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of a batch as rank 0 sends it: advantages and replay flags from its
    samples, ``tau`` and the clip settings from the run's config.

    With ``shard`` (indices into ``samples``) the rows are that data-parallel shard only;
    weights and the denominator still come from the whole batch.
    """
    agg = cfg.algorithm.loss_agg
    weights, denom = batch_normalisers(samples, cfg.reflow.tau, agg)
    n_seqs = len(samples)
    if shard is not None:
        samples, weights = [samples[i] for i in shard], weights[shard]
    adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    a = cfg.algorithm
    return policy_loss(
        logprobs,
        behavior_logprobs,
        adv,
        mask,
        weights,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        tis_cap=a.tis_cap,
        denom=denom,
        agg=agg,
        n_seqs=n_seqs,
    )
