r"""Policy loss with ReFlow's normalised replay reweighting and rollout-mismatch correction.

Per sample ``i`` with ``n_i`` valid tokens (``m_{i,t} > 0``) and advantage ``A_i``, three
log-probs per token: the current policy's ``log pi_theta(y_{i,t})`` (with grad), the
rollout engine's ``mu_{i,t}`` (stored with the sample when it was generated: the
behaviour policy) and the *old* ``nu_{i,t}``: with ``algorithm.recompute_old_logprobs`` the
trainer's own log-probs of the batch before the step's updates (no grad), otherwise
``nu = mu``. The PPO ratio is taken against ``nu``, the rollout mismatch is ``nu`` against
``mu`` (decoupled PPO, AReaL; verl's rollout correction).

Importance ratio and clipped surrogate (token level, GRPO/PPO):

.. math::

    r_{i,t} = \exp(\log\pi_\theta(y_{i,t}) - \nu_{i,t}),\qquad
    \ell_{i,t} = -\min\big(r_{i,t} A_i,\ \mathrm{clip}(r_{i,t}, 1-\epsilon_l, 1+\epsilon_h) A_i\big)

Optional dual clip ``c`` (``algorithm.dual_clip_cap``, verl's ``clip_ratio_c``): for
negative advantages the token loss is bounded by ``c |A_i|``, so a stale sample with a
huge ratio cannot dominate.

Rollout mismatch (detached; ``log rho`` clamped to ``[-20, 20]`` as verl does):

.. math::

    \rho_{i,t} = \exp(\nu_{i,t} - \mu_{i,t}),\qquad
    v_{i,t} = \min(\rho_{i,t}, C),\qquad
    g_i = \exp\Big(\frac{1}{n_i}\sum_t [m_{i,t} > 0] \log\rho_{i,t}\Big),\qquad
    k_i = [\,1/M \le g_i \le M\,]

``v`` is the truncated importance-sampling weight (``algorithm.tis_cap = C``, verl's token
TIS; ``v = 1`` when off) and ``k_i`` keeps or masks sample ``i`` by its geometric-mean
ratio (``algorithm.mismatch_mask = M``, verl's geometric rejection sampling; ``k = 1`` when
off). A masked sample leaves the loss entirely, as in verl (whose rejection rewrites the
response mask, "rejected samples not in denominator"): neither its tokens' losses nor its
tokens (``token_mean``) or itself (``seq_mean_token_mean``) count, and the replay weights
are normalised over the kept samples only, so the loss is that of the batch without it.

Replay weights (``tau`` for replay samples, 1 for unused ones), normalised by token mass
so the loss keeps the scale of the unweighted loss:

.. math::

    w_i = \begin{cases}\tau & \text{replay}\\ 1 & \text{unused}\end{cases},\qquad
    \tilde w_i = k_i w_i \frac{\sum_j n_j}{\sum_j k_j w_j n_j}
    \quad\Rightarrow\quad \sum_i \tilde w_i n_i = \sum_i n_i .

Loss, ``algorithm.loss_agg: token_mean`` (every token of the batch counts the same):

.. math::

    L = \frac{\sum_i \tilde w_i \sum_t m_{i,t}\, v_{i,t}\, \ell_{i,t}}{\sum_i \sum_t m_{i,t}}
      = \frac{\sum_i k_i w_i \sum_t m_{i,t}\, v_{i,t}\, \ell_{i,t}}{\sum_i k_i w_i n_i}

or ``seq_mean_token_mean`` (every sample counts the same, its tokens averaged; GRPO's
original form): the replay weights are then normalised by sample count,
``w~_i = k_i w_i N / sum_j k_j w_j``, and

.. math::

    L = \frac{1}{N} \sum_i \tilde w_i \frac{\sum_t m_{i,t}\, v_{i,t}\, \ell_{i,t}}{n_i}

Without recompute (``nu = mu``) ``rho = 1``, and with ``tis_cap``/``mismatch_mask`` off
(they need recompute) ``v = k = 1``: the objective is exactly the previous one, to the bit.

Every step reports the mismatch (:class:`LossStats`): the k3 estimator of
``KL(mu || nu)`` averaged over valid tokens, unbiased since ``E_mu[rho] = 1``,

.. math::

    \widehat{KL} = \frac{1}{\sum_i n_i}\sum_{i,t} [m_{i,t}>0]\,(\rho_{i,t} - 1 - \log\rho_{i,t}),

and ``rho``'s min/mean/max, the share of tokens truncated by ``C`` and the share of tokens
in masked samples.

With ``token_mean`` long responses carry more of the gradient than short ones; with
``seq_mean_token_mean`` a short solved problem counts as much as a long one.

With equal token mass (either form), a replay fraction ``lambda`` and weight ``tau``, the
replay share of the gradient is ``alpha = lambda tau / ((1 - lambda) + lambda tau)``
(sigma = tau = 0.5 gives 1/3).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import ClassVar

import torch

from runtime.config.schema import AlgorithmConfig
from runtime.data.sample import Sample

_LOG_RHO_BOUND = 20.0  # |old - rollout| beyond this is clamped (verl's safety bound)


def replay_weights(
    is_replay: torch.Tensor,
    n_valid: torch.Tensor,
    tau: float,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Normalised per-sample weights ``w~`` (shape ``[B]``); ``n_valid`` is each sample's
    mass (its token count for ``token_mean``, ones for ``seq_mean_token_mean``). ``keep``
    (bool ``[B]``) drops masked samples: their weight is 0 and the others' are normalised
    over the kept mass, so the weighted mass is still ``sum(n_valid)``."""
    n = n_valid.to(torch.float64)
    w = torch.where(is_replay, torch.full_like(n, tau), torch.ones_like(n))
    if keep is not None:
        w = w * keep.to(torch.float64)
    total = (w * n).sum()
    if total <= 0:
        if keep is not None and not bool(keep.all()):
            return torch.zeros_like(n, dtype=torch.float32)  # everything masked
        return torch.ones_like(n, dtype=torch.float32)
    return (w * n.sum() / total).to(torch.float32)


