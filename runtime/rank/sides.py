"""The two sides of a hybrid worker and the registry they are chosen from.

A :class:`HybridWorker` holds one object per role; exactly one is active. ``activate``
wakes a side (engine wake-up, weights onto the device), ``deactivate`` puts it to sleep
(KV cache freed, weights and optimizer offloaded). ``step`` does a bounded slice of work
and returns quickly so the worker can keep heartbeating and hear commands.

Sides are looked up by the names in the recipe's ``engine`` section through
:mod:`runtime.engines.registry`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from typing import Protocol

from runtime.config.layout import LayoutChange
from runtime.transport import protocol as p
from runtime.transport.protocol import Message

Send = Callable[[Message], object]

# A request to rank 0 with no answer for this long is asked again: the request or its
# answer was lost (rank 0 answers at once, with work or with "nothing now").
REASK_S = 10.0


class RoleSide(Protocol):
    name: str

    def attach(self, send: Send, rank: int) -> None:
        """Called once: how to send to the coordinator, and this side's rank."""
        ...

    def on_message(self, msg: Message) -> None:
        """A coordinator message for the active side (work, batches, acks)."""
        ...

    def activate(self) -> None: ...

    def deactivate(self) -> None: ...

    def on_layout(self, change: LayoutChange) -> None:
        """Called on both sides of every rank after a role switch (collectives allowed)."""
        ...

    def step(self) -> None: ...

    def close(self) -> None:
        """Release engines and their processes (the rank is exiting)."""
        ...

    @property
    def state(self) -> str: ...


class PlaceholderSide:
    """A side with no engine: activation/deactivation are recorded, work is nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.active = False
        self.activations = 0
        self.activated_at: float | None = None

    def attach(self, send: Send, rank: int) -> None:
        self.rank = rank

    def on_message(self, msg: Message) -> None:
        """Nothing to do: a placeholder asks rank 0 for nothing."""

    def activate(self) -> None:
        self.active = True
        self.activations += 1
        self.activated_at = time.monotonic()

    def deactivate(self) -> None:
        self.active = False

    def on_layout(self, change: LayoutChange) -> None:
        """No state to move."""

    def step(self) -> None:
        time.sleep(0)  # nothing to do; the worker's poll timeout paces the loop

    def close(self) -> None:
        self.active = False

    @property
    def state(self) -> str:
        return "idle"


def placeholder_rollout(
    cfg: object, rank: int, paths: object, collective: object = None
) -> PlaceholderSide:
    return PlaceholderSide("rollout")


def placeholder_trainer(
    cfg: object, rank: int, paths: object, collective: object = None
) -> PlaceholderSide:
    return PlaceholderSide("trainer")


class LinkedSide:
    """Base of the sides that talk to rank 0: the send function, the rank, an on/off
    switch and the request bookkeeping they all need."""

    name = ""

    def __init__(self, cfg: object, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.active = False
        self._asked = False  # a request to rank 0 is unanswered
        self._asked_at = 0.0
        self._retry_at = 0.0  # after a "nothing now" answer, ask again from then on
        self._send: Send = lambda m: None

    def attach(self, send: Send, rank: int) -> None:
        self._send, self.rank = send, rank

    def activate(self) -> None:
        self.active = True

    def deactivate(self) -> None:
        self.active = False

    def on_layout(self, change: LayoutChange) -> None:
        """No state to move by default."""

    def close(self) -> None:
        self.active = False

    def _may_ask(self, now: float) -> bool:
        """No request unanswered (or its answer overdue), and not told to wait."""
        return (not self._asked or now - self._asked_at > REASK_S) and now >= self._retry_at

    def _ask(self, msg: Message, now: float) -> None:
        self._asked, self._asked_at = bool(self._send(msg)), now


class BatchConsumer(LinkedSide, abc.ABC):
    """A trainer side: its leader pulls batches from rank 0 one at a time.

    The leader is rank 0, where the trainer pool always starts (runtime.config.layout). Rank 0
    sends each batch to every trainer rank: data-parallel engines train their shard, the
    others train on the leader only. Subclasses implement ``train_batch`` (train; the
    leader then sends StepDone) and ``observe`` (the run's step and version from rank 0).
    """

    name = "trainer"
    retry_s = 0.05  # after "no batch yet"

    @property
    def state(self) -> str:
        return "busy" if self._asked else "idle"

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def observe(self, step: int, policy_version: int) -> None: ...

    @abc.abstractmethod
    def train_batch(self, msg: p.Batch) -> None: ...

    def before_request(self) -> None:
        """Called on the leader before each batch request (e.g. a first evaluation)."""

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, p.HeartbeatAck):
            self.observe(msg.step, msg.policy_version)
        elif isinstance(msg, p.BatchWait):
            self._asked = False
            self._retry_at = time.monotonic() + self.retry_s
        elif isinstance(msg, p.Batch):
            self._asked = False
            if msg.batch_id <= self.last_batch_id:
                return  # sent again after a lost one; this rank has trained it
            self.train_batch(msg)
            self.last_batch_id = msg.batch_id

    last_batch_id = -1  # the newest batch this rank trained

    def step(self) -> None:
        if not (self.active and self.leader):
            return
        self.before_request()
        now = time.monotonic()
        if self._may_ask(now):
            self._ask(p.BatchRequest(rank=self.rank, last_batch_id=self.last_batch_id), now)
