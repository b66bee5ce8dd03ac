"""Checkpoint bookkeeping at rank 0: the one pending, what became of each, a stop after one.

Checkpoints (``train.checkpoint_every`` and before a graceful stop) are taken at a step
boundary: no batch is handed out while one is pending; the trainer leader writes its state
(``Checkpoint`` -> ``CheckpointSaved``), then the injected ``save`` writes the
coordinator's state next to it and seals the folder (runtime/store/checkpoint.py). What
the coordinator does around them is runtime/control/lifecycle.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# How long the checkpoint before a stop waits for the rollout drivers' parked rollouts
# (runtime/control/lifecycle.py): an abort and a few seconds' grace for tool calls; well
# inside ``reflow stop --grace`` (60 s), which ends a job that has not left by then.
PARK_TIMEOUT_S = 20.0

# (step, policy_version, coordinator state) -> where it was saved; raises on failure
SaveCheckpoint = Callable[[int, int, dict[str, Any]], str]


@dataclass
class PendingCheckpoint:
    """The checkpoint being written: its step, when it was asked for, the stop waiting for
    it, and, before a stop, the rollout drivers whose parked rollouts it still awaits."""

    step: int
    requested_at: float
    then_stop: str | None  # the reason of the stop that follows it, if one does
    # Drivers still to report their parked rollouts (None: this one parks nothing) and
    # since when; the trainer's half, when it came in before theirs.
    awaiting: set[int] | None = None
    parked_at: float = 0.0
    trainer: tuple[bool, str] | None = None

    @property
    def parks(self) -> bool:
        """It keeps what is in flight (a stop's checkpoint): no more work goes out."""
        return self.awaiting is not None

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "step": self.step,
            "requested_at": self.requested_at,
            "then_stop": self.then_stop,
        }
        if self.awaiting is not None:  # as JSON: the drivers still to report as a list
            out |= {"parking": sorted(self.awaiting), "parked_at": self.parked_at}
        return out


class Checkpoints:
    def __init__(self, save: SaveCheckpoint | None, clock: Callable[[], float]) -> None:
        self.save = save
        self.clock = clock
        self.pending: PendingCheckpoint | None = None
        self.records: list[dict[str, Any]] = []  # saved and failed, in order
        self._unreported: list[dict[str, Any]] = []
        self._stop_after_step: str | None = None  # a stop waiting for the step in training

    @property
    def busy(self) -> bool:
        """A checkpoint, or a stop that will take one, holds the next batch back."""
        return self.pending is not None or self._stop_after_step is not None

    @property
    def stopping(self) -> bool:
        """A stop is already on its way (after the step in training, or a checkpoint)."""
        return self._stop_after_step is not None or (
            self.pending is not None and self.pending.then_stop is not None
        )

    def saved(self, step: int) -> bool:
        last = self.records[-1] if self.records else None
        return last is not None and last["step"] == step and last["ok"]

    def request(self, step: int, then_stop: str | None) -> bool:
        """Start one for ``step``; False when there is no saver or one is pending."""
        if self.save is None or self.pending:
            return False
        self.pending = PendingCheckpoint(step, self.clock(), then_stop)
        return True

    @property
    def holds_work(self) -> bool:
        """The pending checkpoint keeps what is in flight: no more work goes out."""
        return self.pending is not None and self.pending.parks

    def defer_stop(self, reason: str) -> None:
        """A stop that waits for the step in training, then checkpoints."""
        self._stop_after_step = reason

    def stop_after_it(self, reason: str) -> None:
        """The pending checkpoint is followed by a stop."""
        assert self.pending is not None
        self.pending.then_stop = reason

    def take_stop_after_step(self) -> str | None:
        """The stop that waited for the step in training, now due (once)."""
        reason, self._stop_after_step = self._stop_after_step, None
        return reason

    def start_parking(self, drivers: Iterable[int]) -> None:
        """The pending checkpoint waits for these drivers' parked rollouts too."""
        assert self.pending is not None
        self.pending.awaiting, self.pending.parked_at = set(drivers), self.clock()

    def parked(self, rank: int) -> bool:
        """``rank``'s parked rollouts are in; False if they were not awaited."""
        pending = self.pending
        if pending is None or pending.awaiting is None or rank not in pending.awaiting:
            return False
        pending.awaiting.discard(rank)
        return True

    def stop_waiting_for(self, ranks: Iterable[int]) -> int:
        """Drivers that will never report (lost, or past the time limit): how many were
        still awaited."""
        pending = self.pending
        if pending is None or not pending.awaiting:
            return 0
        gone = pending.awaiting & set(ranks)
        pending.awaiting -= gone
        return len(gone)

    def parking_overdue(self, now: float, timeout_s: float) -> bool:
        pending = self.pending
        return (
            pending is not None and bool(pending.awaiting) and now - pending.parked_at > timeout_s
        )

    def end(
        self,
        trainer_ok: bool,
        error: str,
        policy_version: int,
        state: Callable[[], dict[str, Any]],
        parked: Callable[[], dict[str, int]] | None = None,
    ) -> str | None:
        """Close the pending checkpoint (the trainer's half done or failed); returns the
        reason of a stop that waited for it, if any. ``parked``: what a stop's checkpoint
        kept of the requests in flight, for its record."""
        pending = self.pending
        assert pending is not None
        self.pending = None
        record: dict[str, Any] = {
            "step": pending.step,
            "policy_version": policy_version,
            "ok": False,
        }
        if not trainer_ok:
            record["error"] = f"trainer: {error}"
        else:
            assert self.save is not None
            try:
                record["path"] = self.save(pending.step, policy_version, state())
                record["ok"] = True
            except Exception as exc:  # disk full, permissions: the run goes on without it
                record["error"] = f"{type(exc).__name__}: {exc}"[:1000]
        record["took_s"] = round(self.clock() - pending.requested_at, 3)
        if pending.parks and parked is not None:
            record["parked_rollouts"] = parked()
        self.records.append(record)
        self._unreported.append(record)  # into the next step's metrics line
        return pending.then_stop

    def overdue(self, now: float, timeout_s: float) -> bool:
        return self.pending is not None and now - self.pending.requested_at > timeout_s

    def take_unreported(self) -> list[dict[str, Any]]:
        out, self._unreported = self._unreported, []
        return out

    def status(self) -> dict[str, Any]:
        return {
            "pending": None if self.pending is None else self.pending.status(),
            "last": next((c for c in reversed(self.records) if c["ok"]), None),
            "failed": sum(1 for c in self.records if not c["ok"]),
        }
