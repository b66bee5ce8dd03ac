"""Stopping and resuming at rank 0: a graceful stop after a checkpoint, the checkpoint
round trip with the trainer leader, and what a checkpoint keeps of rank 0.

The books (pending, records, a stop waiting for the step in training) are
:class:`runtime.control.checkpoints.Checkpoints`; the run's states are
:class:`runtime.transport.states.RunState`.
"""

from __future__ import annotations

from typing import Any

from runtime.config.layout import Role
from runtime.control import colocation, eval_work
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.control.sample_check import sample_problem
from runtime.data.sample import ParkedRollout, Request, Sample
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState

STATE_FORMAT = 3  # of the coordinator's state in a checkpoint (3: versions per sync)


def request_stop(c: Run, reason: str) -> list[Outgoing]:
    """Graceful stop (CLI, SIGTERM, SIGUSR2): a checkpoint of the current step first
    (after the batch in training, if any), then every rank is told to leave."""
    if c.state in TERMINAL or c.state == RunState.STOPPING or c.ckpt.stopping:
        return []
    if c.state == RunState.RUNNING and c.lends is not None and c.lends.active is not None:
        # the trainer's groups generate: they come back first (runtime/control/lends.py)
        c.explain(f"stopping after a checkpoint: {reason}")
        c.lends.stop_after_reclaim(reason)
        return []
    if c.state == RunState.RUNNING and c.training_started:
        c.explain(f"stopping after a checkpoint: {reason}")
        # colocated, every rank generating: the trainer state is off the device, so the
        # checkpoint is taken after the train phase's next step
        generating = colocation.is_colocated(c) and colocation.phase(c).value == "rollout"
        if c.batch_in_flight is not None or generating:
            c.ckpt.defer_stop(reason)
            return []
        return checkpoint_then_stop(c, reason)
    return c.stop_now(reason)


def checkpoint_then_stop(c: Run, reason: str) -> list[Outgoing]:
    eval_work.stopping(c)  # a round in flight is recorded, incomplete, before the checkpoint
    if c.ckpt.saved(c.step) and not c.data.has_outstanding:
        return c.stop_now(reason)  # this step is saved already, and nothing is in flight
    if c.ckpt.pending is not None:  # one is being written: stop after it
        c.ckpt.stop_after_it(reason)
        return park_rollouts(c)
    out = request_checkpoint(c, then_stop=reason)
    if c.ckpt.pending is None:
        return c.stop_now(reason)
    return out + park_rollouts(c)


def park_rollouts(c: Run) -> list[Outgoing]:
    """The checkpoint before a stop keeps what is in flight: every rollout replica's
    driver is told to stop generating and report its parked rollouts (``Parked``), and
    the coordinator's half of the checkpoint waits for them (at most ``PARK_TIMEOUT_S``;
    a rank that does not answer has its requests saved from their prompts, as before)."""
    pending = c.ckpt.pending
    if pending is None or pending.parks:
        return []
    live = {w.rank for w in c.members.alive()}
    drivers = [r for r in c.layout.ranks(Role.ROLLOUT) if c.members.drives(r) and r in live]
    c.ckpt.start_parking(drivers)
    return c.members.send(p.Park(step=pending.step), drivers) if drivers else []


def on_parked(c: Run, identity: bytes, msg: p.Parked) -> list[Outgoing]:
    """A driver's parked rollouts: each one checked against the request it says it is
    part of (outstanding at that rank, the run's vocabulary, lengths, log-probs and
    versions) and kept with it; the rest are refused, counted, and saved from the prompt."""
    if c.known(identity, msg.rank) is None:
        return []
    if not c.ckpt.parked(msg.rank):
        c.messages.reject("unexpected_parked")
        return []
    for sid, rollout in checked_parked(c, msg).items():
        c.data.keep_parked(sid, msg.rank, rollout)
    return end_when_parked(c)


def checked_parked(c: Run, msg: p.Parked) -> dict[int, ParkedRollout]:
    """The parked rollouts of ``msg`` that can be part of a request out at its rank; the
    others are refused and counted (their requests go on from the prompt)."""
    out: dict[int, ParkedRollout] = {}
    for sid, rollout in wire.parked(msg).items():
        request = c.data.outstanding_at(sid, msg.rank)
        why = "not_outstanding_there" if request is None else parked_problem(c, request, rollout)
        if why is not None:
            c.data.count_parked(f"refused_{why}")
            continue
        out[sid] = rollout
    return out


