"""The trainer side of a hybrid worker: batches in, step reports and weights out.

:class:`TorchTrainerSide` wraps a :class:`runtime.engines.torch.trainer.TorchTrainer` for
the worker: it trains the batches rank 0 sends (each trainer rank its own samples), has
the leader report each step, gathers a sharded model's weights at sync points and sends
them to the rollout ranks, writes and restores its part of checkpoints, and takes part in
role switches:

- ``deactivate`` (the rank leaves the trainer role) drops the gradients and moves the
  parameters and AdamW state to host memory (pinned on CUDA); ``activate`` brings them
  back (nothing to bring where the rank holds no model yet: a sharded trainer's joining
  rank gets its shards in ``on_layout``);
- ``on_layout``, after the process groups changed, moves the training state rank to rank
  (runtime/engines/torch/shard_handoff.py): ranks that stay keep their own shards,
  rebuilt over the new mesh; each joining rank receives its shards from a rank that
  stays; a sharded trainer's leaving rank drops its (stale) shards.

:attr:`TorchTrainerSide.last_switch` holds the timings and byte counts of the last switch,
:attr:`TorchTrainerSide.offload_state` where the state is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from runtime.config.layout import LayoutChange
from runtime.config.schema import Config
from runtime.engines.torch.published import PublishedCopy
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.shard_handoff import (
    TransferStats,
    adopt,
    from_first_group,
    plan_sources,
    training_tensors,
    transfer,
)
from runtime.engines.torch.trainer import TorchTrainer
from runtime.engines.torch.trainer_eval import HeldOutEval, eval_names
from runtime.rank.collective import Collective
from runtime.rank.sides import BatchConsumer, StepAborted
from runtime.store.run_dir import RunPaths
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.protocol import GONE_ROLE
from runtime.weights.send import WeightStreamer
from runtime.weights.settings import WeightPathConfig

log = logging.getLogger(__name__)

# What :attr:`TorchTrainerSide.last_switch` reports of a role switch (seconds and bytes):
# the offload of a rank leaving the trainer or the restore of one joining (this side's
# deactivate / activate), and in on_layout the model rebuilt over the new mesh, the local
# state a staying rank kept, the point-to-point transfer to joining ranks, and the whole
# state move (rebuild + keep + transfer).
SWITCH_KEYS = (
    "offload_s",
    "offload_bytes",
    "dropped_bytes",
    "restore_s",
    "restore_bytes",
    "rebuild_s",
    "kept_bytes",
    "transfer_s",
    "sent_bytes",
    "received_bytes",
    "peers",
    "state_transfer_s",
)


def _switch_record(**values: float) -> dict[str, float]:
    record = dict.fromkeys(SWITCH_KEYS, 0.0)
    record.update(values)
    return record


@contextmanager
def _own_rng() -> Iterator[None]:
    """Keep this rank's torch RNG across a model rebuild (TorchTrainer seeds it: right for
    a run's start, not mid-run)."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []):
        yield


