"""The reweighted policy loss, checked on real gradients of a small torch model."""

import math
from dataclasses import fields

import pytest
import torch

from runtime.config.recipe import build_config
from runtime.data.sample import Sample
from runtime.engines.torch.loss import (
    LossStats,
    Normaliser,
    batch_loss,
    mismatch_keep,
    policy_loss,
    replay_weights,
    rollout_logprobs_of,
)

AGGS = ["token_mean", "seq_mean_token_mean"]


class TinyPolicy(torch.nn.Module):
    def __init__(self, vocab=11, dim=8):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(vocab, dim)
        self.out = torch.nn.Linear(dim, vocab)

    def logprobs(self, tokens):  # predict token t from token t-1 (teacher forcing)
        logits = self.out(self.emb(tokens[:, :-1]))
        return torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)


def grad_of(loss, model):
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def leaf_grad(loss, leaf):
    (g,) = torch.autograd.grad(loss, leaf)
    return g


def _previous_policy_loss(logprobs, behavior, advantages, mask, weights, *, cap=None, agg):
    """The loss as it was before the decoupled objective (verbatim), the exactness reference."""
    mask = mask.to(logprobs.dtype)
    ratio = torch.exp(logprobs - behavior)
    adv = advantages[:, None].to(logprobs.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - 0.2, 1.0 + 0.28) * adv
    objective = torch.minimum(unclipped, clipped)
    if cap is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, cap * adv), objective)
    token_loss = -objective * mask
    denom_t = mask.sum().clamp_min(1.0)
    w = weights.to(logprobs.dtype)
    if agg == "token_mean":
        return (w[:, None] * token_loss).sum() / denom_t
    per_seq = token_loss.sum(1) / mask.sum(1).clamp_min(1.0)
    return (w * per_seq).sum() / max(len(w), 1)


@pytest.mark.parametrize(("lam", "tau"), [(0.5, 0.5), (0.25, 0.5), (0.5, 0.2), (0.75, 0.9)])
def test_replay_share_of_the_gradient(lam, tau):
    model = TinyPolicy()
    B, T = 8, 6
    row = torch.randint(0, 11, (1, T + 1))
    tokens = row.repeat(B, 1)  # equal token mass, identical per-sample gradients
    with torch.no_grad():
        behavior = model.logprobs(tokens) + 0.05  # slightly off-policy, inside the clip range
    mask = torch.ones(B, T)
    adv = torch.full((B,), 1.0)
    n_replay = int(lam * B)
    is_replay = torch.arange(B) >= B - n_replay
    w = replay_weights(is_replay, mask.sum(1), tau)

    def loss_with(advantages):
        loss, _ = policy_loss(
            model.logprobs(tokens),
            behavior,
            behavior,
            advantages,
            mask,
            w,
            clip_low=0.2,
            clip_high=0.28,
        )
        return loss

    g_total = grad_of(loss_with(adv), model)
    g_replay = grad_of(loss_with(torch.where(is_replay, adv, torch.zeros_like(adv))), model)
    alpha = float(g_replay @ g_total / (g_total @ g_total))
    assert alpha == pytest.approx(lam * tau / ((1 - lam) + lam * tau), rel=1e-4)
    if lam == 0.5 and tau == 0.5:
        assert alpha == pytest.approx(1 / 3, rel=1e-4)


def test_no_replay_equals_plain_clipped_grpo():
    torch.manual_seed(1)
    B, T = 5, 7
    logp = torch.randn(B, T) * 0.3 - 2
    behavior = logp + torch.randn(B, T) * 0.4
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.3).float()
    w = replay_weights(torch.zeros(B, dtype=torch.bool), mask.sum(1), 0.5)
    loss, stats = policy_loss(logp, behavior, behavior, adv, mask, w, clip_low=0.2, clip_high=0.28)
    # Reference: token-mean of the clipped surrogate, written out independently.
    total, count = 0.0, 0.0
    for i in range(B):
        for t in range(T):
            if mask[i, t]:
                r = float(torch.exp(logp[i, t] - behavior[i, t]))
                a = float(adv[i])
                total += -min(r * a, min(max(r, 0.8), 1.28) * a)
                count += 1
    assert float(loss) == pytest.approx(total / count, rel=1e-5)
    assert stats.replay_weight_mass == pytest.approx(1.0)


