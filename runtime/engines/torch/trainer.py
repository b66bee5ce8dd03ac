"""The trainer engine: a Hugging Face causal LM trained with the ReFlow loss in torch.

One training step per batch, in ``train.mini_batches`` optimizer updates (verl's PPO
mini-batches), each read top to bottom in :meth:`TorchTrainer._update`: take this
replica's shard of the mini-batch, teacher-force prompt + response, take the log-probs of
the response tokens, weight replay samples by ``tau`` (normalised over the mini-batch),
clipped surrogate against the behaviour log-probs stored with each sample, backward, sum
gradients over the trainer replicas, clip, AdamW. The policy version moves on at sync
points only (``TrainConfig.version_at``): it names the weights rollout generates with.

Data parallelism: every trainer rank gets the whole batch from rank 0 and trains on rows
``i, i + n, ...`` (``i`` its index among the ``n`` trainer ranks); each shard's loss is
normalised by the whole batch, so summing gradients over the trainer group
(:meth:`Collective.all_reduce_grads`, gloo here, NCCL on GPU) gives every replica the whole
batch's gradient and the replicas stay identical. FSDP2 sharding is not used: the models
this runs on CPU fit one rank, and the plain all-reduce is what DDP does without overlap.

Weight sync: at each sync point rank 0 tells the leader and the rollout ranks
(``WeightSync``), and the leader broadcasts the new weights to them over the sync group in
fixed-size buckets. When a layout change adds trainer ranks, they receive the leader's
model and optimizer state over the trainer group (never from disk).
"""

from __future__ import annotations

import logging
import os
import random
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from runtime.config.layout import LayoutChange
from runtime.config.schema import Config
from runtime.data.sample import Sample
from runtime.engines.torch.loss import batch_loss
from runtime.rank.collective import Collective
from runtime.rank.sides import BatchConsumer
from runtime.store.run_dir import RunPaths, write_json_atomic
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.workloads.kinds import workload_kind

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

    def train_step(
        self,
        samples: Sequence[Sample],
        collective: Collective | None = None,
        shard_index: int = 0,
        shard_count: int = 1,
    ) -> dict[str, float]:
        """One batch in ``train.mini_batches`` optimizer updates; the metrics are their means."""
        start = time.perf_counter()
        k = self.cfg.train.mini_batches
        # Strided, not contiguous: the batch comes fresh samples first, replayed last, and
        # every update should see both, as a shuffled split would.
        updates = [
            self._update(samples[j::k], collective, shard_index, shard_count) for j in range(k)
        ]
        self.step += 1
        self.version = self.cfg.train.version_at(self.step)
        out = {key: sum(u[key] for u in updates) / k for key in updates[0]}
        out["optimizer_updates"] = float(k)
        out["step_time_s"] = time.perf_counter() - start
        return out

    def _update(
        self,
        samples: Sequence[Sample],
        collective: Collective | None,
        shard_index: int,
        shard_count: int,
    ) -> dict[str, float]:
        """One optimizer update on ``samples`` (a mini-batch), sharded over the replicas."""
        temperature = self.cfg.algorithm.temperature
        # 1. This replica's rows of the batch.
        shard = list(range(shard_index, len(samples), shard_count))
        mine = [samples[i] for i in shard]
        self.opt.zero_grad()
        stats = [0.0, 0.0, 0.0]
        if mine:
            # 2. Pack prompt + response, right-padded.
            seqs = [[*s.prompt_token_ids, *s.token_ids] for s in mine]
            width = max(map(len, seqs))
            ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
            attn = torch.zeros(len(seqs), width, dtype=torch.long)
            for i, seq in enumerate(seqs):
                ids[i, : len(seq)] = torch.tensor(seq)
                attn[i, : len(seq)] = 1
            # 3. Response positions: token t is predicted at position t-1.
            resp_len = max(len(s.token_ids) for s in mine)
            behavior = torch.zeros(len(mine), resp_len)
            mask = torch.zeros(len(mine), resp_len)
            logits = self.model(input_ids=ids, attention_mask=attn).logits / temperature
            logprobs_all = torch.log_softmax(logits.float(), dim=-1)
            rows = []
            for i, s in enumerate(mine):
                n_prompt, n_resp = len(s.prompt_token_ids), len(s.token_ids)
                pos = torch.arange(n_prompt - 1, n_prompt - 1 + n_resp)
                tok = torch.tensor(s.token_ids)
                rows.append((n_resp, logprobs_all[i, pos, tok]))
                behavior[i, :n_resp] = torch.tensor(s.logprobs)
                if s.loss_mask is not None:  # multi-turn: environment tokens are 0
                    mask[i, :n_resp] = torch.tensor(s.loss_mask, dtype=mask.dtype)
                else:
                    mask[i, : s.n_valid] = 1
            logp = torch.stack([torch.nn.functional.pad(r, (0, resp_len - n)) for n, r in rows])
            # 4. Replay weights and the clipped surrogate (runtime/engines/torch/loss.py),
            # normalised by the whole mini-batch so the shards' losses add up to its loss.
            loss, st = batch_loss(logp, behavior, mask, samples, self.cfg, shard=shard)
            loss.backward()
            stats = [st.loss, st.clip_fraction, st.mean_ratio]
        # 5. Sum gradients over the replicas (a replica with no rows adds zeros), update.
        for param in self.model.parameters():
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        if collective is not None:
            collective.all_reduce_grads(self.model.parameters())
            stats = collective.all_reduce_sum(stats)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        return {
            "loss": stats[0],
            "clip_fraction": stats[1],
            "mean_ratio": stats[2],
            "grad_norm": float(grad_norm),
        }

    def checksum(self) -> float:
        """A cheap fingerprint of the weights, to check that replicas agree."""
        with torch.no_grad():
            return float(sum(p.double().sum() for p in self.model.parameters()))

    def training_state(self) -> list[torch.Tensor]:
        """Model and AdamW tensors in a fixed order, for a new replica to receive in place.

        Missing optimizer state (a replica that never stepped) is created as AdamW would,
        so sender and receivers list the same tensors.
        """
        out: list[torch.Tensor] = []
        for param in self.model.parameters():
            state = self.opt.state[param]
            if not state:
                state["step"] = torch.tensor(0.0)
                state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
            out += [param.data, state["exp_avg"], state["exp_avg_sq"], state["step"].view(1)]
        return out

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
        """Write this version as ``<weights_dir>/v<N>/model.safetensors`` (atomic)."""
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
        from runtime.store.checkpoint import load_trainer_state

        state = load_trainer_state(path)  # weights_only: a file that runs code is refused
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.step, self.version = state["step"], state["version"]
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])


