"""Rollout work at rank 0: requests out to the rollout ranks, finished samples back in.

A rank asks for ``slots`` (``WorkRequest``); the generation scheduler grants what its
concurrency cap and token admission allow and the data plane hands out requests. The cap
counts only the rank's episodes that generate: those it reports waiting on a tool call or
a reward (``in_tools``, clamped to what rank 0 has running there) hold no slot. A
finished sample (``SampleDone``) is checked against the request it answers before it enters
the buffer; a failed one (``SampleFailed``) is requeued.

Work goes to the drivers of the rollout replicas only (one engine per replica: with
``rollout_gpus_per_replica > 1`` the other ranks of a group are its tensor-parallel
workers, runtime/rank/tp_member.py): a work request from one of them is refused, counted
(``work_from_tp_member``) and answered with nothing, and caps, token admission and idle
accounting are per driver, that is per replica.
"""

from __future__ import annotations

from runtime.config.layout import Role
from runtime.control import colocation, eval_work, lends, telemetry
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.control.sample_check import sample_problem
from runtime.data.sample import Request
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.states import TERMINAL, RunState


def on_work_request(c: Run, identity: bytes, msg: p.WorkRequest) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    requests: list[Request] = []
    if c.ckpt.holds_work:
        # the run stops after this checkpoint, which takes what is in flight: no more
        return [(identity, wire.work_message(requests, c.policy_version))]
    if not c.members.drives(msg.rank):
        c.messages.reject("work_from_tp_member")
        return [(identity, wire.work_message(requests, c.policy_version))]
    if msg.rank in c.members.lost:  # rejoining: no work before the epoch that brings the weights
        return [(identity, wire.work_message(requests, c.policy_version))]
    if c.state == RunState.RUNNING and c.layout.role_of(msg.rank) == Role.ROLLOUT:
        eval_work.at_first_work(c)
        for_evals = eval_work.work_for(c, msg.rank, msg.slots)
        if for_evals is not None:  # the pinned driver's episodes, or none for a while
            return [(identity, for_evals)]
        gen = c.generation
        running = c.data.running_at(msg.rank)
        in_tools = tools_waiting(c, msg, running)
        generating = running - in_tools
        slots = gen.grant(msg.rank, msg.slots, generating)
        if colocation.is_colocated(c):
            slots = min(slots, colocation.rank_share(c, msg.rank))
        if slots < msg.slots:
            c.data.count_blocked("concurrency_cap")

        def admit(r: Request) -> bool:
            prompt_ids = r.prompt.get("prompt_ids") or ()
            return gen.admit(msg.rank, r.sample_id, r.group_id, len(prompt_ids), in_tools)

        refused = "concurrency_cap" if slots < msg.slots else None
        if slots:
            requests = c.data.request_work(msg.rank, slots, admit)
            refused = c.data.last_refusal or refused
        # the share of the rank's slots left empty: its free ones not filled now (an
        # episode in a tool call holds no slot)
        empty = (msg.slots - len(requests)) / max(generating + msg.slots, 1)
        c.idle.rank_is(msg.rank, refused, c.clock(), empty)
    return [(identity, wire.work_message(requests, c.policy_version))]


def tools_waiting(c: Run, msg: p.WorkRequest, running: int) -> int:
    """The rank's episodes that wait on a tool call or a reward (``msg.in_tools``), as far
    as rank 0 can believe it: at most what rank 0 has running there. A claim of more is
    counted (``in_tools_over_running``; one honest way: rank 0 timed out and requeued a
    request whose copy still waits in a tool at the rank) and taken as all of them in
    tools, so the rank gets no more than a rank whose every episode waits in a tool: its
    cap, never the claim. Across ranks ``B_max`` and staleness admission bound the total."""
    if msg.in_tools > running:
        c.messages.reject("in_tools_over_running")
        return running
    return msg.in_tools


def on_sample_done(c: Run, identity: bytes, msg: p.SampleDone) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    # Whatever becomes of it, rank 0 has decided: the rank may forget it (sending it
    # again would not change the decision).
    w.to_ack.append(msg.sample_id)
    t = wire.sample(msg)
    request = c.data.outstanding_at(t.sample_id, msg.rank)
    if request is not None:
        why = sample_problem(t, request, policy_version=c.policy_version, bounds=c.bounds)
        if why is not None:
            c.data.refuse(t.sample_id, msg.rank, why)
            c.generation.finished(t.sample_id, None)
            return []
    if not c.data.deliver(t):  # (counted there: a result not owed by this rank)
        return []
    w.failures_in_a_row = 0
    c.counters.delivered_sample(t.reward, len(t.token_ids))
    c.generation.finished(t.sample_id, len(t.token_ids))
    if c.cfg.logging.samples:
        c.reports.new_samples.append(telemetry.sample_record(t, msg.rank))
    # the rollout phase may be complete; a lend may be over
    return colocation.advance(c) + lends.sample_arrived(c)


def on_sample_failed(c: Run, identity: bytes, msg: p.SampleFailed) -> list[Outgoing]:
    w = c.known(identity, msg.rank)
    if w is None:
        return []
    w.to_ack.append(msg.sample_id)
    if not c.data.failed(msg.sample_id, msg.rank):
        return []
    c.generation.finished(msg.sample_id, None)
    # The sample is requeued. An engine that fails every generation (a model it cannot
    # serve) would requeue forever; past a limit the run fails and says why.
    w.failures_in_a_row += 1
    limit = c.cfg.control.max_generation_failures
    if limit and w.failures_in_a_row >= limit and c.state not in TERMINAL:
        return c.finish(
            RunState.FAILED,
            f"rank {msg.rank}: {w.failures_in_a_row} generations in a row failed, "
            f"last: {msg.reason}",
        )
    return []
