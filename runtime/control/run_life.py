"""The run's own course at rank 0: its state and why, when it started and ended, which
attempt it is and what it resumed from. One record, changed by
:class:`runtime.control.run.Run` alone (its state only through :meth:`RunLife.enter`); the
handlers, the server and the simulator read it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.transport.states import TERMINAL, RunState


@dataclass
class RunLife:
    started_at: float  # rank 0's clock when the run began (registration included)
    state: RunState = RunState.STARTING
    reason: str = ""  # why it is in its state (a stop's, a failure's), or what it does
    ended_at: float | None = None  # when it reached a terminal state
    attempt: int = 1  # 1 + the number of resumes of this run
    # what the checkpoint it went on from held (step, buffer...), None for a fresh start
    resumed: dict[str, Any] | None = None
    # it failed after a step was trained: what a restart from the last checkpoint is for
    # (failing to start, or a bad recipe, would fail the same way again)
    failed_while_training: bool = False

    def enter(self, state: RunState, now: float, reason: str | None = None) -> None:
        """The run is now in ``state`` (``reason``: why; None keeps the last one)."""
        self.state = state
        if reason is not None:
            self.reason = reason
        if state in TERMINAL:
            self.ended_at = now

    def fail_or_end(self, state: RunState, now: float, reason: str, trained: bool) -> None:
        """A terminal ``state``; ``trained``: a step had been trained (in any attempt)."""
        self.failed_while_training = state == RunState.FAILED and trained
        self.enter(state, now, reason)

    def resume(self, attempt: int, brief: dict[str, Any]) -> None:
        """This run goes on from a checkpoint of attempt ``attempt - 1``."""
        self.attempt, self.resumed = attempt, brief

    @property
    def resumed_at_step(self) -> int:
        """The step the run went on from (0: a fresh start)."""
        return int(self.resumed["step"]) if self.resumed else 0
