"""Hand-overs at rank 0: a rollout driver leaving the rollout pool passes on its work.

When a role switch takes a driver out of the rollout pool (the reclaim of a lend,
runtime/control/lends.py; a rebalance), the rank cuts off what it generates and reports
what it had of each request (``Parked``, the message of a stop's checkpoint), after the
samples it finished (one connection keeps the order). Its requests stay outstanding there
until that report, so they count against ``B_max`` and staleness admission as before and a
sample it finished just before leaving is taken, not refused as a stale worker's. Then
they go back to the front of the queue, each carrying its parked rollout: the next rollout
rank continues it (a partial rollout across ranks, spans and versions as generated) instead
of generating it again, if the current policy generated it (an older one would make a
sample older than a new one: from the prompt, it is young). A report that does not
come within ``HAND_OVER_TIMEOUT_S``, or a rank lost meanwhile, sends them back from their
prompts: nothing is lost, and nothing waits for the rank.

Outside ``colocated_sync`` only (:meth:`runtime.control.run.Run.hands_over`).
"""

from __future__ import annotations

from runtime.control import lifecycle
from runtime.control.membership import Outgoing
from runtime.control.run import Run
from runtime.data.sample import ParkedRollout
from runtime.transport import protocol as p


def on_parked(c: Run, identity: bytes, msg: p.Parked) -> list[Outgoing]:
    """A ``Parked`` report: a hand-over when rank 0 awaits one from the rank, else a
    stop's parked rollouts (runtime/control/lifecycle.py), else refused there."""
    if c.known(identity, msg.rank) is None:
        return []
    if not c.data.handing_over(msg.rank):
        return lifecycle.on_parked(c, identity, msg)
    c.data.hand_over(msg.rank, of_the_current_policy(c, lifecycle.checked_parked(c, msg)))
    return []


def of_the_current_policy(c: Run, rollouts: dict[int, ParkedRollout]) -> dict[int, ParkedRollout]:
    """The parked rollouts worth continuing: those whose age (``reflow.age_from``: the
    oldest span's version, or the newest's) is the current policy version, so that the
    sample is no older than one generated again would be. An older one goes back from its
    prompt (counted ``too_old_to_continue``): continued, its sample is older than its
    request's admission assumed, and in simulation such samples were evicted before any
    batch took them (ReTool 8B/16 fell from 1.01x to 0.82x of its baseline). A switch of
    the allocator comes right after a weight sync, when everything in flight began under
    an older policy: by the oldest span (the default) it carries nothing, and only a lend's
    reclaim, inside a step, hands work on; by the newest span a rollout held across that
    sync is carried too."""
    newest = c.cfg.reflow.age_from == "newest_span"
    kept: dict[int, ParkedRollout] = {}
    for sid, rollout in rollouts.items():
        versions = [v for v, _, _ in rollout.versions]
        if (max(versions) if newest else min(versions)) >= c.policy_version:
            kept[sid] = rollout
        else:
            c.data.count_parked("too_old_to_continue")
    return kept


def expire(c: Run) -> None:
    """Hand-overs past their bound: those requests go back from their prompts."""
    c.data.hand_overs_due(c.clock())