def parked_problem(c: Run, request: Request, rollout: ParkedRollout) -> str | None:
    """Why ``rollout`` cannot be part of ``request``'s generation (as a finished sample
    would be checked); None if it can."""
    longest = max(t.end - t.start for t in rollout.turns)
    if longest > c.cfg.workload.max_response_tokens:  # a turn's budget (agents/base.py)
        return "turn_too_long"
    stand_in = Sample(
        sample_id=request.sample_id,
        group_id=request.group_id,
        prompt_id=request.prompt_id,
        versions=rollout.versions,
        prompt_token_ids=list(request.prompt.get("prompt_ids") or ()),
        token_ids=rollout.token_ids,
        logprobs=rollout.logprobs,
        loss_mask=rollout.loss_mask,
        n_valid=sum(rollout.loss_mask),
        reward=0.0,
    )
    return sample_problem(stand_in, request, policy_version=c.policy_version, bounds=c.bounds)


def end_when_parked(c: Run, *, give_up: bool = False) -> list[Outgoing]:
    """The coordinator's half of a stop's checkpoint, once the trainer's half is in and
    every driver has reported (``give_up``: the ones that did not, never will)."""
    pending = c.ckpt.pending
    if pending is None:
        return []
    if give_up and pending.awaiting:
        c.data.count_parked("ranks_not_reported", c.ckpt.stop_waiting_for(set(pending.awaiting)))
    if pending.awaiting or pending.trainer is None:
        return []
    return end_checkpoint(c, *pending.trainer)


def request_checkpoint(c: Run, then_stop: str | None) -> list[Outgoing]:
    leader = c.members.leader()
    if leader is None or not c.ckpt.request(c.step, then_stop):
        return []
    # Every trainer rank of the epoch writes its own shards (torch.distributed.checkpoint);
    # the leader stages the folder first and reports for the group. A lost rank that
    # registered again and is not taken back yet is in no trainer group: not asked.
    return c.members.send(p.Checkpoint(step=c.step), c.trainer_ranks())


def on_checkpoint_saved(c: Run, identity: bytes, msg: p.CheckpointSaved) -> list[Outgoing]:
    if c.known(identity, msg.rank) is None:
        return []
    pending = c.ckpt.pending
    if msg.rank != 0 or pending is None or msg.step != pending.step:
        c.messages.reject("unexpected_checkpoint")
        return []
    return end_checkpoint(c, msg.ok, msg.error)


def end_checkpoint(c: Run, trainer_ok: bool, error: str) -> list[Outgoing]:
    pending = c.ckpt.pending
    if pending is not None and pending.awaiting and trainer_ok:
        pending.trainer = (trainer_ok, error)  # the parked rollouts are not all in yet
        return []
    then_stop = c.ckpt.end(
        trainer_ok, error, c.policy_version, lambda: coordinator_state(c), c.data.parked_kept
    )
    if then_stop is not None:
        return c.stop_now(then_stop)
    return colocation.advance(c)  # a colocated train phase waited for the checkpoint


# --- what a checkpoint keeps of rank 0 ------------------------------------------------


def coordinator_state(c: Run) -> dict[str, Any]:
    """What a resumed run needs from rank 0 (between batches only)."""
    return {
        "format": STATE_FORMAT,
        "run": c.run,
        "attempt": c.life.attempt,
        "step": c.step,
        "policy_version": c.policy_version,
        "layout": [c.layout.n_rollout_ranks, c.layout.n_trainer_ranks],
        "data": c.data.state_dict(),
        "consumed_total": c.counters.consumed_total,
        "generated_tokens": c.counters.generated_tokens,
        "evals": dict(c.reports.evals),
        "eval_rounds": c.evals.state_dict() if c.evals is not None else None,
        "auto_rebalance": c.auto_rebalance,
        "saved_at": c.wall(),
    }


def restore(c: Run, state: dict[str, Any], source: str = "") -> None:
    """Continue a run from :func:`coordinator_state` (before any rank registers)."""
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"coordinator state format {state.get('format')!r}")
    assert not c.workers, "restore before the ranks register"
    saved_layout = None
    if not colocation.is_colocated(c):  # colocated: resumed in a rollout phase, as it starts
        rollout, trainer = state["layout"]
        saved_layout = c.layout.with_ratio(rollout, trainer)
    c.data.load_state_dict(state["data"])  # the step and policy version with it
    if (c.step, c.policy_version) != (int(state["step"]), int(state["policy_version"])):
        raise ValueError("coordinator state: its step or version disagrees with its data's")
    c.counters.restore(int(state["consumed_total"]), int(state["generated_tokens"]))
    c.rebalance.resume(saved_layout, bool(state["auto_rebalance"]), c.step)
    brief = {"from": source, "step": c.step, "policy_version": c.policy_version}
    c.resumed_from(int(state["attempt"]) + 1, state["evals"], {**brief, "buffer": c.data.digest()})
    if c.evals is not None and state.get("eval_rounds"):  # (none before eval rounds)
        c.evals.load_state_dict(state["eval_rounds"])
