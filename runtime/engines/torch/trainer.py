"""The trainer engine: a Hugging Face causal LM trained with the ReFlow loss in torch.

One training step per batch, in ``train.mini_batches`` optimizer updates (verl's PPO
mini-batches), each read top to bottom in :meth:`TorchTrainer._update`: this rank's
micro-batches of the mini-batch (runtime/data/micro_batches.py), teacher-forced log-probs
of the response tokens (runtime/engines/torch/logprobs.py), the loss with replay weights
and off-policy correction (runtime/engines/torch/loss.py), backward, gradients summed over
the trainer ranks, clip, AdamW. The policy version moves on at sync points only
(``TrainConfig.version_at``): it names the weights rollout generates with.

Data parallelism: rank 0 sends each trainer rank the samples its plan gives it; each
rank's loss is normalised by the whole mini-batch, so the sum of the ranks' gradients is
the mini-batch's. ``train.strategy: fsdp2`` shards the model within replica groups and
replicates it across them (runtime/engines/torch/parallelize.py); ``replicate`` keeps a
copy per rank and all-reduces gradients (runtime/rank/gradients.py). The same code runs
over gloo on CPU and NCCL on CUDA. docs/trainer.md has the whole picture.

While its rank plays rollout, the trainer's state sits in host memory
(:meth:`TorchTrainer.offload` / :meth:`TorchTrainer.reload`,
runtime/engines/torch/offload.py); :attr:`TorchTrainer.offload_state` says where it is.
Its weights and state (gathered, published, checkpointed) are
runtime/engines/torch/trainer_weights.py's.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from runtime.data import micro_batches
from runtime.data.micro_batches import UpdatePlan
from runtime.data.sample import Sample
from runtime.engines.torch import logprobs
from runtime.engines.torch.lora import adapter_dropout_off, apply_lora, trainable
from runtime.engines.torch.loss import (
    LossStats,
    Normaliser,
    batch_loss,
    mismatch_keep,
    rollout_logprobs_of,
)
from runtime.engines.torch.offload import OffloadRecord, TrainerResidency
from runtime.engines.torch.parallelize import (
    apply_fsdp,
    compute_precision,
    enable_activation_checkpointing,
    full_norm,
    trainer_device,
)
from runtime.engines.torch.route_replay import RouteReplay, freeze_routers
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer_weights import TrainerWeights
from runtime.rank.gradients import DataParallel
from runtime.rank.trainer_mesh import TrainerMesh

log = logging.getLogger(__name__)
PAD = 0


class TorchTrainer(TrainerWeights):
    """Model, optimiser and step counter; no I/O except weight publishing and state files."""

    def __init__(
        self,
        config: TorchTrainerConfig,
        model_path: str,
        rank: int = 0,
        mesh: TrainerMesh | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(config.train.seed)
        self.config = config
        self.model_path = model_path
        self.step = 0
        self.version = 0
        # updates of the step under way already applied: a step aborted by a lost trainer
        # rank is trained again from there (the replicas agree on it: the leader's group
        # sends its count with its state, runtime/engines/torch/trainer_side.py)
        self.updates_done = 0
        self.sharded = config.train.strategy == "fsdp2" and mesh is not None
        # FSDP2's mesh, whose groups this model is built over (None: a replicated model)
        self.mesh = mesh if self.sharded else None
        # on the device or in host memory, for the role this rank is not playing
        self.residency = TrainerResidency(config.model.lora.enabled)
        if self.mesh is not None and not self.mesh.member:
            # not a trainer rank now: a sharded model is built when it becomes one
            self.model: Any = None
            self.opt: Any = None
            self.routes = None
            return
        self.device = trainer_device(config.resources, rank)
        default = "bfloat16" if self.device.type == "cuda" else "float32"  # device: auto
        self.param_dtype = getattr(torch, config.train.param_dtype or default)
        # master weights in float32 whatever the checkpoint's dtype: AdamW on bf16 weights
        # loses updates smaller than their precision
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        if config.model.lora.enabled:  # the base frozen in the compute dtype, adapters float32
            apply_lora(model, config.model.lora, self.param_dtype)
        # routing replay (R3): a MoE's routers take the rollout policy's routes
        replay = config.algorithm.routing_replay == "rollout"
        self.routes = RouteReplay(model) if replay else None
        if config.algorithm.freeze_router:  # before AdamW and FSDP2 see the parameters
            freeze_routers(model)
        self.head = logprobs.install(model, config.train.logprob_chunk_tokens)
        if config.train.activation_checkpointing:
            enable_activation_checkpointing(model)
        if self.mesh is not None:
            apply_fsdp(model, self.mesh.device_mesh(self.device.type), self.param_dtype)
        else:
            model.to(self.device)
        self.model = model
        self.model.train()
        self.opt = torch.optim.AdamW(trainable(self.model), lr=config.train.lr, weight_decay=0.0)

    def train_step(
        self,
        samples: Sequence[Sample],
        data_parallel: DataParallel | None = None,
        shard_index: int = 0,
        shard_count: int = 1,
    ) -> dict[str, float]:
        """One step on a whole batch in hand (one process, a test, a benchmark): this rank's
        part of the plan rank 0 makes (:func:`runtime.data.micro_batches.rank_plans`)."""
        t = self.config.train
        plans = micro_batches.sample_plans(
            samples, t.mini_batches, shard_count, t.micro_batch_tokens
        )
        part = plans[shard_index]
        mine = [samples[i] for i in part.batch_positions]
        return self.train_part(mine, part.updates, data_parallel, shard_count)

    def train_part(
        self,
        samples: Sequence[Sample],
        updates: Sequence[UpdatePlan],
        data_parallel: DataParallel | None = None,
        shard_count: int = 1,
    ) -> dict[str, float]:
        """One step in ``train.mini_batches`` optimizer updates, as rank 0 planned this
        rank's part (``samples``, carried update by update); the metrics are their means."""
        if self.offload_state != "on_device":
            raise RuntimeError(f"a training step with the trainer state {self.offload_state}")
        if len(updates) != self.config.train.mini_batches:
            raise ValueError(f"{len(updates)} updates, not train.mini_batches")
        try:
            return self._train_updates(samples, updates, data_parallel, shard_count)
        finally:
            if self.routes is not None:  # the step's decoded routes, kept to its end only
                self.routes.step_done()

    def _train_updates(
        self,
        samples: Sequence[Sample],
        updates: Sequence[UpdatePlan],
        data_parallel: DataParallel | None,
        shard_count: int,
    ) -> dict[str, float]:
        start = time.perf_counter()
        k = len(updates)
        minis = micro_batches.by_update(samples, updates)  # by index in the update
        # The old policy is the weights before this step's first update (verl computes
        # old_log_prob once per step, then runs its PPO mini-batches against it).
        # A step trained again after an aborted attempt takes the weights it resumes from
        # as the old policy of the updates it has left.
        todo = range(self.updates_done, k)
        olds: list[dict[int, torch.Tensor] | None] = [None] * k
        keeps: list[torch.Tensor | None] = [None] * k
        own_k3 = [0.0, 0.0]  # routing replay: the mismatch the trainer's own routes give
        if self.config.algorithm.recompute_old_logprobs:
            for j in todo:
                old = olds[j] = self._old_logprobs(minis[j], updates[j].micro_batches)
                if self.config.algorithm.mismatch_mask is not None:
                    keeps[j] = self._kept(minis[j], len(updates[j].n_valid), old, data_parallel)
                if self.routes is not None:
                    k3, tokens = self._own_routes_k3(minis[j], updates[j].micro_batches)
                    own_k3 = [own_k3[0] + k3, own_k3[1] + tokens]
        results = []
        for j in todo:  # from 0 unless an attempt was aborted
            update = self._update(
                minis[j], updates[j], olds[j], keeps[j], data_parallel, shard_count
            )
            results.append(update)
            self.updates_done = j + 1
        self.updates_done = 0
        self.step += 1
        self.version = self.config.train.version_at(self.step)
        out = {key: sum(u[key] for u in results) / k for key in results[0]}
        for key, pick in LossStats.EXTREMES.items():  # extremes of the step, not means
            if key in out:
                out[key] = pick(u[key] for u in results)
        if self.routes is not None:
            out.update(self._replay_metrics(own_k3, data_parallel))
        out["optimizer_updates"] = float(len(results))  # of this attempt
        out["micro_steps"] = float(sum(len(updates[j].micro_batches) for j in todo))
        out["step_time_s"] = time.perf_counter() - start
        return out

    def _forward(self, rows: Sequence[Sample]) -> torch.Tensor:
        """Log-probs ``[len(rows), longest response]`` of each row's response tokens under
        the current weights (0 past a row's end). No rows: one padding token, whose
        log-prob the caller multiplies by 0, so this rank still takes part in FSDP2's
        gathers and reductions."""
        try:
            return self._policy_forward(rows, router_aux=False)[0]
        finally:
            self._clear_routes()

    def _policy_forward(
        self, rows: Sequence[Sample], router_aux: bool, replay: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`_forward`'s log-probs, and with ``router_aux`` a mixture of experts'
        router load-balancing loss over these rows (transformers computes it from every
        block's router logits, padding left out). With routing replay (and ``replay``) the
        rows' routes are set for this forward and its backward: the caller clears them."""
        temperature = self.config.algorithm.temperature
        seqs = [[*s.prompt_token_ids, *s.token_ids] for s in rows] or [[PAD, PAD]]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
        attn = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, seq in enumerate(seqs):
            ids[i, : len(seq)] = torch.tensor(seq)
            attn[i, : len(seq)] = 1
        # Response token t of a row is predicted at position n_prompt - 1 + t.
        n_prompt = torch.tensor([len(s.prompt_token_ids) for s in rows] or [1])
        n_resp = torch.tensor([len(s.token_ids) for s in rows] or [1])
        resp_len = int(n_resp.max())
        pos = (n_prompt[:, None] - 1 + torch.arange(resp_len)[None, :]).clamp(max=width - 1)
        valid = torch.arange(resp_len)[None, :] < n_resp[:, None]
        want = torch.zeros(len(seqs), width, dtype=torch.bool)
        want.scatter_(1, pos, valid)
        ids, attn, want, pos = (t.to(self.device) for t in (ids, attn, want, pos))
        if self.routes is not None and replay:
            self.routes.set(rows, width, self.device)
        next_ids = torch.roll(ids, -1, dims=1)
        with (
            self.head.targets(next_ids, want, temperature),
            compute_precision(self.device, self.param_dtype, self.sharded),
        ):
            more = {"output_router_logits": True} if router_aux else {}
            out = self.model(input_ids=ids, attention_mask=attn, **more)
        logp = out.logits.gather(1, pos) * valid.to(self.device)
        return logp, (out.aux_loss if router_aux else None)

    @torch.no_grad()
    def _old_logprobs(
        self, samples: dict[int, Sample], mine: list[list[int]]
    ) -> dict[int, torch.Tensor]:
        """The trainer's own log-probs of this rank's rows before the update, by index."""
        out: dict[int, torch.Tensor] = {}
        for batch in mine:
            with adapter_dropout_off(self.model):
                logp = self._forward([samples[i] for i in batch])
            for row, i in enumerate(batch):
                out[i] = logp[row, : len(samples[i].token_ids)].float().cpu()
        return out

    @torch.no_grad()
    def _own_routes_k3(
        self, samples: dict[int, Sample], mine: list[list[int]]
    ) -> tuple[float, float]:
        """Routing replay's counterfactual: the k3 of KL(rollout || old) over this rank's
        valid tokens (as ``mismatch_k3`` counts it), the old log-probs taken with the
        trainer's own routers instead of the replayed routes; (sum, tokens)."""
        total = tokens = 0.0
        for batch in mine:  # every rank as many forwards (FSDP2), empty ones too
            rows = [samples[i] for i in batch]
            with adapter_dropout_off(self.model):
                logp = self._policy_forward(rows, router_aux=False, replay=False)[0]
            if not rows:
                continue
            rollout, mask = self._behaviour(rows, logp.shape[1])
            log_rho = (logp.float().cpu() - rollout).clamp(-20, 20)
            valid = mask > 0
            total += float(((log_rho.exp() - 1 - log_rho) * valid).sum())
            tokens += float(valid.sum())
        return total, tokens

    def _replay_metrics(self, own_k3: list[float], dp: DataParallel | None) -> dict[str, float]:
        """Routing replay's step metrics, over every trainer rank: how often the trainer's
        own router chose otherwise than the replayed routes, and the mismatch k3 its own
        routes would have given (with recompute_old_logprobs; mismatch_k3 is the replayed)."""
        assert self.routes is not None
        differ, compared = self.routes.take_counts()
        with_routes, rows = self.routes.take_rows()
        sums = [float(differ), float(compared), float(with_routes), float(rows), *own_k3]
        if dp is not None:
            sums = dp.all_reduce_sum(sums)
        out = {
            "router_disagreement": sums[0] / sums[1] if sums[1] else 0.0,
            "routed_rows_share": sums[2] / sums[3] if sums[3] else 0.0,
        }
        if self.config.algorithm.recompute_old_logprobs:
            out["mismatch_k3_own_routes"] = sums[4] / sums[5] if sums[5] else 0.0
        return out

    def _clear_routes(self) -> None:
        if self.routes is not None:
            self.routes.clear()

    def _kept(
        self,
        samples: dict[int, Sample],
        n: int,
        old: dict[int, torch.Tensor],
        dp: DataParallel | None,
    ) -> torch.Tensor:
        """``algorithm.mismatch_mask``'s verdict on every sample of an update of ``n``: each
        rank judges its own rows (it alone has their old log-probs), the verdicts are
        summed."""
        flags = [0.0] * n
        for i, old_i in old.items():
            rows = [samples[i]]
            rollout, mask = self._behaviour(rows, len(old_i))
            flags[i] = float(
                mismatch_keep(old_i[None, :], rollout, mask, self.config.algorithm.mismatch_mask)[0]
            )
        if dp is not None:
            flags = dp.all_reduce_sum(flags)
        return torch.tensor(flags) > 0.5

    def _behaviour(self, rows: Sequence[Sample], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows' rollout log-probs and loss masks ``[len(rows), width]`` (multi-turn:
        environment tokens are 0 in the mask), on CPU."""
        rollout = rollout_logprobs_of(rows, width)
        mask = torch.zeros(len(rows), width)
        for i, s in enumerate(rows):
            if s.loss_mask is not None:
                mask[i, : len(s.loss_mask)] = torch.tensor(s.loss_mask, dtype=mask.dtype)
            else:
                mask[i, : s.n_valid] = 1
        return rollout, mask

    def _update(
        self,
        samples: dict[int, Sample],
        plan: UpdatePlan,
        old: dict[int, torch.Tensor] | None,
        keep: torch.Tensor | None,
        dp: DataParallel | None,
        shard_count: int,
    ) -> dict[str, float]:
        """One optimizer update: this rank's ``samples`` (by index in the update) in the
        plan's micro-batches, gradients accumulated, then reduced."""
        self.opt.zero_grad()
        # FSDP2 averages gradients over the data-parallel ranks; every rank's loss is
        # already its share of the mini-batch's (normalised by the whole mini-batch), so
        # the sum is wanted: scale by the rank count. The replicated path all-reduces sums.
        scale = float(shard_count) if self.sharded else 1.0
        parts: list[LossStats] = []
        aux_coef = self.config.algorithm.router_aux_loss_coef
        router_losses: list[float] = []
        mine = plan.micro_batches
        norm = Normaliser(plan.n_valid, plan.replayed)
        for j, batch in enumerate(mine):
            if self.sharded:  # reduce gradients once, after the last micro-batch
                self.model.set_requires_gradient_sync(j == len(mine) - 1)
            rows = [samples[i] for i in batch]
            # 1. Teacher-force prompt + response: log-probs of the response tokens (and
            # a MoE's router load-balancing loss when the recipe adds it).
            logp, router_loss = self._policy_forward(rows, router_aux=aux_coef > 0)
            if not rows:
                zero = logp.sum() * 0.0
                ((zero + router_loss * 0.0) if router_loss is not None else zero).backward()
                self._clear_routes()
                continue
            # 2. Behaviour (rollout) log-probs, the loss mask, and the old policy's
            # log-probs where the trainer recomputed them.
            width = logp.shape[1]
            rollout, mask = (t.to(self.device) for t in self._behaviour(rows, width))
            old_logp = None
            if old is not None:
                old_logp = torch.zeros(len(rows), width)
                for r, i in enumerate(batch):
                    old_logp[r, : len(old[i])] = old[i]
                old_logp = old_logp.to(self.device)
            # 3. Replay weights, off-policy correction and the clipped surrogate
            # (runtime/engines/torch/loss.py), normalised by the whole mini-batch.
            loss, st = batch_loss(
                logp,
                old_logp,
                rollout,
                mask,
                rows,
                self.config.algorithm,
                self.config.replay_tau,
                norm=norm,
                at=batch,
                keep=keep,
            )
            if router_loss is not None:
                # each micro-batch's share of the mini-batch's rows (over every rank)
                share = len(rows) / len(plan.n_valid)
                loss = loss + aux_coef * share * router_loss
                router_losses.append(float(router_loss.detach()) * share)
            (loss * scale).backward()
            self._clear_routes()  # kept through the backward: a recomputed block routes alike
            parts.append(st)
        # 4. Gradients summed over the replicas (FSDP2 did it in the backward), clipped.
        params = trainable(self.model)  # a LoRA run's frozen base has no gradients
        if not self.sharded:
            for param in params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
            if dp is not None:
                dp.all_reduce_grads(params)
        metrics = reduce_stats(LossStats.combine(parts), dp)
        if aux_coef > 0:  # the mini-batch's mean router loss, summed over the ranks
            total = sum(router_losses)
            metrics["router_aux_loss"] = dp.all_reduce_sum([total])[0] if dp else total
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        self.opt.step()
        metrics["grad_norm"] = full_norm(grad_norm)
        return metrics

    def abandon_step(self) -> None:
        """A step's collective failed (a trainer rank lost mid-step): its gradients are
        dropped; the updates it applied (:attr:`updates_done`) stay, and the step is trained
        again from the next one once the trainer ranks regroup."""
        if self.model is None:
            return
        self.opt.zero_grad(set_to_none=True)
        for param in self.model.parameters():
            param.grad = None

    # --- device memory ------------------------------------------------------------------

    @property
    def offload_state(self) -> str:
        """``"on_device"``, ``"offloaded"`` (in host memory) or ``"none"`` (no model on this
        rank: a sharded trainer's rank outside the trainer, or a released one)."""
        return self.residency.state(self.model)

    def offload(self, move: bool | None = None) -> OffloadRecord:
        """The state to host memory (runtime/engines/torch/offload.py)."""
        return self.residency.offload(self.model, self.opt, self.device, move)

    def drop(self) -> OffloadRecord:
        """Free the state on the device, no copy kept, then :meth:`release`: a sharded
        trainer's rank leaving the trainer, whose shards go stale with the next step. A
        host copy was wasted, and slow (an H200 pinned a fresh buffer at 1.2-2 GB/s:
        docs/results.md 2026-12-04). Step and version stay."""
        record = self.residency.free(self.model, self.opt, self.device)
        self.release()
        return record

    def reload(self) -> OffloadRecord:
        """The state :meth:`offload` moved, back on the device, values unchanged."""
        if self.offload_state != "offloaded":
            raise RuntimeError(f"reload with the trainer state {self.offload_state}")
        return self.residency.reload()

    def release(self) -> None:
        """Drop model and optimizer (a sharded trainer's rank that left the trainer: its
        shards go stale with the next step, and it receives current ones when it joins
        again). Step and version stay."""
        self.residency.discard()
        self.model = self.opt = None


def reduce_stats(st: LossStats, dp: DataParallel | None) -> dict[str, float]:
    """An update's statistics over the trainer ranks (LossStats' rule: sums, and the
    extremes by min/max)."""
    additive = [f.name for f in dataclasses.fields(st) if f.name not in LossStats.EXTREMES]
    if dp is not None:
        sums = dp.all_reduce_sum([getattr(st, k) for k in additive])
        hi, neg_lo = dp.all_reduce_max([st.is_ratio_max, -st.is_ratio_min])
        st = LossStats(**dict(zip(additive, sums, strict=True)))
        st.is_ratio_min, st.is_ratio_max = -neg_lo, hi
    return st.as_metrics()
