"""A rollout driver's end of the weight path: take part in each transfer, load the policy.

The leader's header (runtime/weights/p2p.py) names how the buckets come, and the strategy
of that name takes them:

- ``gloo``: the buckets over the sync group, assembled here, written as the folder the
  engine loads (a Hugging Face ``model.safetensors``, or a LoRA run's adapter as a peft
  folder, runtime/weights/lora_format.py) in /dev/shm, then the engine's policy hook
  reloads it (pause keep -> load -> version -> resume: requests in flight are held and
  resumed, partial rollout);
- ``nccl``: straight into the engine's workers (runtime/weights/nccl.py; pause keep ->
  receive and load each bucket -> version -> resume), or received and dropped when the
  engine has the version already;
- in place (mode ``colocated_sync``, no transfer): this rank's own trainer's weights,
  written and loaded like a gloo transfer.

Each sync leaves a record in ``records`` (bytes, seconds, GB/s). The receiver does its
blocking part on the rank's thread and hands the engine's part back as a coroutine, which
the rollout side runs on its engine's loop: one update in flight at a time, in version
order (``settle`` waits for the one before).
"""

from __future__ import annotations

import collections
import logging
import shutil
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import torch

from runtime.weights import nccl, p2p
from runtime.weights.protocols import PolicyTarget, SyncGroup
from runtime.weights.settings import WeightPathConfig
from runtime.weights.wire import WeightsHeader

log = logging.getLogger(__name__)

# A coroutine of the engine's part of an update; it returns the seconds the engine was
# paused (requests held), which the rollout side books.
Update = Coroutine[Any, Any, float]
# A strategy: (the header, when the transfer began, settle, hold) -> the engine's part, or
# None
Strategy = Callable[[WeightsHeader, float, Callable[[], None], bool], Update | None]