def _sources(change: LayoutChange, group_size: int) -> dict[int, int]:
    """Who receives trainer state from whom in ``change`` (``{receiver: source}``): the
    joining ranks from ranks that stay; after a trainer rank was lost (``"gone"`` now),
    every replica but the leader's, from the leader's (a step cut short by the loss may
    have ended unevenly on the survivors: runtime/engines/torch/shard_handoff.py)."""
    before, after = change.ranks("trainer", after=False), change.ranks("trainer")
    sources = plan_sources(before, after, group_size)  # refuses a layout that moves shards
    if any(change.after[r] == GONE_ROLE for r in before):
        return from_first_group(after, group_size)
    return sources


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
        # the parts of the process group this side uses (None: no group, the leader alone)
        self.mesh = collective.mesh if collective is not None else None
        self.data_parallel = collective.data_parallel if collective is not None else None
        self.sync = collective.sync if collective is not None else None
        self.trainer = TorchTrainer(
            TorchTrainerConfig.from_config(cfg), resolve_model_path(cfg.model.path), rank, self.mesh
        )
        self.held_out = HeldOutEval(cfg)
        # Weight syncs stream the weights bucket by bucket (the leader's replica group
        # gathers each bucket of its shards; runtime/weights/send.py); the
        # whole model is gathered once, at the last step, for the final policy and eval.
        self.streamer = (
            WeightStreamer(WeightPathConfig.from_config(cfg), self.sync, self.mesh)
            if self.sync is not None and self.mesh is not None
            else None
        )
        self._gathered: dict[str, torch.Tensor] | None = None
        # a lend between sync points loads the published version, kept here at each
        # publish (only where the run lends and the weights run ahead of the version)
        lends_between_syncs = cfg.scheduler.lend_trainer and cfg.train.sync_every > 1
        self.published = PublishedCopy() if lends_between_syncs else None
        # the last role switch's timings and bytes (SWITCH_KEYS), for the worker to report
        self.last_switch: dict[str, float] = _switch_record()
        # rank 0 declares a dead trainer rank after heartbeat_timeout_s of silence, then
        # regroups at once (the peer's last beat may be a step's length earlier)
        self.regroup_wait_s = 2 * cfg.control.heartbeat_timeout_s

    def save_checkpoint(self, checkpoints: Path, step: int) -> None:
        """Rank 0 asked every trainer rank for checkpoint ``step``: the leader makes the
        staging folder, then all write their shards of model and AdamW, and the leader
        step, version and RNG."""
        from runtime.store import checkpoint

        if self.trainer.step != step:
            raise RuntimeError(f"asked for step {step}, the trainer is at {self.trainer.step}")
        mesh = self.mesh
        if self.leader:
            checkpoint.start(checkpoints, step)  # a fresh, empty staging folder
        group = mesh.group if mesh is not None else None
        if mesh is not None and mesh.size > 1:
            torch.distributed.barrier(group=group)  # nobody writes before it is made
        staging = checkpoint.staging_dir(checkpoints, step)
        self.trainer.save_state(checkpoint.trainer_dir(staging), group)

    def restore(self, folder: Path) -> None:
        """Load a checkpoint's trainer state (the trainer ranks together; a rank that is
        not a trainer now gets the state when it becomes one)."""
        from runtime.store.checkpoint import trainer_dir

        mesh = self.mesh
        if mesh is not None and not mesh.member:
            return
        self.trainer.load_state(trainer_dir(folder), mesh.group if mesh is not None else None)
        log.info("trainer state restored: step %d, v%d", self.trainer.step, self.trainer.version)

    def observe(self, step: int, policy_version: int) -> None:
        self.trainer.step = max(self.trainer.step, step)
        self.trainer.version = max(self.trainer.version, policy_version)

    def before_request(self) -> None:
        if self.held_out.at_start is None and self.held_out.enabled:
            self.held_out.at_start = self.held_out.evaluate(
                self.trainer, self._gathered, self.keepalive
            )
            log.info("held-out eval at start: %s", self.held_out.at_start)

    def on_message(self, msg: p.Message) -> None:
        if isinstance(msg, p.WeightSync):
            self._send_weights(msg)
        else:
            super().on_message(msg)

    def train_batch(self, msg: p.Batch) -> None:
        mesh, dp = self.mesh, self.data_parallel
        if mesh is None and not self.leader:
            return  # no process group (an engine pair without one): the leader trains alone
        index, count = 0, 1
        if mesh is not None and mesh.member:
            index, count = mesh.ranks.index(self.rank), mesh.size
        samples, updates = wire.batch(msg).samples, wire.updates(msg)
        t = self.trainer
        if self.published is not None and t.step % self.cfg.train.sync_every == 0:
            self.published.keep(t.version, self._policy_state())  # published: what a lend loads
        try:
            if updates is None:  # the whole batch (rank 0 plans for a data-parallel trainer)
                metrics = self.trainer.train_step(samples, dp, index, count)
            else:  # this rank's part, as rank 0 planned it
                metrics = self.trainer.train_part(samples, updates, dp, count)
        except RuntimeError as exc:
            if mesh is None or mesh.replicas <= 1:
                raise  # one replica: no group can go on without the rank (rank 0 restarts)
            # a peer died or hung in the step's collectives (gloo and NCCL raise a plain
            # RuntimeError): the step waits for the trainer group without it, bounded
            self.trainer.abandon_step()
            log.warning("step %d aborted: %s", self.trainer.step + 1, str(exc)[:300])
            raise StepAborted(f"step {self.trainer.step + 1} aborted: {str(exc)[:200]}") from exc
        t = self.trainer
        final = t.step >= self.cfg.train.steps
        eval_now = self.held_out.due(t.step, final)
        if t.sharded and (final or eval_now):
            self._gathered = t.gather_weights()  # every trainer rank, for the leader
        metrics["trainer_replicas"] = count
        if dp is not None:
            try:
                metrics["replica_spread"] = dp.replica_spread(t.checksum())
            except RuntimeError as exc:  # the step is taken: a lost peer costs the check only
                log.warning("replica check after step %d failed: %s", t.step, str(exc)[:300])
        if not self.leader:
            return  # the leader reports the step for the whole trainer group
        last = self.streamer.last if self.streamer is not None else None
        if last is not None:  # the last sync's seconds, bytes, GB/s, buckets, peak bytes
            metrics.update(last.metrics())
        if t.step == 1 and self.held_out.at_start is not None:
            metrics.update(eval_names(self.held_out.at_start, "start"))
        if eval_now:
            self.held_out.timed(t, self._gathered, self.keepalive, metrics)
        if final:
            t.publish(self.paths.root / "weights", self._weights())  # the run's final policy
            if self.held_out.enabled:
                self.held_out.timed(t, self._gathered, self.keepalive, metrics, "end")
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
        """Rank 0 said go (to the leader's replica group and the rollout drivers): stream
        this version to the rollout engines."""
        if self.streamer is None or not self.streamer.takes_part(self.trainer.sharded):
            return
        if msg.policy_version != self.trainer.version:
            log.warning(
                "weight sync for v%d but the trainer is at v%d",
                msg.policy_version,
                self.trainer.version,
            )
        self._stream_weights()

    def close(self) -> None:
        if self.streamer is not None:
            self.streamer.close()  # the NCCL group into the engines, on CUDA
        self.held_out.close()
        super().close()

    def _stream_weights(self) -> None:
        """The ranks of the leader's replica group together (collective)."""
        assert self.streamer is not None and self.sync is not None
        record = self.streamer.stream(self.trainer.model, self.trainer.version)
        sync = self.sync
        for peer, why in sync.take_lost_peers().items():  # rank 0 declares them lost now
            self._send(p.PeerLost(rank=self.rank, peer=peer, layout_epoch=sync.epoch, reason=why))
        if record.leader:
            log.debug(
                "weights v%d streamed: %d B in %.3f s (%.2f GB/s)",
                self.trainer.version,
                record.bytes,
                record.seconds,
                record.gb_per_s,
            )

    def _weights(self) -> dict[str, torch.Tensor]:
        """The leader's full weights of the current version."""
        if not self.trainer.sharded:
            return self.trainer.export_weights()
        if self._gathered is None:
            raise RuntimeError("no weights gathered yet: a sync point comes after a step")
        return self._gathered

    def engine_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """This version's full weights in host memory, for the engine of this same rank
        (mode colocated_sync). A sharded trainer's ranks all gather them, one tensor at a
        time (collective over the trainer group: every rank calls this together)."""
        return self.trainer.version, self._on_host(self._policy_state().items())

    def lend_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """A lend: the published version's full weights for this rank's engine (collective,
        as :meth:`engine_weights`). At a sync point the trainer's weights are that version;
        between sync points they run ahead, and the host copy kept at the last publish is
        gathered instead (runtime/engines/torch/published.py)."""
        t = self.trainer
        if t.step % self.cfg.train.sync_every == 0:
            return self.engine_weights()
        if self.published is None or self.published.version != t.version:
            # rank 0 lends only where the copy is kept (runtime/control/lends.py)
            raise RuntimeError(f"lent at step {t.step} with no copy of version {t.version}")
        return t.version, self._on_host(self.published.like(self._policy_state()))

    def _policy_state(self) -> dict[str, torch.Tensor]:
        """What rollout generates with: the model's state, or a LoRA run's adapters only
        (an adapter sync sends no copy of the whole model)."""
        from runtime.weights import lora_format

        adapter_only = self.cfg.model.lora.syncs_adapter
        return {
            k: v
            for k, v in self.trainer.model.state_dict().items()
            if not adapter_only or lora_format.is_adapter_name(k)
        }

    def _on_host(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``tensors`` whole, in the engine's names and format, on the host; a sharded
        one gathered over the trainer group one at a time."""
        from torch.distributed.tensor import DTensor

        t = self.trainer
        if not t.sharded:
            return t.for_rollout(t.checkpoint_format(dict(tensors)))
        out: dict[str, torch.Tensor] = {}
        for name, value in tensors:
            full = value.full_tensor() if isinstance(value, DTensor) else value
            out.update(t.checkpoint_format({name: full}))  # on the host, one at a time
            del full
        return t.for_rollout(out)

    # --- role switches ------------------------------------------------------------------

    @property
    def offload_state(self) -> str:
        """Where the training state is: ``"on_device"``, ``"offloaded"`` (host memory) or
        ``"none"`` (no model on this rank: a sharded trainer outside its trainer ranks)."""
        return self.trainer.offload_state

    def deactivate(self) -> None:
        """The rank leaves the trainer role (or starts as rollout): gradients dropped,
        parameters and AdamW state to host memory, so the device is free for rollout.

        A sharded trainer's rank leaving the trainer in a layout change keeps nothing: its
        shards go stale with the next step and :meth:`on_layout` releases them, so they are
        freed here without the copy. Under ``colocated_sync`` every rank comes back to the
        same shards, which are offloaded as for a replicated trainer."""
        super().deactivate()
        record = _switch_record()
        if self.trainer.offload_state == "on_device":
            if self.trainer.sharded and not self.cfg.reflow.policy.colocated:
                freed = self.trainer.drop()
                record.update(dropped_bytes=float(freed.bytes))
                log.info("trainer shards freed (not kept): %.1f MB", freed.bytes / 2**20)
            else:
                moved = self.trainer.offload()
                record.update(offload_s=moved.seconds, offload_bytes=float(moved.bytes))
                log.info(
                    "trainer state offloaded: %.1f MB in %.3f s",
                    moved.bytes / 2**20,
                    moved.seconds,
                )
        self.last_switch = record

    def activate(self) -> None:
        """The rank takes the trainer role: an offloaded state back onto the device. A
        rank with no model (a sharded trainer's joining rank) does nothing here: its model
        is built over the new mesh, and its shards received, in :meth:`on_layout`."""
        super().activate()
        record = _switch_record()
        if self.trainer.offload_state == "offloaded":
            moved = self.trainer.reload()
            record.update(restore_s=moved.seconds, restore_bytes=float(moved.bytes))
            log.info(
                "trainer state restored: %.1f MB in %.3f s", moved.bytes / 2**20, moved.seconds
            )
        self.last_switch = record

    def on_layout(self, change: LayoutChange) -> None:
        """After the process groups changed: the training state moves rank to rank
        (runtime/engines/torch/shard_handoff.py), and new rollout ranks get the leader's
        current weights.

        Under FSDP2 every rank that stays a trainer rebuilds the model over the new mesh
        and keeps its own shards, each joining rank receives its shards from a rank that
        stays, and a leaving rank drops its shards. A replicated trainer's joining rank
        receives the whole state from one that stays. No rank gathers the whole model and
        nothing goes through the disk."""
        super().on_layout(change)
        was = self.rank in change.ranks("trainer", after=False)
        now = self.rank in change.ranks("trainer")
        # this side's deactivate / activate of this switch made the record; else a fresh one
        record = self.last_switch if was != now else _switch_record()
        self.last_switch = record
        if self.mesh is None:
            return
        if change.ranks("trainer") != change.ranks("trainer", after=False):
            start = time.perf_counter()
            if self.trainer.sharded:
                self._reshard(change, record)
            else:
                self._receive_replica(change, record)
            record["state_transfer_s"] = time.perf_counter() - start
        if (
            change.joined("rollout")
            and self.streamer is not None
            and self.streamer.takes_part(self.trainer.sharded)
        ):
            self._stream_weights()  # new rollout ranks load the current weights first

    def _reshard(self, change: LayoutChange, record: dict[str, float]) -> None:
        """FSDP2: rebuild over the new mesh, keep or receive this rank's shards."""
        mesh = self.mesh
        assert mesh is not None
        before = change.ranks("trainer", after=False)
        # every rank plans alike (and refuses alike: no rank is left waiting)
        sources = _sources(change, mesh.group_size)
        old = self.trainer
        if not mesh.member:
            old.release()  # stale after the next step; a rank that joins again receives
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.empty_cache()
            return
        start = time.perf_counter()
        with _own_rng():
            new = TorchTrainer(old.config, old.model_path, self.rank, mesh)
        new.step, new.version = old.step, old.version
        record["rebuild_s"] = time.perf_counter() - start
        if self.rank in before:
            if old.offload_state == "offloaded":  # a staying rank is never deactivated
                old.reload()
            record["kept_bytes"] = float(adopt(old.model, old.opt, new.model, new.opt))
        old.release()
        self.trainer = new
        log.info(
            "trainer rebuilt over %d ranks in %.3f s, %.1f MB of its own state kept",
            mesh.size,
            record["rebuild_s"],
            record["kept_bytes"] / 2**20,
        )
        self._transfer(sources, record)

    def _receive_replica(self, change: LayoutChange, record: dict[str, float]) -> None:
        """A replicated trainer: a joining rank receives the whole state in place."""
        sources = _sources(change, 1)
        if self.rank in sources and self.trainer.offload_state == "offloaded":
            moved = self.trainer.reload()  # activate was not called (not a worker's switch)
            record.update(restore_s=moved.seconds, restore_bytes=float(moved.bytes))
        self._transfer(sources, record)

    def _transfer(self, sources: dict[int, int], record: dict[str, float]) -> None:
        """This rank's part of the point-to-point transfer (nothing unless it sends or
        receives); a receiver takes its source's step and version."""
        mesh, dp = self.mesh, self.data_parallel
        assert mesh is not None and dp is not None
        if self.rank not in sources and self.rank not in sources.values():
            return
        t = self.trainer
        stats: TransferStats
        stats, (t.step, t.version, t.updates_done) = transfer(
            training_tensors(t.model, t.opt),
            sources,
            self.rank,
            t.device,
            dp.bucket_bytes,
            (t.step, t.version, t.updates_done),
            group=mesh.group,  # this epoch's: a rank started again is new in it
        )
        record.update(
            transfer_s=stats.seconds,
            sent_bytes=float(stats.sent_bytes),
            received_bytes=float(stats.received_bytes),
            peers=float(len(stats.peers)),
        )
        if self.rank in sources:
            how = f"received from rank {sources[self.rank]}: {stats.received_bytes / 2**20:.1f} MB"
        else:
            how = f"sent from rank {self.rank} to {stats.peers}: {stats.sent_bytes / 2**20:.1f} MB"
        log.info("trainer state v%d %s in %.3f s", t.version, how, stats.seconds)