def test_normalised_weights_preserve_the_loss_scale():
    n = torch.tensor([3.0, 10.0, 1.0, 7.0, 5.0])
    is_replay = torch.tensor([False, True, True, False, True])
    w = replay_weights(is_replay, n, 0.3)
    assert float((w * n).sum()) == pytest.approx(float(n.sum()))
    assert float(w[1] / w[0]) == pytest.approx(0.3)
    # All-replay batches are scaled back up to weight 1 each.
    assert replay_weights(torch.ones(3, dtype=torch.bool), n[:3], 0.3).tolist() == pytest.approx(
        [1.0, 1.0, 1.0]
    )
    # Masked samples get 0 and the kept ones carry the whole mass.
    keep = torch.tensor([True, False, True, True, False])
    wk = replay_weights(is_replay, n, 0.3, keep)
    assert wk[1] == 0 and wk[4] == 0
    assert float((wk * n).sum()) == pytest.approx(float(n.sum()))
    assert float(wk[2] / wk[0]) == pytest.approx(0.3)


def test_the_dual_clip_bounds_negative_advantage_tokens():
    logp = torch.tensor([[0.0]])
    behavior = torch.tensor([[-5.0]])  # ratio e^5 ~ 148
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, 1)
    w = torch.ones(1)
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    free, _ = policy_loss(logp, behavior, behavior, adv, mask, w, **kw)
    capped, _ = policy_loss(logp, behavior, behavior, adv, mask, w, dual_clip_cap=3.0, **kw)
    assert float(free) == pytest.approx(float(torch.exp(torch.tensor(5.0))), rel=1e-5)
    assert float(capped) == pytest.approx(3.0)


def _batch(lengths, replay, logprobs=None):
    samples = [
        Sample(
            sample_id=i,
            group_id=i,
            prompt_id=i,
            versions=[(0, 0, n)],
            token_ids=[1] * n,
            logprobs=[-1.0] * n if logprobs is None else [float(x) for x in logprobs[i, :n]],
            n_valid=n,
            reward=0.0,
            replay_count=int(r),
            advantage=1.0 - 0.5 * i,
        )
        for i, (n, r) in enumerate(zip(lengths, replay, strict=True))
    ]
    T = max(lengths)
    mask = torch.zeros(len(lengths), T)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    return samples, mask


def _cfg(agg, **algorithm):
    """batch_loss's algorithm section and replay weight, from a recipe."""
    cfg = build_config({"algorithm": {"loss_agg": agg, **algorithm}, "reflow": {"tau": 0.3}})
    return cfg.algorithm, cfg.reflow.tau


def test_rollout_logprobs_are_right_padded_with_zero():
    samples, _ = _batch([2, 3], [0, 0])
    samples[0].logprobs = [-0.5, -1.5]
    out = rollout_logprobs_of(samples)
    assert out.tolist() == [[-0.5, -1.5, 0.0], [-1.0, -1.0, -1.0]]
    assert rollout_logprobs_of(samples, 5).shape == (2, 5)
    with pytest.raises(ValueError, match="more than width"):
        rollout_logprobs_of(samples, 2)


def rows(samples, idx):
    return [samples[i] for i in idx]


@pytest.mark.parametrize("agg", AGGS)
def test_data_parallel_shards_add_up_to_the_whole_batch(agg):
    cfg = _cfg(agg)
    samples, mask = _batch([3, 7, 1, 5, 6], [0, 1, 0, 1, 0])
    torch.manual_seed(1)
    rollout = rollout_logprobs_of(samples)
    logp = rollout + torch.randn(5, 7) * 0.05
    whole, st = batch_loss(logp, None, rollout, mask, samples, *cfg)
    parts = [
        batch_loss(
            logp[idx],
            None,
            rollout[idx],
            mask[idx],
            rows(samples, idx),
            *cfg,
            norm=Normaliser.of(samples),
            at=idx,
        )
        for idx in ([0, 2, 4], [1, 3])
    ]
    assert sum(float(x) for x, _ in parts) == pytest.approx(float(whole), rel=1e-6)
    assert sum(s.clip_fraction for _, s in parts) == pytest.approx(st.clip_fraction, abs=1e-7)