@dataclass
class LossStats:
    """Detached statistics of one loss call (a whole batch, or a shard or micro-batch of it).

    Combining rule (:meth:`combine`): every field but the two extremes is *additive*, i.e.
    already normalised by the whole batch (token means divided by the batch's valid-token
    count ``denom``, the loss by its own denominator), so the values of disjoint shards and
    micro-batches of one batch **sum** to the whole batch's; ``is_ratio_min`` and
    ``is_ratio_max`` combine by **min** and **max**. The defaults are the identity of that
    rule, so ``LossStats()`` is the contribution of a replica with no rows (the extremes
    are then ``+inf``/``-inf``; :meth:`as_metrics` leaves non-finite values out).

    Token shares and means are over valid tokens (``mask > 0``) of the whole batch,
    masked samples included.
    """

    loss: float = 0.0
    clip_fraction: float = 0.0  # share of valid tokens whose ratio was clipped
    mean_ratio: float = 0.0  # mean of exp(logprobs - old) over valid tokens
    replay_weight_mass: float = 0.0  # sum_i w~_i n_i / sum_i n_i (1 for token_mean)
    mismatch_k3: float = 0.0  # k3 estimate of KL(rollout || old): mean of rho - 1 - log rho
    is_ratio_mean: float = 0.0  # mean of rho = exp(old - rollout), before truncation
    truncated_share: float = 0.0  # share of valid tokens with rho > tis_cap
    masked_share: float = 0.0  # share of valid tokens in samples masked by mismatch_mask
    is_ratio_min: float = math.inf  # min of rho over valid tokens (combines by min)
    is_ratio_max: float = -math.inf  # max of rho over valid tokens (combines by max)

    EXTREMES: ClassVar[dict[str, Callable[..., float]]] = {
        "is_ratio_min": min,
        "is_ratio_max": max,
    }

    @classmethod
    def combine(cls, parts: Sequence[LossStats]) -> LossStats:
        """The whole batch's statistics from those of its disjoint shards/micro-batches:
        sums, except min/max for the extremes (see the class docstring)."""
        out = cls()
        for f in fields(cls):
            values = [getattr(p, f.name) for p in parts]
            combine = cls.EXTREMES.get(f.name)
            start = getattr(out, f.name)
            setattr(out, f.name, combine(values, default=start) if combine else sum(values, start))
        return out

    def as_metrics(self) -> dict[str, float]:
        """Plain float metrics by field name; non-finite values (the extremes of a batch
        without valid tokens) are left out, as metric messages carry finite floats only."""
        return {k: float(v) for k, v in asdict(self).items() if math.isfinite(v)}


def rollout_logprobs_of(samples: Sequence[Sample], width: int | None = None) -> torch.Tensor:
    """The rollout engine's log-probs ``[B, width]`` (``Sample.logprobs``, one per response
    token), right-padded with 0; ``width`` defaults to the longest response."""
    lengths = [len(s.logprobs) for s in samples]
    width = max(lengths, default=0) if width is None else width
    out = torch.zeros(len(samples), width)
    for i, (s, n) in enumerate(zip(samples, lengths, strict=True)):
        if n > width:
            raise ValueError(f"sample {s.sample_id} has {n} log-probs, more than width {width}")
        if n:
            out[i, :n] = torch.tensor(s.logprobs, dtype=out.dtype)
    return out


