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
from runtime.transport import protocol as p


def on_parked(c: Run, identity: bytes, msg: p.Parked) -> list[Outgoing]:
    """A ``Parked`` report: a hand-over when rank 0 awaits one from the rank, else a
    stop's parked rollouts (runtime/control/lifecycle.py), else refused there."""
    if c.known(identity, msg.rank) is None:
        return []
    if not c.data.handing_over(msg.rank):
        return lifecycle.on_parked(c, identity, msg)
    c.data.hand_over(msg.rank, lifecycle.checked_parked(c, msg))
    return []


def expire(c: Run) -> None:
    """Hand-overs past their bound: those requests go back from their prompts."""
    c.data.hand_overs_due(c.clock())