def test_seq_mean_gives_every_sample_the_same_weight_whatever_its_length():
    logp = torch.zeros(2, 8, requires_grad=True)
    behavior = torch.zeros(2, 8)
    _, mask = _batch([2, 8], [0, 0])
    adv = torch.tensor([1.0, 1.0])
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    w = replay_weights(torch.zeros(2, dtype=torch.bool), torch.ones(2), 0.5)
    loss, _ = policy_loss(logp, behavior, behavior, adv, mask, w, agg="seq_mean_token_mean", **kw)
    loss.backward()
    per_sample = (logp.grad * mask).sum(1)
    assert per_sample[0] == pytest.approx(per_sample[1].item())  # short = long
    logp.grad = None
    w = replay_weights(torch.zeros(2, dtype=torch.bool), mask.sum(1), 0.5)
    loss, _ = policy_loss(logp, behavior, behavior, adv, mask, w, **kw)
    loss.backward()
    per_sample = (logp.grad * mask).sum(1)
    assert per_sample[1] == pytest.approx(4 * per_sample[0].item())  # token-mean: 8 vs 2


# --- decoupled objective: old (recomputed) vs rollout log-probs ------------------------


def _random_batch(B=5, T=7, seed=3):
    torch.manual_seed(seed)
    logp = (torch.randn(B, T) * 0.3 - 2).requires_grad_()
    old = logp.detach() + torch.randn(B, T) * 0.3  # some ratios outside the clip range
    adv = torch.randn(B)
    mask = (torch.rand(B, T) > 0.3).float()
    mask[:, 0] = 1
    is_replay = torch.tensor([i % 2 == 1 for i in range(B)])
    return logp, old, adv, mask, is_replay


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("cap", [None, 2.0])
def test_identical_old_and_rollout_logprobs_are_the_previous_objective(agg, cap):
    logp, rollout, adv, mask, is_replay = _random_batch()
    adv[0] = -3.0  # a negative advantage past the dual clip
    rollout[0, 0] = logp[0, 0].detach() - 2.0
    mass = mask.sum(1) if agg == "token_mean" else torch.ones(len(adv))
    w = replay_weights(is_replay, mass, 0.3)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip_cap": cap, "agg": agg}
    reference = _previous_policy_loss(logp, rollout, adv, mask, w, cap=cap, agg=agg)
    g_ref = leaf_grad(reference, logp)
    for old in (rollout, rollout.clone()):  # the same tensor, or equal values
        loss, st = policy_loss(logp, old, rollout, adv, mask, w, **kw)
        assert torch.equal(loss, reference)
        assert torch.equal(leaf_grad(loss, logp), g_ref)
        # TIS with a cap >= 1 and masking are no-ops without a mismatch.
        both, st2 = policy_loss(
            logp, old, rollout, adv, mask, w, tis_cap=2, mismatch_mask=1.01, **kw
        )
        assert torch.equal(both, reference)
        assert torch.equal(leaf_grad(both, logp), g_ref)
        for s in (st, st2):
            assert s.mismatch_k3 == 0.0 and s.truncated_share == 0.0 and s.masked_share == 0.0
            assert s.is_ratio_min == s.is_ratio_max == 1.0
            assert s.is_ratio_mean == pytest.approx(1.0)
    # batch_loss: not recomputed (None) is the same as passing the rollout log-probs as old.
    lengths = [int(n) for n in mask.sum(1)]
    samples, _ = _batch(lengths, is_replay.tolist())
    for s, a in zip(samples, adv.tolist(), strict=True):
        s.advantage = a
    cfg = _cfg(agg, dual_clip_cap=cap)
    m = torch.zeros_like(mask)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    a_loss, _ = batch_loss(logp, None, rollout, m, samples, *cfg)
    b_loss, _ = batch_loss(logp, rollout.clone(), rollout, m, samples, *cfg)
    assert torch.equal(a_loss, b_loss)
    w = replay_weights(is_replay, m.sum(1) if agg == "token_mean" else torch.ones(5), 0.3)
    assert torch.equal(a_loss, _previous_policy_loss(logp, rollout, adv, m, w, cap=cap, agg=agg))


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("d", [0.3, -0.2])
def test_a_constant_mismatch_is_reported_and_truncated(agg, d):
    logp, old, adv, mask, is_replay = _random_batch()
    rollout = old - d  # old - rollout = d on every token
    mass = mask.sum(1) if agg == "token_mean" else torch.ones(len(adv))
    w = replay_weights(is_replay, mass, 0.3)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "agg": agg}
    plain, st = policy_loss(logp, old, rollout, adv, mask, w, **kw)
    # The ratio is against old: the mismatch does not change the untruncated objective.
    same, _ = policy_loss(logp, old, old, adv, mask, w, **kw)
    assert torch.equal(plain, same)
    e = math.exp(d)
    for value in (st.is_ratio_min, st.is_ratio_mean, st.is_ratio_max):
        assert value == pytest.approx(e, rel=1e-5)
    assert st.mismatch_k3 == pytest.approx(e - 1 - d, rel=1e-4)
    assert st.truncated_share == 0.0 and st.masked_share == 0.0
    g_plain = leaf_grad(plain, logp)

    cap = 0.8 * e  # below exp(d): every token is truncated to the cap
    tis, st = policy_loss(logp, old, rollout, adv, mask, w, tis_cap=cap, **kw)
    assert st.truncated_share == 1.0
    assert tis.item() == pytest.approx(cap * plain.item(), rel=1e-5)
    torch.testing.assert_close(leaf_grad(tis, logp), cap * g_plain)
    assert st.is_ratio_max == pytest.approx(e, rel=1e-5)  # before truncation

    untouched, st = policy_loss(logp, old, rollout, adv, mask, w, tis_cap=1.2 * e, **kw)
    assert st.truncated_share == 0.0
    assert untouched.item() == pytest.approx(e * plain.item(), rel=1e-5)