def _log_rho(old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor) -> torch.Tensor:
    """``log rho = old - rollout`` (detached, float64, clamped to verl's safety bound)."""
    diff = old_logprobs.detach().to(torch.float64) - rollout_logprobs.detach().to(torch.float64)
    return diff.clamp(-_LOG_RHO_BOUND, _LOG_RHO_BOUND)


def mismatch_keep(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mismatch_mask: float | None,
) -> torch.Tensor:
    """Which samples (bool ``[B]``) ``mismatch_mask`` keeps: the geometric-mean ratio
    ``exp(mean_t(old - rollout))`` over valid tokens is inside ``[1/M, M]`` (bounds
    included). All kept when ``mismatch_mask`` is None; a sample without valid tokens is
    kept (it adds nothing anyway)."""
    if mismatch_mask is None:
        return torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
    valid = (mask > 0).to(torch.float64)
    mean = (_log_rho(old_logprobs, rollout_logprobs) * valid).sum(1) / valid.sum(1).clamp_min(1)
    return mean.abs() <= math.log(mismatch_mask)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip_cap: float | None = None,
    tis_cap: float | None = None,
    mismatch_mask: float | None = None,
    denom: float | None = None,
    agg: str = "token_mean",
    n_seqs: int | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """Shapes: ``logprobs``/``old_logprobs``/``rollout_logprobs``/``mask`` ``[B, T]``;
    ``advantages``/``weights`` ``[B]``. Pass the rollout log-probs as ``old_logprobs`` when
    they are not recomputed. ``denom`` is the whole batch's valid-token count when these
    rows are one data-parallel shard of it (then shard losses and statistics sum to the
    batch's), and ``n_seqs`` its sample count (for ``agg="seq_mean_token_mean"``); neither
    is reduced by masking.

    ``mismatch_mask`` zeroes the weight of the rows it masks and rescales the others so
    that the weighted mass ``sum_i w_i mass_i`` of these rows is unchanged (mass: token
    count for ``token_mean``, 1 otherwise), which takes masked samples out of the
    denominator. For a shard that must be done over the whole batch: pass weights that are
    already 0 for the masked samples and normalised over the kept ones
    (:meth:`Normaliser.weights` with ``keep``, as :func:`batch_loss` does); the rescaling
    here is then exactly 1.

    Returns the scalar loss and detached statistics."""
    if agg not in ("token_mean", "seq_mean_token_mean"):
        raise ValueError(f"unknown loss aggregation {agg!r}")
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    # the batch's metadata comes as CPU tensors; the log-probs are on the trainer's device
    adv = advantages[:, None].to(device=logprobs.device, dtype=logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    objective = torch.minimum(unclipped, clipped)
    if dual_clip_cap is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, dual_clip_cap * adv), objective)
    token_loss = -objective * mask
    with torch.no_grad():
        valid = mask > 0
        log_rho = _log_rho(old_logprobs, rollout_logprobs)
        rho = torch.exp(log_rho)
        keep = mismatch_keep(old_logprobs, rollout_logprobs, mask, mismatch_mask)
    if tis_cap is not None:
        token_loss = token_loss * rho.clamp(max=tis_cap).to(logprobs.dtype)
    w = weights.to(device=logprobs.device, dtype=logprobs.dtype)
    if not bool(keep.all()):  # masked rows: weight 0, the others take their mass
        kept = keep.to(w.dtype)
        with torch.no_grad():
            mass = mask.sum(1) if agg == "token_mean" else torch.ones_like(w)
            total, kept_mass = (w * mass).sum(), (w * kept * mass).sum()
            scale = total / kept_mass if kept_mass > 0 else torch.zeros_like(total)
        w = w * kept * scale
    denom_t = (
        mask.sum().clamp_min(1.0)
        if denom is None
        else torch.tensor(max(denom, 1.0), device=mask.device)
    )
    if agg == "token_mean":
        loss = (w[:, None] * token_loss).sum() / denom_t
    else:
        per_seq = token_loss.sum(1) / mask.sum(1).clamp_min(1.0)
        loss = (w * per_seq).sum() / max(len(w) if n_seqs is None else n_seqs, 1)
    with torch.no_grad():
        was_clipped = ((unclipped != clipped) & valid).to(logprobs.dtype)
        d = float(denom_t)
        vf = valid.to(torch.float64)
        rho_valid = rho[valid]
        n_masked = float((vf * (~keep)[:, None]).sum())
        n_truncated = 0.0 if tis_cap is None else float((valid & (rho > tis_cap)).sum())
        stats = LossStats(
            loss=float(loss),
            clip_fraction=float(was_clipped.sum() / denom_t),
            mean_ratio=float((ratio * mask).sum() / denom_t),
            replay_weight_mass=float((w * mask.sum(1)).sum() / denom_t),
            mismatch_k3=float(((rho - 1.0 - log_rho) * vf).sum()) / d,
            is_ratio_mean=float((rho * vf).sum()) / d,
            truncated_share=n_truncated / d,
            masked_share=n_masked / d,
            is_ratio_min=float(rho_valid.min()) if rho_valid.numel() else math.inf,
            is_ratio_max=float(rho_valid.max()) if rho_valid.numel() else -math.inf,
        )
    return loss, stats


