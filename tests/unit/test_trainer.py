"""The torch trainer: a real step on a real (tiny) Qwen3, state save/load bit-exact."""

import random

import pytest
import torch
from safetensors.torch import load_file

from runtime.config.recipe import build_config
from runtime.data.sample import Sample
from runtime.embedded.arith import sample_problem
from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    return save_pretrained(build_model(seed=3), build_tokenizer(), path)


def batch(seed: int, n: int = 6) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prob = sample_problem(rng)
        resp = prob.solution_ids()
        out.append(
            Sample(
                sample_id=i,
                group_id=i // 2,
                prompt_id=i // 2,
                versions=[(0, 0, len(resp))],
                prompt_token_ids=prob.prompt_ids(),
                token_ids=resp,
                logprobs=[-3.0] * len(resp),
                n_valid=len(resp),
                reward=0.0,
                advantage=1.0 if i % 2 else -1.0,
                replay_count=int(i % 3 == 0),
            )
        )
    return out


def cfg(**train):
    return build_config({"train": {"lr": 1e-3, **train}, "model": {"path": "x"}})


def params(t: TorchTrainer):
    return {k: v.clone() for k, v in t.model.state_dict().items()}


def test_a_step_changes_the_weights_and_bumps_the_version(model_dir):
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    before = params(t)
    m = t.train_step(batch(0))
    assert t.step == 1 and t.version == 1
    assert m["loss"] == m["loss"] and m["grad_norm"] > 0
    assert any(not torch.equal(before[k], v) for k, v in t.model.state_dict().items())


def test_state_survives_save_and_load_bit_exactly(model_dir, tmp_path):
    a = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    a.train_step(batch(1))
    a.save_state(tmp_path / "state.pt")
    a.train_step(batch(2))
    after_a = params(a)
    b = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    b.load_state(tmp_path / "state.pt")
    assert b.step == 1 and b.version == 1
    b.train_step(batch(2))
    for k, v in params(b).items():
        assert torch.equal(v, after_a[k]), k


def test_published_weights_are_checkpoint_format(model_dir, tmp_path):
    t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
    t.train_step(batch(0))
    folder = t.publish(tmp_path / "weights")
    tensors = load_file(str(folder / "model.safetensors"))
    assert "lm_head.weight" not in tensors  # tied to the embedding, as HF saves it
    assert torch.equal(
        tensors["model.embed_tokens.weight"], t.model.state_dict()["model.embed_tokens.weight"]
    )
    for v in range(2, 5):
        t.version = v
        t.publish(tmp_path / "weights")
    kept = sorted(d.name for d in (tmp_path / "weights").glob("v*"))
    assert kept == ["v3", "v4"]
    assert '"version": 4' in (tmp_path / "weights" / "latest.json").read_text()


def test_environment_tokens_are_masked_out_of_the_loss(model_dir):
    """A multi-turn sample: tokens with loss mask 0 (feedback, tool output) change
    nothing, whatever their behaviour log-probs; the model's tokens do."""

    def multi_turn(env_logprob: float, model_logprob: float = -3.0):
        out = []
        for s in batch(5):
            n = len(s.token_ids)
            mask = [1 if i < n // 2 or i >= n - 2 else 0 for i in range(n)]  # env tokens mid
            s.loss_mask = mask
            s.logprobs = [model_logprob if m else env_logprob for m in mask]
            s.n_valid = sum(mask)
            out.append(s)
        return out

    runs = []
    for env_lp, model_lp in ((0.0, -3.0), (-50.0, -3.0), (0.0, -1.0)):
        t = TorchTrainer(TorchTrainerConfig.from_config(cfg()), str(model_dir))
        runs.append((t.train_step(multi_turn(env_lp, model_lp)), params(t)))
    (m0, p0), (m1, p1), (m2, _) = runs
    assert m0["loss"] == m1["loss"] and all(torch.equal(p0[k], p1[k]) for k in p0)
    assert m0["loss"] != m2["loss"]  # the model's own tokens do count


def test_a_step_takes_mini_batches_optimizer_updates_and_the_version_moves_at_syncs(model_dir):
    # 6 samples in 3 mini-batches: 3 AdamW updates (AdamW counts them per parameter), and
    # with a sync every 2 steps the version stays 0 after step 1 and is 1 after step 2.
    t = TorchTrainer(
        TorchTrainerConfig.from_config(cfg(mini_batches=3, sync_every=2, steps=4, batch_size=6)),
        str(model_dir),
    )
    m = t.train_step(batch(0))
    state = t.opt.state_dict()["state"]
    assert {int(s["step"]) for s in state.values()} == {3}
    assert m["optimizer_updates"] == 3 and (t.step, t.version) == (1, 0)
    t.train_step(batch(1))
    assert (t.step, t.version) == (2, 1)


class FlakyDataParallel:
    """One trainer rank's reductions, whose ``fail_at``-th stats reduction fails as gloo
    does when a peer dies (a plain RuntimeError)."""

    trainer_ranks = [0]

    def __init__(self, fail_at: int = 0) -> None:
        self.fail_at, self.calls = fail_at, 0

    def all_reduce_grads(self, params) -> None:
        pass

    def all_reduce_sum(self, values):
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError("Connection closed by peer")
        return list(values)

    def all_reduce_max(self, values):
        return list(values)


def test_a_step_aborted_after_an_update_is_trained_again_from_the_next_one(model_dir):
    # 2 mini-batches; the second update's reduction fails: the first stays applied and
    # the step, trained again, applies the second only, to the same weights as a step
    # never interrupted (the old policy is the behaviour one: nothing is recomputed)
    config = cfg(mini_batches=2, batch_size=6)
    whole = TorchTrainer(TorchTrainerConfig.from_config(config), str(model_dir))
    whole.train_step(batch(0), FlakyDataParallel())
    t = TorchTrainer(TorchTrainerConfig.from_config(config), str(model_dir))
    with pytest.raises(RuntimeError, match="closed by peer"):
        t.train_step(batch(0), FlakyDataParallel(fail_at=2))
    assert (t.step, t.updates_done) == (0, 1)
    t.abandon_step()
    assert all(p.grad is None for p in t.model.parameters())
    m = t.train_step(batch(0), FlakyDataParallel())
    assert (t.step, t.updates_done) == (1, 0) and m["optimizer_updates"] == 1
    state = t.opt.state_dict()["state"]
    assert {int(s["step"]) for s in state.values()} == {2}  # two AdamW updates in all
    mine, theirs = params(t), params(whole)
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
