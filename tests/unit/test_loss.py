"""The reweighted policy loss, checked on real gradients of a small torch model."""

import pytest
import torch

from runtime.data.sample import Sample
from runtime.engines.torch.loss import policy_loss, replay_weights


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
            model.logprobs(tokens), behavior, advantages, mask, w, clip_low=0.2, clip_high=0.28
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
    loss, stats = policy_loss(logp, behavior, adv, mask, w, clip_low=0.2, clip_high=0.28)
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


def test_the_cap_bounds_negative_advantage_tokens():
    logp = torch.tensor([[0.0]])
    behavior = torch.tensor([[-5.0]])  # ratio e^5 ~ 148
    adv = torch.tensor([-1.0])
    mask = torch.ones(1, 1)
    w = torch.ones(1)
    free, _ = policy_loss(logp, behavior, adv, mask, w, clip_low=0.2, clip_high=0.28)
    capped, _ = policy_loss(logp, behavior, adv, mask, w, clip_low=0.2, clip_high=0.28, tis_cap=3.0)
    assert float(free) == pytest.approx(float(torch.exp(torch.tensor(5.0))), rel=1e-5)
    assert float(capped) == pytest.approx(3.0)


def _batch(lengths, replay):
    samples = [
        Sample(
            sample_id=i,
            group_id=i,
            prompt_id=i,
            versions=[(0, 0, n)],
            token_ids=[1] * n,
            logprobs=[-1.0] * n,
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


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_data_parallel_shards_add_up_to_the_whole_batch(agg):
    from runtime.config.recipe import build_config
    from runtime.engines.torch.loss import batch_loss

    cfg = build_config({"algorithm": {"loss_agg": agg}, "reflow": {"tau": 0.3}})
    samples, mask = _batch([3, 7, 1, 5, 6], [0, 1, 0, 1, 0])
    torch.manual_seed(1)
    logp = torch.randn(5, 7) * 0.1 - 2
    behavior = logp + torch.randn(5, 7) * 0.05
    whole, st = batch_loss(logp, behavior, mask, samples, cfg)
    parts = [
        batch_loss(logp[idx], behavior[idx], mask[idx], samples, cfg, shard=idx)
        for idx in ([0, 2, 4], [1, 3])
    ]
    assert sum(float(x) for x, _ in parts) == pytest.approx(float(whole), rel=1e-6)
    assert sum(s.clip_fraction for _, s in parts) == pytest.approx(st.clip_fraction, abs=1e-7)


def test_seq_mean_gives_every_sample_the_same_weight_whatever_its_length():
    logp = torch.zeros(2, 8, requires_grad=True)
    behavior = torch.zeros(2, 8)
    _, mask = _batch([2, 8], [0, 0])
    adv = torch.tensor([1.0, 1.0])
    w = replay_weights(torch.zeros(2, dtype=torch.bool), torch.ones(2), 0.5)
    loss, _ = policy_loss(
        logp, behavior, adv, mask, w, clip_low=0.2, clip_high=0.28, agg="seq_mean_token_mean"
    )
    loss.backward()
    per_sample = (logp.grad * mask).sum(1)
    assert per_sample[0] == pytest.approx(per_sample[1].item())  # short = long
    logp.grad = None
    w = replay_weights(torch.zeros(2, dtype=torch.bool), mask.sum(1), 0.5)
    loss, _ = policy_loss(logp, behavior, adv, mask, w, clip_low=0.2, clip_high=0.28)
    loss.backward()
    per_sample = (logp.grad * mask).sum(1)
    assert per_sample[1] == pytest.approx(4 * per_sample[0].item())  # token-mean: 8 vs 2
