"""Stopping and checkpoints at rank 0: when one is asked for, what became of it, stop after it.

Checkpoints (``train.checkpoint_every`` and before a graceful stop) are taken at a step
boundary: no batch is handed out while one is pending; the trainer leader writes its state
(``Checkpoint`` -> ``CheckpointSaved``), then the injected ``save`` writes the
coordinator's state next to it and seals the folder (runtime/store/checkpoint.py). A stop
that waits for a checkpoint is carried here as ``then_stop`` (its reason).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.data.sample import trajectory_digest
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState

if TYPE_CHECKING:
    from runtime.control.coordinator import Coordinator, Outgoing

STATE_FORMAT = 1  # of the coordinator's state in a checkpoint
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
        return {
            "pending": self.pending,
            "last": next((c for c in reversed(self.records) if c["ok"]), None),
            "failed": sum(1 for c in self.records if not c["ok"]),
        }


# --- what the coordinator does with them ----------------------------------------------


def request_stop(c: Coordinator, reason: str) -> list[Outgoing]:
    """Graceful stop (CLI, SIGTERM, SIGUSR2): a checkpoint of the current step first
    (after the batch in training, if any), then every rank is told to leave."""
    if c.state in TERMINAL or c.state == RunState.STOPPING or c.ckpt.stopping:
        return []
    if c.state == RunState.RUNNING and c.training_started:
        c.reason = f"stopping after a checkpoint: {reason}"
        if c.batch_in_flight is not None:
            c.ckpt.stop_after_step = reason
            return []
        return checkpoint_then_stop(c, reason)
    return stop_now(c, reason)


def stop_now(c: Coordinator, reason: str) -> list[Outgoing]:
    if c.state in TERMINAL or c.state == RunState.STOPPING:
        return []
    c.state, c.reason = RunState.STOPPING, reason
    return c.members.send(p.Stop(reason=reason))


def checkpoint_then_stop(c: Coordinator, reason: str) -> list[Outgoing]:
    if c.ckpt.saved(c.step):
        return stop_now(c, reason)  # this step is saved already
    if c.ckpt.pending is not None:  # one is being written: stop after it
        c.ckpt.pending["then_stop"] = reason
        return []
    out = request_checkpoint(c, then_stop=reason)
    return out if c.ckpt.pending is not None else stop_now(c, reason)


def request_checkpoint(c: Coordinator, then_stop: str | None) -> list[Outgoing]:
    leader = c.members.leader()
    if leader is None or not c.ckpt.request(c.step, then_stop):
        return []
    return [(leader.identity, p.Checkpoint(step=c.step))]


def on_checkpoint_saved(c: Coordinator, identity: bytes, msg: p.CheckpointSaved) -> list[Outgoing]:
    if c.known(identity, msg.rank) is None:
        return []
    pending = c.ckpt.pending
    if msg.rank != 0 or pending is None or msg.step != pending["step"]:
        c.reject("unexpected_checkpoint")
        return []
    return end_checkpoint(c, msg.ok, msg.error)


def end_checkpoint(c: Coordinator, trainer_ok: bool, error: str) -> list[Outgoing]:
    then_stop = c.ckpt.end(trainer_ok, error, c.policy_version, c.state_dict)
    return stop_now(c, then_stop) if then_stop is not None else []


# --- what a checkpoint keeps of rank 0 ------------------------------------------------


def coordinator_state(c: Coordinator) -> dict[str, Any]:
    """What a resumed run needs from rank 0 (between batches only)."""
    return {
        "format": STATE_FORMAT,
        "run": c.run,
        "attempt": c.attempt,
        "step": c.step,
        "policy_version": c.policy_version,
        "layout": [c.layout.n_rollout_ranks, c.layout.n_trainer_ranks],
        "data": c.data.state_dict(),
        "consumed_total": c.counters.consumed_total,
        "generated_tokens": c.counters.generated_tokens,
        "evals": dict(c.evals),
        "auto_rebalance": c.auto_rebalance,
        "saved_at": c.wall(),
    }


def restore(c: Coordinator, state: dict[str, Any], source: str = "") -> None:
    """Continue a run from :func:`coordinator_state` (before any rank registers)."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"coordinator state format {state.get('format')!r}")
    assert not c.workers, "restore before the ranks register"
    rollout, trainer = state["layout"]
    c.rebalance.layout = c.layout.with_ratio(rollout, trainer)
    c.data.load_state_dict(state["data"])
    c.step = int(state["step"])
    c.policy_version = int(state["policy_version"])
    c.training_started = c.step > 0
    c.attempt = int(state["attempt"]) + 1
    c.counters.consumed_total = int(state["consumed_total"])
    c.counters.generated_tokens = int(state["generated_tokens"])
    c.counters.tokens_at_last_step = c.counters.generated_tokens
    c.evals = dict(state["evals"])
    c.rebalance.auto = bool(state["auto_rebalance"])
    c.rebalance.allocator.changed(c.step)
    c.resumed = {
        "from": source,
        "step": c.step,
        "policy_version": c.policy_version,
        "buffer": buffer_digest(c),
    }


def buffer_digest(c: Coordinator) -> dict[str, Any]:
    """Sample ids and checksums of everything the buffer holds, and the queue."""
    held = sorted(c.data.buffer.samples(), key=lambda t: t.sample_id)
    return {
        "samples": {str(t.sample_id): trajectory_digest(t) for t in held},
        "pending": [r.sample_id for r in c.data.dispatcher.pending],
        "prompts_drawn": c.data.dispatcher._next_prompt,
    }
