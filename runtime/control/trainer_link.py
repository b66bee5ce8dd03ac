"""Rank 0's side of the batch hand-off to the trainer ranks: when the batch in training
went out, and the copies a trainer rank missed, sent again with a backoff.

The batch itself is the data plane's (``DataPlane.batch_in_flight``); this is only the
delivery. Pure bookkeeping with the coordinator's clock; runtime/control/training.py
decides what to send.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A missed copy goes again at the next tick, and after each further miss of the same batch
# twice as late, up to once a second: a rank whose queue was full gets it at once, one that
# died (no pipe until its heartbeat timeout declares it lost) does not cost a batch's
# messages every tick (568 undeliverable copies in one 20 s timeout, measured).
RETRY_FIRST_BACKOFF_S = 0.05
RETRY_MAX_BACKOFF_S = 1.0


@dataclass
class TrainerLink:
    sent_at: float = 0.0  # when the batch in training went out (the step timeout's start)
    resent: int = 0  # copies sent again: asked again by the leader, or missed by a rank
    # trainer identity -> (batch id to send again, when), and that batch's last backoff
    _retry: dict[bytes, tuple[int, float]] = field(default_factory=dict)
    _backoff: dict[bytes, tuple[int, float]] = field(default_factory=dict)

    def sent(self, now: float) -> None:
        """A new batch went out to the trainer ranks."""
        self.sent_at = now

    def sent_again(self) -> None:
        self.resent += 1

    def overdue(self, now: float, timeout_s: float) -> bool:
        """The batch in training went out more than ``timeout_s`` ago (the caller knows
        whether one is in training)."""
        return now - self.sent_at > timeout_s

    @property
    def retrying(self) -> bool:
        return bool(self._retry)

    def missed(self, identity: bytes, batch_id: int, now: float) -> None:
        """``identity``'s copy of ``batch_id`` could not be handed over: again at once the
        first time, then with a doubling delay up to :data:`RETRY_MAX_BACKOFF_S`."""
        last, delay = self._backoff.get(identity, (None, 0.0))
        if last == batch_id:
            delay = min(RETRY_MAX_BACKOFF_S, max(RETRY_FIRST_BACKOFF_S, 2 * delay))
        else:
            delay = 0.0
        self._backoff[identity] = (batch_id, delay)
        self._retry[identity] = (batch_id, now + delay)

    def due(self, now: float) -> dict[bytes, int]:
        """The copies to send again now (identity -> batch id), each taken off the list."""
        due = {i: b for i, (b, at) in self._retry.items() if at <= now}
        for identity in due:
            del self._retry[identity]
        return due