def test_truncated_share_is_the_share_of_tokens_over_the_cap():
    logp, old, adv, mask, is_replay = _random_batch(B=6, T=9, seed=5)
    torch.manual_seed(7)
    d = torch.rand(6, 9) * 0.4 - 0.2  # inside [-0.2, 0.2]
    over = torch.rand(6, 9) < 0.3
    d = torch.where(over, torch.full_like(d, 0.6), d)  # these exceed the cap
    rollout = old - d
    cap = math.exp(0.4)
    w = replay_weights(is_replay, mask.sum(1), 0.3)
    kw = {"clip_low": 0.2, "clip_high": 0.28}
    loss, st = policy_loss(logp, old, rollout, adv, mask, w, tis_cap=cap, **kw)
    valid = mask > 0
    expected = float((over & valid).sum() / valid.sum())
    assert 0 < expected < 1
    assert st.truncated_share == pytest.approx(expected)
    # Independent reference: each token's clipped surrogate times min(exp(d), cap).
    total = 0.0
    for i in range(6):
        for t in range(9):
            if valid[i, t]:
                r = math.exp(logp[i, t].item() - old[i, t].item())
                a = float(adv[i])
                rho = math.exp(float(old[i, t]) - float(rollout[i, t]))
                total += -float(w[i]) * min(rho, cap) * min(r * a, min(max(r, 0.8), 1.28) * a)
    assert loss.item() == pytest.approx(total / float(valid.sum()), rel=1e-5)
    rho = torch.exp(old - rollout)[valid]
    assert st.is_ratio_min == pytest.approx(float(rho.min()), rel=1e-6)
    assert st.is_ratio_max == pytest.approx(float(rho.max()), rel=1e-6)
    k3 = (rho.double() - 1 - rho.double().log()).mean()
    assert st.mismatch_k3 == pytest.approx(float(k3), rel=1e-4)


