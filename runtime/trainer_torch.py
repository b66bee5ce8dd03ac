"""The trainer engine: a Hugging Face causal LM trained with the ReFlow loss in torch.

One optimisation step per batch, read top to bottom in :meth:`TorchTrainerSide.train_step`:
teacher-force prompt + response, take the log-probs of the response tokens, weight replay
samples by ``tau`` (normalised), clipped surrogate against the behaviour log-probs stored
with each sample, backward, clip, AdamW. Every ``sync_every`` steps the new weights are
published for the rollout ranks (``<run>/weights/v<N>/model.safetensors`` then
``latest.json``, both atomic).

This version trains with one replica (rank 0, the first rank of the trainer pool); other
trainer ranks stay idle. Data parallelism across trainer replicas (gloo on CPU, FSDP2 over
NCCL on GPU) is not built yet.
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from runtime import protocol as p
from runtime import wire
from runtime.config import Config
from runtime.loss import batch_loss
from runtime.roles import BatchConsumer
from runtime.run_dir import RunPaths, write_json_atomic

log = logging.getLogger(__name__)
PAD = 0


class TorchTrainer:
    """Model, optimiser and step counter; no I/O except weight publishing and state files."""

    def __init__(self, cfg: Config, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(cfg.train.seed)
        self.cfg = cfg
        dtype = getattr(torch, cfg.model.dtype)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=cfg.train.lr, weight_decay=0.0)
        self.step = 0
        self.version = 0

    def train_step(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        start = time.perf_counter()
        temperature = self.cfg.algorithm.temperature
        # 1. Pack prompt + response, right-padded.
        seqs = [s["extra"]["prompt_ids"] + s["token_ids"] for s in samples]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
        attn = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
        # 2. Response positions: token t is predicted at position t-1.
        resp_len = max(len(s["token_ids"]) for s in samples)
        behavior = torch.zeros(len(samples), resp_len)
        mask = torch.zeros(len(samples), resp_len)
        logits = self.model(input_ids=ids, attention_mask=attn).logits / temperature
        logprobs_all = torch.log_softmax(logits.float(), dim=-1)
        rows = []
        for i, s in enumerate(samples):
            n_prompt, n_resp = len(s["extra"]["prompt_ids"]), len(s["token_ids"])
            pos = torch.arange(n_prompt - 1, n_prompt - 1 + n_resp)
            tok = torch.tensor(s["token_ids"])
            rows.append((i, n_resp, logprobs_all[i, pos, tok]))
            behavior[i, :n_resp] = torch.tensor(s["logprobs"])
            mask[i, : s["n_valid"]] = 1
        logp = torch.stack([torch.nn.functional.pad(r, (0, resp_len - n)) for _, n, r in rows])
        # 3. Replay weights and the clipped surrogate (runtime/loss.py).
        loss, stats = batch_loss(logp, behavior, mask, samples, self.cfg)
        # 4. Update.
        self.opt.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.version += 1
        return {
            "loss": stats.loss,
            "clip_fraction": stats.clip_fraction,
            "mean_ratio": stats.mean_ratio,
            "grad_norm": float(grad_norm),
            "step_time_s": time.perf_counter() - start,
        }

    # --- weights and state -------------------------------------------------------------

    def export_weights(self) -> dict[str, torch.Tensor]:
        """Checkpoint-format tensors; a tied ``lm_head`` is left out as HF does."""
        state = self.model.state_dict()
        tied = getattr(self.model.config, "tie_word_embeddings", False)
        return {
            k: v.detach().contiguous().clone()
            for k, v in state.items()
            if not (tied and k == "lm_head.weight")
        }

    def publish(self, weights_dir: Path, keep: int = 2) -> Path:
        from safetensors.torch import save_file

        weights_dir.mkdir(exist_ok=True)
        final = weights_dir / f"v{self.version}"
        tmp = weights_dir / f".v{self.version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file(self.export_weights(), str(tmp / "model.safetensors"))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        write_json_atomic(weights_dir / "latest.json", {"version": self.version, "dir": final.name})
        versions = sorted(
            (int(d.name[1:]) for d in weights_dir.glob("v*") if d.name[1:].isdigit()),
        )
        for v in versions[:-keep] if len(versions) > keep else []:
            shutil.rmtree(weights_dir / f"v{v}", ignore_errors=True)
        return final

    def save_state(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "step": self.step,
                "version": self.version,
                "torch_rng": torch.get_rng_state(),
                "python_rng": random.getstate(),
            },
            tmp,
        )
        os.replace(tmp, path)

    def load_state(self, path: Path) -> None:
        state = torch.load(path, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.version = state["step"], state["version"]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])


class TorchTrainerSide(BatchConsumer):
    name = "trainer"

    def __init__(self, cfg: Config, rank: int, paths: RunPaths) -> None:
        from runtime.model.resolve import resolve_model_path

        super().__init__(cfg, rank)
        torch.set_num_threads(cfg.resources.torch_threads)
        self.cfg: Config = cfg
        self.paths = paths
        self.trainer = TorchTrainer(cfg, resolve_model_path(cfg))
        self._eval_start: float | None = None

    def observe(self, step: int, policy_version: int) -> None:
        self.trainer.step = max(self.trainer.step, step)
        self.trainer.version = max(self.trainer.version, policy_version)

    def before_request(self) -> None:
        if self._eval_start is None and self.cfg.workload.kind == "arith":
            self._eval_start = self.evaluate()
            log.info("eval reward at start: %.3f", self._eval_start)

    def evaluate(self) -> float:
        from runtime.model.warm_start import greedy_accuracy

        self.trainer.model.eval()
        try:
            return greedy_accuracy(
                self.trainer.model, max_new=self.cfg.workload.max_response_tokens
            )
        finally:
            self.trainer.model.train()

    def train_batch(self, msg: p.Batch) -> None:
        metrics = self.trainer.train_step(wire.batch_samples(msg))
        t = self.trainer
        if t.version % self.cfg.train.sync_every == 0:
            start = time.perf_counter()
            t.publish(self.paths.root / "weights")
            metrics["publish_s"] = time.perf_counter() - start
        if t.step == 1 and self._eval_start is not None:
            metrics["eval_reward_start"] = self._eval_start
        if t.step >= self.cfg.train.steps and self.cfg.workload.kind == "arith":
            metrics["eval_reward_end"] = self.evaluate()
        self._send(
            p.StepDone(
                rank=self.rank,
                step=t.step,
                policy_version=t.version,
                batch_id=msg.batch_id,
                metrics={k: float(v) for k, v in metrics.items()},
            )
        )