@dataclass(frozen=True)
class Normaliser:
    """What the loss's normalisers read of a whole update (a mini-batch): each sample's
    valid tokens and replay flag. A data-parallel rank gets it from rank 0's plan
    (runtime/data/micro_batches.py ``UpdatePlan``) with only its own samples."""

    n_valid: Sequence[int]
    replayed: Sequence[bool]

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Normaliser:
        return cls([s.n_valid for s in samples], [s.replay_count > 0 for s in samples])

    def __len__(self) -> int:
        return len(self.n_valid)

    def weights(
        self, tau: float, agg: str, keep: torch.Tensor | Sequence[bool] | None = None
    ) -> tuple[torch.Tensor, float]:
        """Per-sample replay weights ``w~`` and the update's valid-token count. ``keep`` (one
        flag per sample) normalises the weights over the kept samples (masked ones get 0);
        the token count is the whole update's either way."""
        is_replay = torch.tensor(list(self.replayed), dtype=torch.bool)
        n_valid = torch.tensor(list(self.n_valid), dtype=torch.long)
        mass = n_valid if agg == "token_mean" else torch.ones_like(n_valid)
        keep_t = None if keep is None else torch.as_tensor(keep, dtype=torch.bool)
        return replay_weights(is_replay, mass, tau, keep_t), float(n_valid.sum())


def batch_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor | None,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    rows: Sequence[Sample],
    algorithm: AlgorithmConfig,
    replay_tau: float,
    *,
    norm: Normaliser | None = None,
    at: Sequence[int] | None = None,
    keep: torch.Tensor | Sequence[bool] | None = None,
) -> tuple[torch.Tensor, LossStats]:
    """The loss of ``rows`` (their samples give the advantages): replayed samples weighted
    by ``replay_tau`` (``reflow.tau``), the clip, TIS and masking settings of ``algorithm``.

    ``logprobs``/``old_logprobs``/``rollout_logprobs``/``mask`` are ``[rows, T]``;
    ``rollout_logprobs`` is :func:`rollout_logprobs_of` the rows.
    ``old_logprobs`` None means "not recomputed": the rollout log-probs are the old ones.

    ``norm`` is the whole update the rows belong to and ``at`` their indices in it (a
    data-parallel shard's micro-batch); without them the rows are the whole update. The
    weights and the denominator come from the whole update. ``keep`` is
    ``mismatch_mask``'s verdict on every sample of the update; without ``at`` it is computed
    here, with ``at`` it must be given when ``algorithm.mismatch_mask`` is set: each
    replica's :func:`mismatch_keep` of its rows, put at their indices of a zero vector and
    all-reduced by sum (it is checked against these rows' own verdict).
    """
    a = algorithm
    agg = a.loss_agg
    if norm is None:
        norm = Normaliser.of(rows)
    if len(rows) != (len(norm) if at is None else len(at)):
        raise ValueError(f"{len(rows)} rows, but at= places {len(norm if at is None else at)}")
    if old_logprobs is None:
        if a.tis_cap is not None or a.mismatch_mask is not None:
            raise ValueError(
                "algorithm.tis_cap / mismatch_mask need the recomputed old log-probs "
                "(got old_logprobs=None)"
            )
        old_logprobs = rollout_logprobs
    if a.mismatch_mask is None:
        keep = None
    else:
        mine = mismatch_keep(old_logprobs, rollout_logprobs, mask, a.mismatch_mask).cpu()
        if keep is None:
            if at is not None:
                raise ValueError(
                    "algorithm.mismatch_mask on a shard needs keep= for the whole update "
                    "(each replica's mismatch_keep of its rows, all-reduced)"
                )
            keep = mine
        else:
            keep = torch.as_tensor(keep, dtype=torch.bool).cpu()
            if len(keep) != len(norm) or not torch.equal(
                keep if at is None else keep[list(at)], mine
            ):
                raise ValueError("keep disagrees with these rows' old and rollout log-probs")
    weights, denom = norm.weights(replay_tau, agg, keep)
    n_seqs = len(norm)
    if at is not None:
        weights = weights[list(at)]
    adv = torch.tensor([s.advantage for s in rows], dtype=torch.float32)
    return policy_loss(
        logprobs,
        old_logprobs,
        rollout_logprobs,
        adv,
        mask,
        weights,
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip_cap=a.dual_clip_cap,
        tis_cap=a.tis_cap,
        mismatch_mask=a.mismatch_mask,
        denom=denom,
        agg=agg,
        n_seqs=n_seqs,
    )
