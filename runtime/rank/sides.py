"""The two sides of a hybrid worker and the registry they are chosen from.

A :class:`HybridWorker` holds one object per role; exactly one is active. ``activate``
wakes a side (engine wake-up, weights onto the device), ``deactivate`` puts it to sleep
(KV cache freed, weights and optimizer offloaded). ``step`` does a bounded slice of work
and returns quickly so the worker can keep heartbeating and hear commands.

Sides are looked up by the names in the recipe's ``engine`` section through
:mod:`runtime.engines.registry`. Rollout sides pull work through the shared loop of
:mod:`runtime.rank.rollout_loop`; trainer sides pull batches as a :class:`BatchConsumer`;
both ask rank 0 through a :class:`PullGate`.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable
from pathlib import Path

from runtime.config.layout import LayoutChange
from runtime.transport import protocol as p
from runtime.transport.protocol import Message

Send = Callable[[Message], object]

# A request to rank 0 with no answer for this long is asked again: the request or its
# answer was lost (rank 0 answers at once, with work or with "nothing now").
REASK_S = 10.0

Keepalive = Callable[[], None]


def nothing() -> None:
    """A keepalive that sends nothing (a side attached without a rank's heartbeat)."""


class CannotCheckpoint(Exception):
    """A side with no checkpoint of its own (its own class: a NotImplementedError from
    deep inside a real save is a failed save, not this)."""


class RoleSide(abc.ABC):
    """One role of a hybrid worker, as the worker calls it. Every capability the worker
    uses is declared here with what a side without it does, so the worker calls it
    without probing; tests/unit/test_side_contract.py checks that each engine's sides
    override the capabilities they have (an override with a misspelt name would leave
    the default: no checkpoint, no resume, no colocated weights)."""

    name: str = ""
    rank: int = 0
    active: bool = False

    @abc.abstractmethod
    def attach(self, send: Send, rank: int, keepalive: Keepalive = nothing) -> None:
        """Called once: how to send to the coordinator, this side's rank, and the rank's
        heartbeat (for work that blocks the rank's loop for long: a held-out eval)."""

    @abc.abstractmethod
    def on_message(self, msg: Message) -> None:
        """A coordinator message for the active side (work, batches, acks)."""

    @abc.abstractmethod
    def activate(self) -> None: ...

    @abc.abstractmethod
    def deactivate(self) -> None: ...

    def hand_over(self) -> None:
        """Leaving this role while work runs here: report it to rank 0 for another rank to
        go on with (runtime/control/hand_over.py). Nothing to report by default."""
        return None  # a default, not a stub (the class doc)

    def on_layout(self, change: LayoutChange) -> None:
        """Called on both sides of every rank after a role switch (collectives allowed);
        no state to move by default."""
        return None  # a default, not a stub (the class doc)

    @abc.abstractmethod
    def step(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None:
        """Release engines and their processes (the rank is exiting)."""

    @property
    @abc.abstractmethod
    def state(self) -> str: ...

    # --- capabilities, with what a side without them does ----------------------------

    @property
    def leader(self) -> bool:
        """Whether this rank reports for its group (a checkpoint's part): yes, alone."""
        return True

    @property
    def waiting_on(self) -> str:
        """What the side waits for between calls, for the heartbeat ("" = nothing)."""
        return ""

    def save_checkpoint(self, checkpoints: Path, step: int) -> None:
        """Write this rank's part of checkpoint ``step`` under ``checkpoints``."""
        raise CannotCheckpoint("this engine cannot checkpoint")

    def restore(self, folder: Path) -> None:
        """Load this rank's part of the checkpoint in ``folder``: no state by default."""
        return None  # a default, not a stub (the class doc)

    def engine_stats(self) -> dict[str, float]:
        """The engine's load for the heartbeat (KV use, preemptions): none by default."""
        return {}

    def engine_weights(self) -> tuple[int, object] | None:
        """Mode colocated_sync: this version's weights for the rank's own engine (None: a
        side with no weights to give)."""
        return None

    def lend_weights(self) -> tuple[int, object] | None:
        """A lend (runtime/rank/worker.py, ``lend_switch``): the published version's weights
        for the rank's own engine (None: a side with no weights to give). Collective over a
        sharded trainer's group, whose ranks are all lent together."""
        return self.engine_weights()

    def load_in_place(self, version: int, weights: object) -> None:
        """Mode colocated_sync: load ``weights`` of ``version`` into the rank's own engine;
        none by default (a tensor-parallel member's engine is its driver's)."""
        return None  # a default, not a stub (the class doc)


class PlaceholderSide(RoleSide):
    """A side with no engine: it is active or not, and its work is nothing."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.active = False

    def attach(self, send: Send, rank: int, keepalive: Keepalive = nothing) -> None:
        self.rank = rank

    def on_message(self, msg: Message) -> None:
        """Nothing to do: a placeholder asks rank 0 for nothing."""

    def activate(self) -> None:
        self.active = True

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


class PullGate:
    """When a rank may ask rank 0 for something (work, a batch): one request unanswered at a
    time, asked again once its answer is ``REASK_S`` overdue (lost), and not before the
    time a "nothing now" answer said to wait. Pure logic: the caller passes the clock."""

    __slots__ = ("asked", "asked_at", "retry_at")

    def __init__(self) -> None:
        self.asked = False  # a request is unanswered
        self.asked_at = 0.0
        self.retry_at = 0.0  # after a "nothing now" answer, ask again from then on

    def may_ask(self, now: float) -> bool:
        return (not self.asked or now - self.asked_at > REASK_S) and now >= self.retry_at

    def ask(self, send: Send, msg: Message, now: float) -> bool:
        """Send ``msg``; whether it went out. Marked asked first: an answer may come back
        within ``send`` (the simulator answers at once)."""
        self.asked, self.asked_at = True, now
        sent = bool(send(msg))
        if not sent:
            self.asked = False
        return sent

    def answered(self, wait_until: float = 0.0) -> None:
        """The answer came; ask again from ``wait_until`` on."""
        self.asked, self.retry_at = False, wait_until

    def reset(self) -> None:
        self.asked, self.retry_at = False, 0.0


class LinkedSide(RoleSide):
    """Base of the sides that talk to rank 0: the send function, the rank and an on/off
    switch."""

    name = ""

    def __init__(self, cfg: object, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.active = False
        self._send: Send = lambda m: None
        self.keepalive: Keepalive = nothing  # the rank's heartbeat (RoleSide.attach)

    def attach(self, send: Send, rank: int, keepalive: Keepalive = nothing) -> None:
        self._send, self.rank, self.keepalive = send, rank, keepalive

    def activate(self) -> None:
        self.active = True

    def deactivate(self) -> None:
        self.active = False

    def on_layout(self, change: LayoutChange) -> None:
        """No state to move by default."""

    def close(self) -> None:
        self.active = False


class StepAborted(Exception):
    """A training step's collective failed on this rank (a trainer peer died or hung):
    the step was not taken. Raised by ``train_batch``; :class:`BatchConsumer` waits for the
    new trainer group and trains the batch again."""


class BatchConsumer(LinkedSide, abc.ABC):
    """A trainer side: its leader pulls batches from rank 0 one at a time.

    The leader is rank 0, where the trainer pool always starts (runtime.config.layout). Rank 0
    sends each batch to every trainer rank: data-parallel engines train their shard, the
    others train on the leader only. Subclasses implement ``train_batch`` (train; the
    leader then sends StepDone) and ``observe`` (the run's step and version from rank 0).
    """

    name = "trainer"
    retry_s = 0.05  # after "no batch yet"
    last_batch_id = -1  # the newest batch this rank trained
    # how long an aborted step waits for rank 0 to regroup the trainer ranks without the
    # lost one before the failure is taken for what it says (the rank leaves with it)
    regroup_wait_s = 60.0

    def __init__(self, cfg: object, rank: int) -> None:
        super().__init__(cfg, rank)
        self.gate = PullGate()
        self.aborted: tuple[StepAborted, float] | None = None  # and when

    @property
    def waiting_on(self) -> str:
        """What an aborted step waits for (the heartbeat's ``waiting_on``), else ""."""
        if self.aborted is None:
            return ""
        text = f"a trainer group without the lost rank ({self.aborted[0]})"
        printable = "".join(ch if ch.isprintable() else " " for ch in text)
        return printable[: p.MAX_WAIT_LABEL]

    @property
    def state(self) -> str:
        return "busy" if self.gate.asked else "idle"

    @property
    def leader(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def observe(self, step: int, policy_version: int) -> None: ...

    @abc.abstractmethod
    def train_batch(self, msg: p.Batch) -> None: ...

    def before_request(self) -> None:
        """Called on the leader before each batch request (e.g. a first evaluation)."""

    def deactivate(self) -> None:
        # Leaving the trainer role voids a request still unanswered: its answer (rank 0's
        # "sync point in progress" to the request sent right after the step report) comes
        # after the switch and goes to the side active then. Kept, it would hold the next
        # request back for REASK_S: every colocated step waited 10 s for it.
        self.gate.reset()
        super().deactivate()

    def on_message(self, msg: Message) -> None:
        if isinstance(msg, p.HeartbeatAck):
            self.observe(msg.step, msg.policy_version)
        elif isinstance(msg, p.BatchWait):
            self.gate.answered(time.monotonic() + self.retry_s)
        elif isinstance(msg, p.Batch):
            self.gate.answered()
            if msg.batch_id <= self.last_batch_id:
                return  # sent again after a lost one; this rank has trained it
            if self.aborted is not None:
                return  # split over the old trainer group: it comes again after the regroup
            try:
                self.train_batch(msg)
            except StepAborted as exc:
                self.aborted = (exc, time.monotonic())
                return
            self.last_batch_id = msg.batch_id

    def on_layout(self, change: LayoutChange) -> None:
        """A new trainer group: an aborted step is trained again when the batch comes."""
        if change.ranks("trainer") != change.ranks("trainer", after=False):
            self.aborted = None

    def step(self) -> None:
        if self.aborted is not None:
            exc, since = self.aborted
            if time.monotonic() - since > self.regroup_wait_s:
                raise RuntimeError(
                    f"no new trainer group within {self.regroup_wait_s:.0f} s of an aborted "
                    f"step: {exc}"
                ) from exc.__cause__
            return
        if not (self.active and self.leader):
            return
        self.before_request()
        now = time.monotonic()
        if self.gate.may_ask(now):
            self.gate.ask(
                self._send, p.BatchRequest(rank=self.rank, last_batch_id=self.last_batch_id), now
            )
