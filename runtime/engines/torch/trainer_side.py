"""The trainer side of a hybrid worker: batches in, step reports and weights out.

:class:`TorchTrainerSide` wraps a :class:`runtime.engines.torch.trainer.TorchTrainer` for
the worker: it trains the batches rank 0 sends (each trainer rank its own samples), has
the leader report each step, gathers a sharded model's weights at sync points and sends
them to the rollout ranks, writes and restores its part of checkpoints, and moves the
training state when the layout changes (a broadcast from the leader for replicated
models, a DCP handoff for sharded ones).
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path

import torch

from runtime.config.layout import LayoutChange
from runtime.config.schema import Config
from runtime.engines.torch.trainer import TorchTrainer
from runtime.rank.collective import Collective
from runtime.rank.sides import BatchConsumer
from runtime.store.run_dir import RunPaths
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.workloads.kinds import workload_kind

log = logging.getLogger(__name__)


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
        self.trainer = TorchTrainer(cfg, resolve_model_path(cfg), rank, collective)
        self._eval_start: float | None = None
        self._last_sync_s: float | None = None
        # under FSDP2 the full weights of the last sync point, gathered on the leader by
        # every trainer rank together (a weight sync is the leader's alone)
        self._gathered: dict[str, torch.Tensor] | None = None

    def save_checkpoint(self, checkpoints: Path, step: int) -> None:
        """Rank 0 asked every trainer rank for checkpoint ``step``: the leader makes the
        staging folder, then all write their shards of model and AdamW, and the leader
        step, version and RNG."""
        from runtime.store import checkpoint

        if self.trainer.step != step:
            raise RuntimeError(f"asked for step {step}, the trainer is at {self.trainer.step}")
        c = self.collective
        if self.leader:
            checkpoint.start(checkpoints, step)  # a fresh, empty staging folder
        group = c.trainer_group if c is not None else None
        if c is not None and len(c.trainer_ranks) > 1:
            torch.distributed.barrier(group=group)  # nobody writes before it is made
        staging = checkpoint.staging_dir(checkpoints, step)
        self.trainer.save_state(checkpoint.trainer_dir(staging), group)

    def restore(self, folder: Path) -> None:
        """Load a checkpoint's trainer state (the trainer ranks together; a rank that is
        not a trainer now gets the state when it becomes one)."""
        from runtime.store.checkpoint import trainer_dir

        c = self.collective
        if c is not None and self.rank not in c.trainer_ranks:
            return
        self.trainer.load_state(trainer_dir(folder), c.trainer_group if c is not None else None)
        log.info("trainer state restored: step %d, v%d", self.trainer.step, self.trainer.version)

    def observe(self, step: int, policy_version: int) -> None:
        self.trainer.step = max(self.trainer.step, step)
        self.trainer.version = max(self.trainer.version, policy_version)

    def before_request(self) -> None:
        if self._eval_start is None and workload_kind(self.cfg.workload.kind).trainer_eval:
            self._eval_start = self.evaluate()
            log.info("eval reward at start: %.3f", self._eval_start)

    def evaluate(self) -> float:
        """Held-out reward of the current policy (the leader alone). A sharded model
        cannot generate on one rank: a plain copy is built from the gathered weights, or
        from the model folder before the first sync."""
        from transformers import AutoModelForCausalLM

        from runtime.embedded.warm_start import greedy_accuracy

        model = self.trainer.model
        if self.trainer.sharded:
            model = AutoModelForCausalLM.from_pretrained(self.trainer.model_path)
            if self._gathered is not None:
                model.load_state_dict(self._gathered, strict=False)
                model.tie_weights()
        model.eval()
        try:
            return greedy_accuracy(model, max_new=self.cfg.workload.max_response_tokens)
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
        # this rank's samples at their places in the batch, stand-ins for the others'
        samples, lengths = wire.whole_batch(msg)
        metrics = self.trainer.train_step(samples, c, index, count, lengths=lengths)
        t = self.trainer
        final = t.step >= self.cfg.train.steps
        if t.sharded and (t.step % self.cfg.train.sync_every == 0 or final):
            self._gathered = t.gather_weights()  # every trainer rank, for the leader
        metrics["trainer_replicas"] = count
        if c is not None:
            metrics["replica_spread"] = c.replica_spread(t.checksum())
        if not self.leader:
            return  # the leader reports the step for the whole trainer group
        if self._last_sync_s is not None:
            metrics["weight_sync_s"] = self._last_sync_s
        if t.step == 1 and self._eval_start is not None:
            metrics["eval_reward_start"] = self._eval_start
        if final:
            t.publish(self.paths.root / "weights", self._weights())  # the run's final policy
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
        self._last_sync_s = self.collective.send_weights(self.trainer.version, self._weights())

    def _weights(self) -> dict[str, torch.Tensor]:
        """The leader's full weights of the current version."""
        if not self.trainer.sharded:
            return self.trainer.export_weights()
        if self._gathered is None:
            raise RuntimeError("no weights gathered yet: a sync point comes after a step")
        return self._gathered

    def _reshards(self, change: LayoutChange) -> bool:
        """A sharded trainer whose ranks change: its state moves by a DCP handoff."""
        return self.trainer.sharded and change.ranks("trainer") != change.ranks(
            "trainer", after=False
        )

    def _handoff_dir(self, epoch: int) -> Path:
        return self.paths.root / "handoff" / f"epoch-{epoch}"

    def before_layout(self, change: LayoutChange) -> None:
        """Before the process groups change: under FSDP2 the old trainer ranks write their
        shards of model and AdamW to ``<run>/handoff/epoch-N`` over the old groups (a
        sharded state cannot be broadcast from one rank, and the old mesh is gone after
        the regroup). Moving shards rank to rank without the disk is not done here."""
        c = self.collective
        if c is None or not self._reshards(change):
            return
        if self.rank not in change.ranks("trainer", after=False):
            return
        folder = self._handoff_dir(change.epoch)
        if self.leader:
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
        if len(c.trainer_ranks) > 1:
            torch.distributed.barrier(group=c.trainer_group)  # nobody writes before that
        self.trainer.save_state(folder, c.trainer_group)

    def on_layout(self, change: LayoutChange) -> None:
        """After a role switch: new trainer replicas get the leader's training state, and
        new rollout ranks the leader's current weights (both by broadcast)."""
        c = self.collective
        if c is None:
            return
        if self._reshards(change):
            # The old trainer ranks wrote their shards in before_layout; the new ones
            # build the model over the new mesh and load them, resharded.
            old = self.trainer
            # a rank that leaves the trainer drops its shards; one that stays or joins
            # builds the model over the new mesh
            self.trainer = TorchTrainer(self.cfg, old.model_path, self.rank, c)
            self.trainer.step, self.trainer.version = old.step, old.version
            del old
            if self.rank in change.ranks("trainer"):
                start = time.perf_counter()
                folder = self._handoff_dir(change.epoch)
                self.trainer.load_state(folder, c.trainer_group)
                if len(c.trainer_ranks) > 1:
                    torch.distributed.barrier(group=c.trainer_group)  # all have read it
                if self.leader:
                    shutil.rmtree(folder, ignore_errors=True)
                log.info(
                    "trainer state v%d resharded over %d ranks in %.3f s",
                    self.trainer.version,
                    len(c.trainer_ranks),
                    time.perf_counter() - start,
                )
            if self.leader and change.joined("rollout"):
                self._broadcast_weights()
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