def _mismatched_batch(M):
    """Five samples; sample 1's geometric-mean ratio is above M, sample 3's below 1/M, while
    each has single tokens on both sides of 1 (a per-sample mean, not a per-token test)."""
    lengths, replay = [3, 7, 2, 5, 6], [0, 1, 0, 1, 0]
    torch.manual_seed(11)
    T = max(lengths)
    logp = (torch.randn(5, T) * 0.1 - 2).requires_grad_()
    old = logp.detach() + torch.randn(5, T) * 0.05
    d = torch.randn(5, T) * 0.02  # inside the band
    log_m = math.log(M)
    d[1, :7] = torch.tensor([3, -1, 3, -1, 3, 1, 1.0]) * log_m  # mean 9/7 log M
    d[3, :5] = torch.tensor([-3, 1, -3, -1, 0.5]) * log_m  # mean -1.1 log M
    d[4, :6] = torch.tensor([1.5, -1.5, 1.5, -1.5, 1.5, -1.5]) * log_m  # tokens out, mean 0
    rollout = old - d
    samples, mask = _batch(lengths, replay, logprobs=rollout)
    for i in range(5):
        rollout[i, lengths[i] :] = 0  # padding as rollout_logprobs_of has it
    assert torch.equal(rollout_logprobs_of(samples), rollout)
    return logp, old, rollout, mask, samples


@pytest.mark.parametrize("agg", AGGS)
def test_a_sample_with_a_mean_mismatch_beyond_the_bound_is_masked(agg):
    M = 1.5
    logp, old, rollout, mask, samples = _mismatched_batch(M)
    cfg = _cfg(agg, recompute_old_logprobs=True, mismatch_mask=M)
    keep = mismatch_keep(old, rollout, mask, M)
    assert keep.tolist() == [True, False, True, False, True]
    loss, st = batch_loss(logp, old, rollout, mask, samples, *cfg)
    g = leaf_grad(loss, logp)
    assert torch.count_nonzero(g[1]) == 0 and torch.count_nonzero(g[3]) == 0
    assert torch.count_nonzero(g[[0, 2, 4]]) > 0
    assert st.masked_share == pytest.approx((7 + 5) / float(mask.sum()))
    # A masked sample leaves the batch (verl's rejection sampling): the loss is that of the
    # kept samples alone, replay weights and denominator included.
    kept = [0, 2, 4]
    alone, _ = batch_loss(
        logp[kept], old[kept], rollout[kept], mask[kept], [samples[i] for i in kept], *cfg
    )
    assert loss.item() == pytest.approx(alone.item(), rel=1e-5, abs=1e-8)
    torch.testing.assert_close(g[kept], leaf_grad(alone, logp)[kept])
    if agg == "token_mean":
        assert st.replay_weight_mass == pytest.approx(1.0)  # the kept samples carry the mass


@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_alone_takes_masked_samples_out_of_the_denominator(agg):
    M = 1.5
    logp, old, rollout, mask, samples = _mismatched_batch(M)
    adv = torch.tensor([s.advantage for s in samples])
    is_replay = torch.tensor([s.replay_count > 0 for s in samples])
    mass = mask.sum(1) if agg == "token_mean" else torch.ones(5)
    kw = {"clip_low": 0.2, "clip_high": 0.28, "agg": agg}
    w = replay_weights(is_replay, mass, 0.3)  # normalised over all, masked samples included
    loss, st = policy_loss(logp, old, rollout, adv, mask, w, mismatch_mask=M, **kw)
    kept = [0, 2, 4]
    w_kept = replay_weights(is_replay[kept], mass[kept], 0.3)
    alone, _ = policy_loss(
        logp[kept], old[kept], rollout[kept], adv[kept], mask[kept], w_kept, **kw
    )
    assert loss.item() == pytest.approx(alone.item(), rel=1e-5, abs=1e-8)
    assert st.masked_share == pytest.approx((7 + 5) / float(mask.sum()))
    g = leaf_grad(loss, logp)
    assert torch.count_nonzero(g[[1, 3]]) == 0
    torch.testing.assert_close(g[kept], leaf_grad(alone, logp)[kept])