class TorchTrainerSide(BatchConsumer):
    name = "trainer"

    def __init__(
        self, cfg: Config, rank: int, paths: RunPaths, collective: Collective | None = None
    ) -> None:
        from runtime.embedded.resolve import resolve_model_path

        super().__init__(cfg, rank)
        torch.set_num_threads(cfg.resources.torch_threads)
        self.cfg: Config = cfg
        self.paths = paths
        self.collective = collective
        self.trainer = TorchTrainer(cfg, resolve_model_path(cfg))
        self._eval_start: float | None = None
        self._last_sync_s: float | None = None

    def save_checkpoint(self, path: Path, step: int) -> None:
        """Rank 0 asked for checkpoint ``step``: model, AdamW, RNG, step and version."""
        if self.trainer.step != step:
            raise RuntimeError(f"asked for step {step}, the trainer is at {self.trainer.step}")
        self.trainer.save_state(path)

    def restore(self, folder: Path) -> None:
        from runtime.store.checkpoint import TRAINER_FILE

        self.trainer.load_state(folder / TRAINER_FILE)
        log.info("trainer state restored: step %d, v%d", self.trainer.step, self.trainer.version)

    def observe(self, step: int, policy_version: int) -> None:
        self.trainer.step = max(self.trainer.step, step)
        self.trainer.version = max(self.trainer.version, policy_version)

    def before_request(self) -> None:
        if self._eval_start is None and workload_kind(self.cfg.workload.kind).trainer_eval:
            self._eval_start = self.evaluate()
            log.info("eval reward at start: %.3f", self._eval_start)

    def evaluate(self) -> float:
        from runtime.embedded.warm_start import greedy_accuracy

        self.trainer.model.eval()
        try:
            return greedy_accuracy(
                self.trainer.model, max_new=self.cfg.workload.max_response_tokens
            )
        finally:
            self.trainer.model.train()

    def on_message(self, msg: p.Message) -> None:
        if isinstance(msg, p.WeightSync):
            self._send_weights(msg)
        else:
            super().on_message(msg)

    def train_batch(self, msg: p.Batch) -> None:
        c = self.collective
        if c is None and not self.leader:
            return  # no process group (an engine pair without one): the leader trains alone
        index, count = 0, 1
        if c is not None and self.rank in c.trainer_ranks:
            index, count = c.trainer_ranks.index(self.rank), len(c.trainer_ranks)
        metrics = self.trainer.train_step(wire.batch(msg).samples, c, index, count)
        t = self.trainer
        metrics["trainer_replicas"] = count
        if c is not None:
            metrics["replica_spread"] = c.replica_spread(t.checksum())
        if not self.leader:
            return  # the leader reports the step for the whole trainer group
        if self._last_sync_s is not None:
            metrics["weight_sync_s"] = self._last_sync_s
        if t.step == 1 and self._eval_start is not None:
            metrics["eval_reward_start"] = self._eval_start
        if t.step >= self.cfg.train.steps:
            t.publish(self.paths.root / "weights")  # the run's final policy
            if workload_kind(self.cfg.workload.kind).trainer_eval:
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

    def _send_weights(self, msg: p.WeightSync) -> None:
        """Rank 0 said go: broadcast this version to the rollout ranks (they were told too)."""
        if not self.leader or self.collective is None:
            return
        if msg.policy_version != self.trainer.version:
            log.warning(
                "weight sync for v%d but the trainer is at v%d",
                msg.policy_version,
                self.trainer.version,
            )
        self._broadcast_weights()
        log.debug("weights v%d broadcast in %.3f s", self.trainer.version, self._last_sync_s)

    def _broadcast_weights(self) -> None:
        assert self.collective is not None
        self._last_sync_s = self.collective.send_weights(
            self.trainer.version, self.trainer.export_weights()
        )

    def on_layout(self, change: LayoutChange) -> None:
        """After a role switch: new trainer replicas get the leader's training state, and
        new rollout ranks the leader's current weights (both by broadcast)."""
        c = self.collective
        if c is None:
            return
        if self.rank in change.ranks("trainer") and change.joined("trainer"):
            start = time.perf_counter()
            step = torch.tensor([self.trainer.step, self.trainer.version], dtype=torch.int64)
            c.broadcast_tensors([step, *self.trainer.training_state()], group=c.trainer_group)
            self.trainer.step, self.trainer.version = (int(x) for x in step)
            log.info(
                "trainer state v%d %s rank 0 in %.3f s",
                self.trainer.version,
                "sent from" if self.leader else "received from",
                time.perf_counter() - start,
            )
        if self.leader and change.joined("rollout"):
            self._broadcast_weights()