class PolicyReceiver:
    def __init__(
        self,
        config: WeightPathConfig,
        rank: int,
        engine: PolicyTarget,
        group: SyncGroup | None,
        root: Path,
        timeout_s: float,
    ) -> None:
        self.config, self.rank, self.engine, self.group = config, rank, engine, group
        self.root = root  # one folder per version, private to this rank
        self.timeout_s = timeout_s  # a transfer waits as long as the leader's collectives
        # one record per weight sync received (bytes, seconds, GB/s), for metrics/status
        self.records: collections.deque[dict[str, float]] = collections.deque(maxlen=64)
        # called with (version, folder) after the engine loaded a policy folder, before the
        # folder is removed (a routing-replay probe loads it too: route_probe.py)
        self.on_loaded: Callable[[int, str], None] | None = None
        # the strategies by the header's transport name (runtime/weights/wire.py TRANSPORTS)
        self.strategies: dict[str, Strategy] = {
            p2p.GlooBucketSender.name: self._from_sync_group,
            nccl.NcclBucketSender.name: self._from_nccl,
        }

    # --- a transfer ----------------------------------------------------------------------

    def receive(self, settle: Callable[[], None], hold: bool = False) -> Update | None:
        """Take part in the leader's next transfer (this rank's thread: the header, and the
        buckets where they come over the sync group). Returns the engine's part (None:
        nothing to load); ``settle`` waits for the update in flight before it. ``hold``:
        the engine keeps the version it serves (pinned to an eval round,
        runtime/control/evals.py): the transfer is received and dropped."""
        if self.group is None:
            return None
        start = time.perf_counter()
        header = p2p.receive_weights_header(self.group)
        return self.strategies[header.transport](header, start, settle, hold)

    def _from_sync_group(
        self, header: WeightsHeader, start: float, settle: Callable[[], None], hold: bool
    ) -> Update | None:
        assert self.group is not None
        weights = p2p.receive_all(self.group, header)
        received_s = time.perf_counter() - start
        settle()
        nbytes = sum(t.numel() * t.element_size() for t in weights.values())
        if hold or not self.needs(header.version):
            self._record(header.version, nbytes, received_s, 0.0, loaded=False)
            return None
        written = time.perf_counter()
        folder = self.write_policy(header.version, weights)
        del weights
        write_s = time.perf_counter() - written
        log.debug("weights v%d received in %.3f s", header.version, received_s)
        return self._load_folder(str(folder), header, nbytes, received_s, write_s)

    async def _load_folder(
        self, path: str, header: WeightsHeader, nbytes: int, received_s: float, write_s: float
    ) -> float:
        took = await self.engine.update_weights(path, header.version)
        if self.on_loaded is not None:
            self.on_loaded(header.version, path)
        self._record(header.version, nbytes, received_s, write_s + took, loaded=True)
        log.debug("weights v%d loaded in %.3f s", header.version, took)
        self._forget_all_but(header.version)
        return took  # paused, reloaded, resumed: requests held meanwhile

    def _from_nccl(
        self, header: WeightsHeader, start: float, settle: Callable[[], None], hold: bool
    ) -> Update | None:
        settle()  # one update at a time, in version order
        assert self.group is not None
        return self._load_nccl(header, self.group.epoch, hold)

    async def _load_nccl(self, header: WeightsHeader, epoch: int, hold: bool = False) -> float:
        """Join the group if the header announces one, then receive into the model
        (paused) or, with this version loaded already or ``hold``, receive and drop."""
        eng, timeout = self.engine, self.timeout_s
        if header.nccl is not None:
            await eng.join_transfer_group(header, self.rank, epoch, timeout)
        nbytes = sum(map(header.bucket_nbytes, range(len(header.buckets))))
        start = time.perf_counter()
        if hold or not self.needs(header.version):
            await eng.drain_transfer(header, timeout)
            self._record(
                header.version, nbytes, time.perf_counter() - start, 0.0, False, over_nccl=True
            )
            return 0.0
        paused, finish_s = await eng.update_weights_nccl(header, timeout)
        # the buckets' receive includes their load_weights: one operation on this path
        self._record(header.version, nbytes, paused - finish_s, finish_s, True, over_nccl=True)
        return paused

    # --- in place (colocated_sync) -------------------------------------------------------

    def load_in_place(
        self,
        version: int,
        weights: dict[str, torch.Tensor],
        run: Callable[[Coroutine[Any, Any, float], str], float],
    ) -> None:
        """This rank's trainer's weights (host memory) into its own engine, as a file in
        memory then a reload; no process group, nothing in flight. ``run`` runs the
        engine's call on its loop, bounded, and returns its result."""
        if not self.needs(version):
            return
        start = time.perf_counter()
        folder = self.write_policy(version, weights)
        write_s = time.perf_counter() - start
        load = self.engine.update_weights(str(folder), version)
        took = run(load, f"in-place load of version {version}")
        if self.on_loaded is not None:
            self.on_loaded(version, str(folder))
        nbytes = sum(t.numel() * t.element_size() for t in weights.values())
        self._record(version, nbytes, 0.0, write_s + took, loaded=True)
        self._forget_all_but(version)

    # --- the policy's folder -------------------------------------------------------------

    def write_policy(self, version: int, weights: dict[str, torch.Tensor]) -> Path:
        """``weights`` as the folder the engine loads version ``version`` from: a Hugging
        Face ``model.safetensors``, or a LoRA run's adapter as a peft folder."""
        from safetensors.torch import save_file

        from runtime.weights import lora_format

        folder = self.root / f"v{version}"
        folder.mkdir(mode=0o700, exist_ok=True)  # inside our private root
        if self.engine.serves_adapter:
            if not all(map(lora_format.is_adapter_name, weights)):
                raise ValueError(f"weights v{version}: a LoRA engine was sent non-adapter tensors")
            lora_format.write_adapter(folder, weights, self.config.lora, self.engine.model_path)
        else:
            save_file(weights, str(folder / "model.safetensors"))
        return folder

    def needs(self, version: int) -> bool:
        """Whether the engine should load ``version`` (not if it has it, unless a level-2
        sleep dropped its weights)."""
        return version > self.engine.version or not self.engine.weights_valid

    def _forget_all_but(self, version: int) -> None:
        for old in self.root.glob("v*"):  # the engine holds its own copy now
            if old.name != f"v{version}":
                shutil.rmtree(old, ignore_errors=True)

    def _record(
        self,
        version: int,
        nbytes: int,
        receive_s: float,
        load_s: float,
        loaded: bool,
        over_nccl: bool = False,
    ) -> None:
        self.records.append(
            {
                "version": float(version),
                "bytes": float(nbytes),
                "receive_s": receive_s,
                "load_s": load_s,
                "gb_per_s": nbytes / receive_s / 1e9 if receive_s > 0 else 0.0,
                "loaded": float(loaded),
                "nccl": float(over_nccl),
            }
        )
