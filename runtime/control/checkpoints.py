"""Checkpoint bookkeeping at rank 0: the one pending, what became of each, a stop after one.

Checkpoints (``train.checkpoint_every`` and before a graceful stop) are taken at a step
boundary: no batch is handed out while one is pending; the trainer leader writes its state
(``Checkpoint`` -> ``CheckpointSaved``), then the injected ``save`` writes the
coordinator's state next to it and seals the folder (runtime/store/checkpoint.py). What
the coordinator does around them is runtime/control/lifecycle.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# How long the checkpoint before a stop waits for the rollout drivers' parked rollouts
# (runtime/control/lifecycle.py): an abort and a few seconds' grace for tool calls; well
# inside ``reflow stop --grace`` (60 s), which ends a job that has not left by then.
PARK_TIMEOUT_S = 20.0

# (step, policy_version, coordinator state) -> where it was saved; raises on failure
SaveCheckpoint = Callable[[int, int, dict[str, Any]], str]


class Checkpoints:
    def __init__(self, save: SaveCheckpoint | None, clock: Callable[[], float]) -> None:
        self.save = save
        self.clock = clock
        self.pending: dict[str, Any] | None = None  # step, requested_at, then_stop
        self.records: list[dict[str, Any]] = []  # saved and failed, in order
        self._unreported: list[dict[str, Any]] = []
        self.stop_after_step: str | None = None  # a stop waiting for the batch in training

    @property
    def busy(self) -> bool:
        """A checkpoint, or a stop that will take one, holds the next batch back."""
        return self.pending is not None or self.stop_after_step is not None

    @property
    def stopping(self) -> bool:
        """A stop is already on its way (after the step in training, or a checkpoint)."""
        return self.stop_after_step is not None or (
            self.pending is not None and self.pending["then_stop"] is not None
        )

    def saved(self, step: int) -> bool:
        last = self.records[-1] if self.records else None
        return last is not None and last["step"] == step and last["ok"]

    def request(self, step: int, then_stop: str | None) -> bool:
        """Start one for ``step``; False when there is no saver or one is pending."""
        if self.save is None or self.pending:
            return False
        self.pending = {"step": step, "requested_at": self.clock(), "then_stop": then_stop}
        return True

    def end(
        self,
        trainer_ok: bool,
        error: str,
        policy_version: int,
        state: Callable[[], dict[str, Any]],
    ) -> str | None:
        """Close the pending checkpoint (the trainer's half done or failed); returns the
        reason of a stop that waited for it, if any."""
        pending = self.pending
        assert pending is not None
        self.pending = None
        record: dict[str, Any] = {
            "step": pending["step"],
            "policy_version": policy_version,
            "ok": False,
        }
        if not trainer_ok:
            record["error"] = f"trainer: {error}"
        else:
            assert self.save is not None
            try:
                record["path"] = self.save(pending["step"], policy_version, state())
                record["ok"] = True
            except Exception as exc:  # disk full, permissions: the run goes on without it
                record["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        record["took_s"] = round(self.clock() - pending["requested_at"], 3)
        self.records.append(record)
        self._unreported.append(record)  # into the next step's metrics line
        return pending["then_stop"]

    def overdue(self, now: float, timeout_s: float) -> bool:
        return self.pending is not None and now - self.pending["requested_at"] > timeout_s

    def take_unreported(self) -> list[dict[str, Any]]:
        out, self._unreported = self._unreported, []
        return out

    def status(self) -> dict[str, Any]:
        pending = self.pending
        if pending is not None:  # as JSON: the drivers still to report as a list
            pending = {
                k: sorted(v) if isinstance(v, set) else v
                for k, v in pending.items()
                if k != "trainer"
            }
        return {
            "pending": pending,
            "last": next((c for c in reversed(self.records) if c["ok"]), None),
            "failed": sum(1 for c in self.records if not c["ok"]),
        }
