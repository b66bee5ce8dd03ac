"""Trainer features against references computed another way, one process, a tiny Qwen3.

Micro-batching, the chunked log-prob head and activation checkpointing must not change the
gradient; a bfloat16 compute dtype must train float32 master weights; the off-policy
correction (recomputed old log-probs, truncated importance sampling, mismatch masking)
must report and apply the mismatch the batch was built with. Plus the config rules these
features rest on (defaults of ``train.strategy``/``param_dtype``, refused keys).
"""

from __future__ import annotations

import functools
import math
import random

import pytest
import torch

from runtime.config.recipe import RecipeError, build_config
from runtime.data.sample import Sample
from runtime.embedded.arith import sample_problem
from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained
from runtime.engines.torch import trainer as trainer_module
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny")
    return str(save_pretrained(build_model(seed=5), build_tokenizer(), path))


def make_cfg(model_dir: str, algorithm: dict | None = None, **train):
    return build_config(
        {
            "model": {"path": model_dir},
            "train": {"lr": 1e-3, "steps": 10, "strategy": "replicate", **train},
            "algorithm": algorithm or {},
            "reflow": {"tau": 0.5},
            "resources": {"device": "cpu"},
        }
    )


def make_samples(seed: int = 1, n: int = 9, advantages=(1.0, -0.5, 0.25)) -> list[Sample]:
    """Fresh and replayed samples of varied lengths (15 to 57 tokens), one with a shorter
    valid prefix and one multi-turn (environment tokens in the middle out of the loss)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prob = sample_problem(rng)
        resp = prob.solution_ids()
        out.append(
            Sample(
                sample_id=i,
                group_id=i,
                prompt_id=i,
                versions=[(0, 0, len(resp))],
                prompt_token_ids=prob.prompt_ids(),
                token_ids=resp,
                logprobs=[-2.5] * len(resp),
                n_valid=len(resp) - (i % 2),
                reward=0.0,
                advantage=advantages[i % len(advantages)],
                replay_count=int(i % 3 == 0),
            )
        )
    s = out[4]
    s.loss_mask = [1] * 3 + [0] * (len(s.token_ids) - 5) + [1] * 2
    s.n_valid = sum(s.loss_mask)
    return out


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: tiny matmuls gain nothing from more, and on a loaded machine
    spinning OpenMP threads make these tests minutes instead of seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def step_grads(t: TorchTrainer, samples):
    """One step with the optimizer update disabled (gradients stay on the parameters and
    the weights do not move): its metrics and the (clipped) gradients."""
    t.opt.step = lambda *a, **k: None  # this trainer is thrown away after the test
    metrics = t.train_step(samples)
    grads = {n: p.grad.detach().clone() for n, p in t.model.named_parameters()}
    return metrics, grads


def assert_same_grads(got: dict, want: dict, atol: float = 1e-7, rtol: float = 0.0) -> None:
    assert got.keys() == want.keys()
    for name, g in want.items():
        torch.testing.assert_close(got[name], g, rtol=rtol, atol=atol, msg=name)


def plan_of(t: TorchTrainer, samples) -> list[list[int]]:
    """The micro-batches a single-rank trainer packs ``samples`` into (one update)."""
    lengths = [len(s.prompt_token_ids) + len(s.token_ids) for s in samples]
    return trainer_module.micro_batches.plan(lengths, 1, t.config.train.micro_batch_tokens)[0]


def own_logprobs(t: TorchTrainer, samples) -> dict[int, torch.Tensor]:
    """The trainer's log-probs of every sample under its current weights, computed as
    ``recompute_old_logprobs`` computes them (its plan, ``_forward``)."""
    return t._old_logprobs(samples, plan_of(t, samples))


# --- 1. micro-batching --------------------------------------------------------------------


@functools.cache
def one_pass(model_dir: str, agg: str):
    """The reference step: the whole batch in one forward/backward."""
    t = TorchTrainer(
        TorchTrainerConfig.from_config(make_cfg(model_dir, {"loss_agg": agg})), model_dir
    )
    assert t.config.train.micro_batch_tokens is None
    return step_grads(t, make_samples())


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
@pytest.mark.parametrize("budget", [8, 40, 64, 10_000])
def test_micro_batches_give_the_gradient_of_one_pass(model_dir, budget, agg):
    samples = make_samples()
    ref, ref_grads = one_pass(model_dir, agg)
    assert ref["micro_steps"] == 1

    t = TorchTrainer(
        TorchTrainerConfig.from_config(
            make_cfg(model_dir, {"loss_agg": agg}, micro_batch_tokens=budget)
        ),
        model_dir,
    )
    plan = plan_of(t, samples)
    m, grads = step_grads(t, samples)
    assert m["micro_steps"] == len(plan)
    if budget < 10_000:
        assert len(plan) > 1  # the budget really splits this batch
    assert sorted(i for mb in plan for i in mb) == list(range(len(samples)))
    assert_same_grads(grads, ref_grads, atol=1e-7)
    for key in ("loss", "clip_fraction", "mean_ratio", "replay_weight_mass", "grad_norm"):
        assert m[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key


# --- 2. the chunked log-prob head ---------------------------------------------------------


def reference_logprobs(model, samples, temperature: float) -> list[torch.Tensor]:
    """log_softmax(logits / T) at each response token, from a plain forward of one
    unpadded row at a time."""
    out = []
    for s in samples:
        ids = torch.tensor([[*s.prompt_token_ids, *s.token_ids]])
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0]
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        n_prompt, resp = len(s.prompt_token_ids), torch.tensor(list(s.token_ids))
        positions = n_prompt - 1 + torch.arange(len(resp))
        out.append(logp[positions, resp])
    return out


def padded_batch(samples):
    seqs = [[*s.prompt_token_ids, *s.token_ids] for s in samples]
    width = max(map(len, seqs))
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
    return ids, attn


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_the_chunked_head_gives_the_full_log_softmax(model_dir, chunk):
    from transformers import AutoModelForCausalLM

    temperature = 0.7
    samples = make_samples(seed=2)
    t = TorchTrainer(
        TorchTrainerConfig.from_config(
            make_cfg(model_dir, {"temperature": temperature}, logprob_chunk_tokens=chunk)
        ),
        model_dir,
    )
    assert t.head.chunk == chunk
    with torch.no_grad():
        got = t._forward(samples)
        # the same model with no request set: its head is the plain linear head, whole
        # padded batch at once
        assert t.head._request is None
        ids, attn = padded_batch(samples)
        full = torch.log_softmax(
            t.model(input_ids=ids, attention_mask=attn).logits / temperature, -1
        )
        # an independent plain HF model on the same weights, one unpadded row at a time
        plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        assert not hasattr(plain.get_output_embeddings(), "targets")
        ref = reference_logprobs(plain, samples, temperature)
    assert got.dtype == torch.float32
    assert got.shape == (len(samples), max(len(s.token_ids) for s in samples))
    for i, s in enumerate(samples):
        n, n_prompt = len(s.token_ids), len(s.prompt_token_ids)
        same_pass = full[i, n_prompt - 1 + torch.arange(n), torch.tensor(list(s.token_ids))]
        torch.testing.assert_close(got[i, :n], same_pass, rtol=0, atol=1e-6)
        torch.testing.assert_close(got[i, :n], ref[i], rtol=0, atol=1e-5)
        assert torch.all(got[i, n:] == 0)  # past the row's end


def test_the_chunked_head_gradient_does_not_depend_on_the_chunk(model_dir):
    samples = make_samples(seed=3)
    # a token mean with random signed weights, like a loss
    shape = (len(samples), max(len(s.token_ids) for s in samples))
    coeff = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    coeff /= sum(len(s.token_ids) for s in samples)

    def grads(chunk: int | None):
        t = TorchTrainer(
            TorchTrainerConfig.from_config(
                make_cfg(model_dir, {"temperature": 0.7}, logprob_chunk_tokens=chunk or 1)
            ),
            model_dir,
        )
        if chunk is None:  # the full log-softmax, differentiated as one graph
            ids, attn = padded_batch(samples)
            logp = torch.log_softmax(t.model(input_ids=ids, attention_mask=attn).logits / 0.7, -1)
            rows = torch.zeros_like(coeff)
            for i, s in enumerate(samples):
                n, n_prompt = len(s.token_ids), len(s.prompt_token_ids)
                pos = n_prompt - 1 + torch.arange(n)
                rows[i, :n] = logp[i, pos, torch.tensor(list(s.token_ids))]
        else:
            rows = t._forward(samples)
        (rows * coeff).sum().backward()
        return {n: p.grad.clone() for n, p in t.model.named_parameters()}

    one, whole, full = grads(1), grads(4096), grads(None)
    assert_same_grads(one, whole, atol=1e-7, rtol=1e-5)
    assert_same_grads(whole, full, atol=1e-7, rtol=1e-5)
    assert any(float(g.abs().max()) > 0 for g in one.values())


# --- 3. activation checkpointing ----------------------------------------------------------


def test_activation_checkpointing_gives_the_same_gradient(model_dir):
    samples = make_samples(seed=4)
    plain = TorchTrainer(
        TorchTrainerConfig.from_config(make_cfg(model_dir, micro_batch_tokens=64)), model_dir
    )
    ckpt = TorchTrainer(
        TorchTrainerConfig.from_config(
            make_cfg(model_dir, micro_batch_tokens=64, activation_checkpointing=True)
        ),
        model_dir,
    )
    assert ckpt.model.is_gradient_checkpointing and not plain.model.is_gradient_checkpointing
    m0, g0 = step_grads(plain, samples)
    m1, g1 = step_grads(ckpt, samples)
    assert_same_grads(g1, g0, atol=1e-7)
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-6, abs=1e-8)
    assert m1["grad_norm"] == pytest.approx(m0["grad_norm"], rel=1e-6)


# --- 4. bfloat16 compute ------------------------------------------------------------------


def test_bfloat16_compute_trains_float32_master_weights_on_cpu(model_dir):
    # positive advantages: the loss is -mean(ratio x A), no cancellation, so its relative
    # difference between the dtypes is meaningful
    samples = make_samples(seed=6, advantages=(1.0, 0.5, 0.25))
    runs = {}
    for dtype in ("float32", "bfloat16"):
        t = TorchTrainer(
            TorchTrainerConfig.from_config(
                make_cfg(model_dir, param_dtype=dtype, micro_batch_tokens=64)
            ),
            model_dir,
        )
        assert t.config.train.param_dtype == dtype and t.param_dtype == getattr(torch, dtype)
        before = {n: p.detach().clone() for n, p in t.model.named_parameters()}
        m = t.train_step(samples)
        runs[dtype] = m
        assert math.isfinite(m["loss"])
        assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
        for n, p in t.model.named_parameters():
            assert p.dtype == torch.float32, n  # master weights
            assert p.grad is not None and p.grad.dtype == torch.float32, n
        assert any(not torch.equal(before[n], p) for n, p in t.model.named_parameters())
        with torch.no_grad():
            assert t._forward(samples[:2]).dtype == torch.float32
    assert runs["bfloat16"]["loss"] == pytest.approx(runs["float32"]["loss"], rel=5e-2)
    assert runs["bfloat16"]["grad_norm"] == pytest.approx(runs["float32"]["grad_norm"], rel=0.2)


# --- 5. off-policy correction -------------------------------------------------------------


def rollout_shifted(t: TorchTrainer, samples, d) -> None:
    """Set each sample's rollout log-probs to the trainer's own minus ``d`` per token (a
    number, or one per sample): ``log rho = old - rollout = d``."""
    own = own_logprobs(t, samples)
    shifts = d if isinstance(d, (list, tuple)) else [d] * len(samples)
    for i, s in enumerate(samples):
        s.logprobs = (own[i] - shifts[i]).tolist()


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_recomputed_old_logprobs_measure_and_truncate_a_known_mismatch(model_dir, agg):
    d = 0.1
    rho = math.exp(d)
    loss = {}
    for cap in (None, 2.0, 1.05):
        alg = {"recompute_old_logprobs": True, "tis_cap": cap, "loss_agg": agg}
        t = TorchTrainer(
            TorchTrainerConfig.from_config(make_cfg(model_dir, alg, micro_batch_tokens=40)),
            model_dir,
        )
        samples = make_samples(seed=7)
        rollout_shifted(t, samples, d)
        m = t.train_step(samples)
        loss[cap] = m["loss"]
        for key in ("is_ratio_mean", "is_ratio_min", "is_ratio_max"):
            assert m[key] == pytest.approx(rho, rel=1e-4), key
        assert m["mismatch_k3"] == pytest.approx(rho - 1 - d, rel=1e-4)
        assert m["masked_share"] == 0
        # the PPO ratio is against the recomputed old log-probs: 1 on the first update
        assert m["mean_ratio"] == pytest.approx(1.0, rel=1e-5)
        assert m["clip_fraction"] == 0
        if cap == 2.0:
            assert m["truncated_share"] == 0
        elif cap == 1.05:
            assert m["truncated_share"] == pytest.approx(1.0)
    # every token's loss is weighted by min(rho, cap)
    assert loss[2.0] == pytest.approx(rho * loss[None], rel=1e-5)
    assert loss[1.05] == pytest.approx(1.05 * loss[None], rel=1e-5)


def test_recompute_with_no_mismatch_is_the_plain_objective(model_dir):
    """Rollout log-probs equal to the trainer's (d = 0): old == rollout, so recomputing
    changes neither the loss nor the gradient."""
    runs = []
    for recompute in (False, True):
        alg = {"recompute_old_logprobs": recompute}
        t = TorchTrainer(
            TorchTrainerConfig.from_config(make_cfg(model_dir, alg, micro_batch_tokens=40)),
            model_dir,
        )
        samples = make_samples(seed=8)
        rollout_shifted(t, samples, 0.0)
        runs.append(step_grads(t, samples))
    (m0, g0), (m1, g1) = runs
    assert m1["loss"] == pytest.approx(m0["loss"], rel=1e-6, abs=1e-9)
    assert_same_grads(g1, g0, atol=1e-7)
    assert m1["is_ratio_mean"] == pytest.approx(1.0, abs=1e-6)
    assert m1["mismatch_k3"] == pytest.approx(0.0, abs=1e-9)
    assert any(float(g.abs().max()) > 0 for g in g1.values())


def test_mismatch_mask_drops_the_mismatched_samples_entirely(model_dir):
    """Samples shifted by d = 0.2 (geometric-mean ratio e^0.2 > 1.1) are masked; the rest
    (d = 0) kept: the loss and gradient are those of the batch without the masked ones."""
    samples = make_samples(seed=9)
    shifts = [0.2 if i % 3 == 1 else 0.0 for i in range(len(samples))]
    alg = {"recompute_old_logprobs": True, "mismatch_mask": 1.1}
    t = TorchTrainer(
        TorchTrainerConfig.from_config(make_cfg(model_dir, alg, micro_batch_tokens=40)), model_dir
    )
    rollout_shifted(t, samples, shifts)
    m, grads = step_grads(t, samples)
    masked_tokens = sum(s.n_valid for s, x in zip(samples, shifts, strict=True) if x)
    total = sum(s.n_valid for s in samples)
    assert m["masked_share"] == pytest.approx(masked_tokens / total)

    kept = [s for s, x in zip(samples, shifts, strict=True) if not x]
    alg_kept = {"recompute_old_logprobs": True}
    t_kept = TorchTrainer(
        TorchTrainerConfig.from_config(make_cfg(model_dir, alg_kept, micro_batch_tokens=40)),
        model_dir,
    )
    m_kept, grads_kept = step_grads(t_kept, kept)
    assert m["loss"] == pytest.approx(m_kept["loss"], rel=1e-5)
    assert_same_grads(grads, grads_kept, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize(("name", "value"), [("tis_cap", 2.0), ("mismatch_mask", 1.5)])
def test_mismatch_correction_without_recompute_is_refused(name, value):
    with pytest.raises(RecipeError) as info:
        build_config({"algorithm": {name: value}})
    msg = str(info.value)
    assert f"algorithm.{name}: needs algorithm.recompute_old_logprobs: true" in msg
    assert "\n" not in msg
    cfg = build_config({"algorithm": {name: value, "recompute_old_logprobs": True}})
    assert getattr(cfg.algorithm, name) == value


# --- 6. and 7. config rules ---------------------------------------------------------------


def test_kl_coef_is_refused_as_an_unknown_key():
    with pytest.raises(RecipeError) as info:
        build_config({"algorithm": {"kl_coef": 0.01}})
    msg = str(info.value)
    assert msg.startswith("<recipe>: algorithm.kl_coef: unknown key (allowed here: ")
    assert "kl_coef" not in msg.split("allowed here:", 1)[1]
    assert "\n" not in msg


def test_strategy_defaults_to_replicate_for_the_tiny_models_else_fsdp2(tmp_path):
    assert build_config({}).train.strategy == "replicate"  # embedded:tiny-qwen3
    assert build_config({"model": {"path": "embedded:tiny-qwen3"}}).train.strategy == "replicate"
    folder = {"model": {"path": str(tmp_path)}}
    assert build_config(folder).train.strategy == "fsdp2"
    assert build_config({**folder, "train": {"strategy": "replicate"}}).train.strategy == (
        "replicate"
    )
    assert build_config({"train": {"strategy": "fsdp2"}}).train.strategy == "fsdp2"


def test_param_dtype_defaults_by_device():
    def dtype(device: str, **train) -> str:
        return build_config({"resources": {"device": device}, "train": train}).train.param_dtype

    assert dtype("cpu") == "float32"
    assert dtype("cuda") == "bfloat16"  # config only: nothing runs on CUDA here
    assert dtype("cuda", param_dtype="float32") == "float32"
    assert dtype("cpu", param_dtype="bfloat16") == "bfloat16"


# --- 5. offload on a role switch ----------------------------------------------------------


def training_snapshot(t: TorchTrainer) -> list[torch.Tensor]:
    from runtime.engines.torch.shard_handoff import training_tensors

    return [x.detach().clone() for x in training_tensors(t.model, t.opt)]


def test_the_trainer_side_offloads_on_deactivate_and_restores_on_activate(model_dir, tmp_path):
    """The state machine on the CPU, where the bytes already are in host memory: gradients
    dropped, steps refused while offloaded, values unchanged, the timings recorded."""
    from runtime.engines.torch.trainer_side import SWITCH_KEYS, TorchTrainerSide
    from runtime.store.run_dir import RunPaths

    side = TorchTrainerSide(make_cfg(model_dir), 0, RunPaths(tmp_path), None)
    torch.set_num_threads(1)  # the side sets resources.torch_threads
    side.trainer.train_step(make_samples())
    before = training_snapshot(side.trainer)
    assert side.offload_state == "on_device"
    assert any(p.grad is not None for p in side.trainer.model.parameters())

    side.deactivate()
    assert side.offload_state == "offloaded" and not side.active
    assert all(p.grad is None for p in side.trainer.model.parameters())
    assert set(side.last_switch) == set(SWITCH_KEYS)
    assert side.last_switch["offload_bytes"] == 0  # nothing to move off a CPU
    with pytest.raises(RuntimeError, match="offloaded"):
        side.trainer.train_step(make_samples())

    side.activate()
    assert side.offload_state == "on_device" and side.active
    assert side.last_switch["offload_s"] == 0  # a fresh record for the activation
    after = training_snapshot(side.trainer)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    side.trainer.train_step(make_samples())  # and it trains on
    assert side.trainer.step == 2


def test_an_offload_that_moves_the_bytes_frees_the_storage_and_restores_it_exactly(model_dir):
    """``move=True`` runs the GPU path's copy and resize on the CPU: every storage of the
    model and AdamW shrinks to nothing, comes back bit-exact, and the next step equals a
    step of a twin trainer that was never offloaded."""
    cfg = make_cfg(model_dir)
    t, twin = (
        TorchTrainer(TorchTrainerConfig.from_config(cfg), model_dir),
        TorchTrainer(TorchTrainerConfig.from_config(cfg), model_dir),
    )
    with pytest.raises(RuntimeError, match="cannot be resized"):
        t.offload(move=True)  # on the CPU the checkpoint's tensors are memory-mapped
    assert t.offload_state == "on_device"  # refused before anything moved
    # On CUDA ``model.to(device)`` gives each parameter an allocation of its own; here
    # they get one the same way, by a copy.
    with torch.no_grad():
        for p in t.model.parameters():
            p.data = p.data.clone()
    for x in (t, twin):
        x.train_step(make_samples(1))
    before = training_snapshot(t)
    moved = t.offload(move=True)
    assert t.offload_state == "offloaded"
    params = sum(p.numel() * p.element_size() for p in t.model.parameters())
    assert moved.bytes >= 3 * params  # parameters and both AdamW moments (and buffers)
    assert all(p.untyped_storage().nbytes() == 0 for p in t.model.parameters())
    assert all(s["exp_avg"].untyped_storage().nbytes() == 0 for s in t.opt.state.values())
    assert t.reload().bytes == moved.bytes
    after = training_snapshot(t)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
    t.train_step(make_samples(2))
    twin.train_step(make_samples(2))
    for a, b in zip(training_snapshot(t), training_snapshot(twin), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="on_device"):
        t.reload()


# --- a mixture of experts' router loss ----------------------------------------------------


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    from runtime.embedded.tiny_qwen3 import build_moe_model

    path = tmp_path_factory.mktemp("tiny-moe")
    return str(save_pretrained(build_moe_model(seed=5), build_tokenizer(), path))


def test_the_router_loss_adds_its_coefficient_times_the_models_own(moe_dir, monkeypatch):
    """``algorithm.router_aux_loss_coef``: the gradient is the policy loss's plus the
    coefficient times that of transformers' load-balancing loss over the same padded
    batch (gradients unclipped here, so they add), and the metric is that loss."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda params, norm: torch.tensor(0.0))
    samples, coef = make_samples(), 0.5
    grads = {}
    for c in (0.0, coef):
        cfg = make_cfg(moe_dir, {"router_aux_loss_coef": c})
        metrics, grads[c] = step_grads(
            TorchTrainer(TorchTrainerConfig.from_config(cfg), moe_dir), samples
        )
        assert ("router_aux_loss" in metrics) is (c > 0)
    plain = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32)
    ids, attn = padded_batch(samples)
    aux = plain(input_ids=ids, attention_mask=attn, output_router_logits=True).aux_loss
    aux.backward()
    assert metrics["router_aux_loss"] == pytest.approx(float(aux), rel=1e-5)
    hf = dict(plain.named_parameters())
    moved = 0
    for name, g in grads[coef].items():
        g_aux = hf[name].grad if hf[name].grad is not None else torch.zeros_like(g)
        torch.testing.assert_close(g, grads[0.0][name] + coef * g_aux, rtol=1e-4, atol=1e-6)
        moved += int(g_aux.abs().max() > 0)
    assert moved >= 3  # the routers and the experts below them


def test_a_router_loss_on_a_dense_model_is_refused(model_dir):
    with pytest.raises(RecipeError, match=r"algorithm.router_aux_loss_coef.*dense model"):
        make_cfg(model_dir, {"router_aux_loss_coef": 0.01})
