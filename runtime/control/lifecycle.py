"""Stopping and resuming at rank 0: a graceful stop after a checkpoint, the checkpoint
round trip with the trainer leader, and what a checkpoint keeps of rank 0.

The books (pending, records, a stop waiting for the step in training) are
:class:`runtime.control.checkpoints.Checkpoints`; the run's states are
:class:`runtime.transport.states.RunState`.
"""

from __future__ import annotations

from typing import Any

from runtime.config.layout import Role
from runtime.control import colocation
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.data.sample import sample_digest
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState

STATE_FORMAT = 3  # of the coordinator's state in a checkpoint (3: versions per sync)


def request_stop(c: Run, reason: str) -> list[Outgoing]:
    """Graceful stop (CLI, SIGTERM, SIGUSR2): a checkpoint of the current step first
    (after the batch in training, if any), then every rank is told to leave."""
    if c.state in TERMINAL or c.state == RunState.STOPPING or c.ckpt.stopping:
        return []
    if c.state == RunState.RUNNING and c.training_started:
        c.reason = f"stopping after a checkpoint: {reason}"
        # colocated, every rank generating: the trainer state is off the device, so the
        # checkpoint is taken after the train phase's next step
        generating = colocation.is_colocated(c) and colocation.phase(c).value == "rollout"
        if c.batch_in_flight is not None or generating:
            c.ckpt.stop_after_step = reason
            return []
        return checkpoint_then_stop(c, reason)
    return stop_now(c, reason)


def stop_now(c: Run, reason: str) -> list[Outgoing]:
    if c.state in TERMINAL or c.state == RunState.STOPPING:
        return []
    c.state, c.reason = RunState.STOPPING, reason
    return c.members.send(p.Stop(reason=reason))


def checkpoint_then_stop(c: Run, reason: str) -> list[Outgoing]:
    if c.ckpt.saved(c.step):
        return stop_now(c, reason)  # this step is saved already
    if c.ckpt.pending is not None:  # one is being written: stop after it
        c.ckpt.pending["then_stop"] = reason
        return []
    out = request_checkpoint(c, then_stop=reason)
    return out if c.ckpt.pending is not None else stop_now(c, reason)


def request_checkpoint(c: Run, then_stop: str | None) -> list[Outgoing]:
    leader = c.members.leader()
    if leader is None or not c.ckpt.request(c.step, then_stop):
        return []
    # Every trainer rank writes its own shards (torch.distributed.checkpoint); the leader
    # stages the folder first and reports for the group.
    return c.members.send(p.Checkpoint(step=c.step), c.layout.ranks(Role.TRAINER))


def on_checkpoint_saved(c: Run, identity: bytes, msg: p.CheckpointSaved) -> list[Outgoing]:
    if c.known(identity, msg.rank) is None:
        return []
    pending = c.ckpt.pending
    if msg.rank != 0 or pending is None or msg.step != pending["step"]:
        c.reject("unexpected_checkpoint")
        return []
    return end_checkpoint(c, msg.ok, msg.error)


def end_checkpoint(c: Run, trainer_ok: bool, error: str) -> list[Outgoing]:
    then_stop = c.ckpt.end(trainer_ok, error, c.policy_version, lambda: coordinator_state(c))
    if then_stop is not None:
        return stop_now(c, then_stop)
    return colocation.advance(c)  # a colocated train phase waited for the checkpoint


# --- what a checkpoint keeps of rank 0 ------------------------------------------------


def coordinator_state(c: Run) -> dict[str, Any]:
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


def restore(c: Run, state: dict[str, Any], source: str = "") -> None:
    """Continue a run from :func:`coordinator_state` (before any rank registers)."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"coordinator state format {state.get('format')!r}")
    assert not c.workers, "restore before the ranks register"
    if not colocation.is_colocated(c):  # colocated: resumed in a rollout phase, as it starts
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


def buffer_digest(c: Run) -> dict[str, Any]:
    """Sample ids and checksums of everything the buffer holds, and the queue."""
    held = sorted(c.data.buffer.samples(), key=lambda t: t.sample_id)
    return {
        "samples": {str(t.sample_id): sample_digest(t) for t in held},
        "pending": [r.sample_id for r in c.data.dispatcher.pending],
        "prompts_drawn": c.data.dispatcher._next_prompt,
    }