@pytest.mark.parametrize("agg", AGGS)
def test_shard_stats_combine_to_the_whole_batch(agg):
    M = 1.5
    logp, old, rollout, mask, samples = _mismatched_batch(M)
    cfg = _cfg(agg, recompute_old_logprobs=True, mismatch_mask=M, tis_cap=1.05, dual_clip_cap=3)
    whole, st = batch_loss(logp, old, rollout, mask, samples, *cfg)
    assert st.masked_share > 0 and 0 < st.truncated_share < 1
    g_whole = leaf_grad(whole, logp)
    # Each replica's verdict on its rows, put at its shard indices and all-reduced by sum.
    shards = ([0, 2, 4], [1, 3])
    keep = torch.zeros(len(samples))
    for idx in shards:
        keep[idx] += mismatch_keep(old[idx], rollout[idx], mask[idx], M).float()
    parts, g_parts = [], torch.zeros_like(logp)
    for idx in shards:
        loss, s = batch_loss(
            logp[idx],
            old[idx],
            rollout[idx],
            mask[idx],
            rows(samples, idx),
            *cfg,
            keep=keep > 0,
            norm=Normaliser.of(samples),
            at=idx,
        )
        g_parts += leaf_grad(loss, logp)
        parts.append(s)
    combined = LossStats.combine([*parts, LossStats()])  # an empty replica adds nothing
    for f in fields(LossStats):
        assert getattr(combined, f.name) == pytest.approx(getattr(st, f.name), rel=1e-5, abs=1e-7)
    torch.testing.assert_close(g_parts, g_whole)
    assert combined.is_ratio_min == min(s.is_ratio_min for s in parts)
    assert combined.is_ratio_max == max(s.is_ratio_max for s in parts)
    metrics = combined.as_metrics()
    assert set(metrics) == {f.name for f in fields(LossStats)}
    assert LossStats.combine([]) == LossStats()
    assert set(LossStats().as_metrics()) == {f.name for f in fields(LossStats)} - {
        "is_ratio_min",
        "is_ratio_max",
    }


def test_batch_loss_refuses_what_it_cannot_do_right():
    M = 1.5
    logp, old, rollout, mask, samples = _mismatched_batch(M)
    cfg = _cfg("token_mean", recompute_old_logprobs=True, mismatch_mask=M)
    with pytest.raises(ValueError, match="keep="):
        batch_loss(
            logp[[0, 1]],
            old[[0, 1]],
            rollout[[0, 1]],
            mask[[0, 1]],
            samples[:2],
            *cfg,
            norm=Normaliser.of(samples),
            at=[0, 1],
        )
    with pytest.raises(ValueError, match="2 rows, but at= places 5"):  # rows of a larger update
        batch_loss(
            logp[[0, 1]],
            old[[0, 1]],
            rollout[[0, 1]],
            mask[[0, 1]],
            samples[:2],
            *cfg,
            norm=Normaliser.of(samples),
        )
    with pytest.raises(ValueError, match="disagrees"):
        batch_loss(logp, old, rollout, mask, samples, *cfg, keep=[True] * 5)
    with pytest.raises(ValueError, match="recomputed"):
        batch_loss(logp, None, rollout, mask, samples, *cfg)


@pytest.mark.parametrize("agg", AGGS)
def test_the_loss_computes_on_the_log_probs_device(agg):
    """The batch's metadata (advantages, replay weights, the denominator) is made on the
    CPU; the loss must move it to the log-probs' device. "meta" stands in for a GPU here:
    mixing a CPU tensor into its arithmetic raises as CUDA does, and the first thing meta
    cannot do is read a value out (``bool(keep.all())``), past the loss's arithmetic."""
    cfg = _cfg(agg)
    samples, mask = _batch([3, 7, 1], [0, 1, 0])
    rollout = rollout_logprobs_of(samples)
    logp = rollout + 0.01
    with pytest.raises(RuntimeError) as raised:
        batch_loss(logp.to("meta"), None, rollout.to("meta"), mask.to("meta"), samples, *cfg)
    # before the fix: "Tensor on device cpu is not on the expected device meta!"
    assert "item() cannot be called on meta tensors" in str(raised.value)
