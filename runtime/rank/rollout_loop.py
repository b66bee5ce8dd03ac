"""The rollout pull loop: ask rank 0 for work, run it, report it, ask again.

One policy for every rollout engine: the vLLM and synthetic sides (through
:class:`RolloutSide`) and the simulator's replicas (:mod:`runtime.sim.cluster`, which
drives a :class:`RolloutLoop` from its event clock):

- ask for as many requests as the engine has free slots, with one request unanswered at
  a time (:class:`runtime.rank.sides.PullGate`: asked again once the answer is overdue);
- after "nothing now" (a ``Work`` with no requests) wait ``retry_s`` before asking again;
- a request that is already running here (rank 0 timed it out and handed it back while
  our first copy still runs) is not started twice: that copy's result is the one rank 0
  takes;
- generations in flight are kept across a weight sync: held, then resumed under the new
  weights (partial rollout), each stretch under one policy a version span
  (:class:`Spans`); leaving the rollout pool cuts them off and reports what each had
  (``Parked``: rank 0 hands them on to other rollout ranks, which continue them), and so
  does a stop (``Park``), for the checkpoint;
- finished samples and failures go to an outbox that any thread may fill (vLLM's event
  loop does) and the rank's own thread sends (the worker keeps each result until rank 0
  acknowledges it).

Pure logic: the clock is passed in and sending is a callable.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Generic, TypeVar

from runtime.data.sample import ParkedRollout, Request, Sample
from runtime.rank.sides import Keepalive, LinkedSide, PullGate, Send, nothing
from runtime.transport import frames as wire
from runtime.transport import protocol as p

H = TypeVar("H")  # what the engine keeps per running request

log = logging.getLogger(__name__)

RETRY_S = 0.05  # after "nothing now": rank 0 answers at once, so do not spin on it


class Spans:
    """A generation's version spans, ``[version, first_token, end_token]`` per stretch
    generated under one policy version."""

    __slots__ = ("spans",)

    def __init__(self, version: int) -> None:
        self.spans = [[version, 0, 0]]

    def sync(self, version: int, done: int) -> None:
        """A weight sync to ``version`` after ``done`` tokens: the open span ends there and
        a new one starts; with no token generated since the last sync the open span just
        takes the new version."""
        last = self.spans[-1]
        if version <= last[0]:
            return
        if done > last[1]:
            last[2] = done
            self.spans.append([version, done, done])
        else:
            last[0] = version

    def close(self, n: int) -> list[tuple[int, int, int]]:
        """The spans of a generation that ended with ``n`` tokens."""
        self.spans[-1][2] = n
        return [(v, a, b) for v, a, b in self.spans]


class RolloutLoop(Generic[H]):
    """One rollout rank's (or replica's) side of the conversation with rank 0. ``running``
    maps the sample ids in flight to the engine's handle for each."""

    def __init__(self, rank: int = 0, *, retry_s: float = RETRY_S) -> None:
        self.rank = rank
        self.send: Send = lambda m: None
        self.retry_s = retry_s
        self.gate = PullGate()
        self.running: dict[int, H] = {}
        self._outbox: deque[p.Message] = deque()  # appends and pops are thread-safe

    def attach(self, send: Send, rank: int) -> None:
        self.send, self.rank = send, rank

    # --- rank 0 -> this rank -----------------------------------------------------------

    def take(self, msg: p.Work, now: float) -> list[Request]:
        """Rank 0's answer to a work request: the requests to start (the caller puts each
        in ``running``). None at all: nothing is admissible now; ask again after
        ``retry_s``."""
        self.gate.answered(0.0 if msg.requests else now + self.retry_s)
        return [r for r in wire.requests(msg) if r.sample_id not in self.running]

    def take_eval(self, msg: p.EvalWork, now: float) -> None:
        """Rank 0 answered a work request with eval episodes (this rank is pinned to an
        eval round): answered, as by a ``Work``; none: ask again after ``retry_s``."""
        self.gate.answered(0.0 if msg.tasks else now + self.retry_s)

    # --- this rank -> rank 0 -----------------------------------------------------------

    def queue(self, msg: p.Message) -> None:
        """A result other than a sample (an eval episode's), sent with the next
        :meth:`flush` (any thread)."""
        self._outbox.append(msg)

    def pull(self, free: int, now: float, in_tools: int = 0) -> bool:
        """Ask for ``free`` requests if nothing is unanswered and no wait is due; whether
        a request went out. ``in_tools``: how many of the episodes running here wait on a
        tool call or a reward now (rank 0 does not count them against this rank's cap)."""
        if free > 0 and self.gate.may_ask(now):
            in_tools = max(0, min(in_tools, len(self.running)))  # only what runs here
            ask = p.WorkRequest(rank=self.rank, slots=free, in_tools=in_tools)
            return self.gate.ask(self.send, ask, now)
        return False

    def finished(self, s: Sample) -> None:
        """A finished sample, sent with the next :meth:`flush` (any thread)."""
        self._outbox.append(wire.sample_done(s, self.rank))

    def failed(self, sample_id: int, reason: str) -> None:
        """A generation that failed: rank 0 puts the request back in its queue (never lose
        a sample silently). Any thread."""
        self._outbox.append(p.SampleFailed(rank=self.rank, sample_id=sample_id, reason=reason))

    def flush(self) -> None:
        """Send what finished (on the thread that owns the connection)."""
        out = self._outbox
        while out:
            self.send(out.popleft())

    def drop(self) -> dict[int, H]:
        """Leaving the rollout pool: what runs is given up (rank 0 requeues it) and handed
        back, for the engine to abort."""
        running, self.running = self.running, {}
        self.gate.reset()
        return running


class RolloutSide(LinkedSide, Generic[H]):
    """A rollout side of a real rank around a :class:`RolloutLoop`. Engines implement
    ``start`` (begin generating a request; its handle), ``reap`` (report what finished
    through ``self.loop``), ``free_slots`` and ``abort`` (stop what :meth:`deactivate`
    dropped), and may look at every message first in ``observe``; an engine that runs
    agents reports its episodes waiting on tools in ``episodes_in_tools``."""

    name = "rollout"
    retry_s = RETRY_S

    def __init__(self, cfg: object, rank: int) -> None:
        super().__init__(cfg, rank)
        self.loop: RolloutLoop[H] = RolloutLoop(rank, retry_s=self.retry_s)
        # seconds the engine was paused for weight syncs, holding requests (heartbeats)
        self.paused_s = 0.0
        self.parked = False  # a stop took what ran here: nothing starts again

    # --- the engine --------------------------------------------------------------------

    def start(self, req: Request, now: float) -> H:
        raise NotImplementedError

    def reap(self, now: float) -> None:
        raise NotImplementedError

    def free_slots(self) -> int:
        raise NotImplementedError

    def episodes_in_tools(self) -> int:
        """Of the episodes in ``self.loop.running``, those waiting on a tool call or a
        reward now, not generating (none for an engine without tools)."""
        return 0

    def play_evals(self, msg: p.EvalWork) -> None:
        """Play an eval round's episodes on this engine (runtime/control/evals.py); an
        engine that cannot says so for each, and rank 0 counts them unscored."""
        for t in msg.tasks:
            self.loop.queue(
                p.EvalDone(
                    rank=self.rank,
                    round_id=msg.round_id,
                    task_id=t["task_id"],
                    policy_version=msg.policy_version,
                    reward=None,
                    reason=f"the {type(self).__name__} plays no eval episodes",
                )
            )

    def abort(self, running: dict[int, H]) -> None:
        """Stop generating what was dropped (by default nothing runs outside the loop)."""

    def park(self) -> dict[int, ParkedRollout]:
        """A stop: stop everything in flight (``self.loop.drop()``) and return what was
        generated of each request, by sample id (finished ones go to the outbox as usual;
        an engine that cannot say gives nothing back, and rank 0 requeues those)."""
        self.abort(self.loop.drop())
        return {}

    def observe(self, msg: p.Message, now: float) -> None:
        """Any message from rank 0, before the loop handles it."""

    # --- RoleSide ----------------------------------------------------------------------

    def attach(self, send: Send, rank: int, keepalive: Keepalive = nothing) -> None:
        super().attach(send, rank, keepalive)
        self.loop.attach(send, rank)

    def deactivate(self) -> None:
        self.active = False
        self.abort(self.loop.drop())

    @property
    def state(self) -> str:
        return "busy" if self.loop.running else "idle"

    def on_message(self, msg: p.Message) -> None:
        now = time.monotonic()
        self.observe(msg, now)
        if isinstance(msg, p.Work) and not self.parked:
            running = self.loop.running
            for req in self.loop.take(msg, now):
                running[req.sample_id] = self.start(req, now)
        elif isinstance(msg, p.EvalWork) and not self.parked:
            self.loop.take_eval(msg, now)
            self.play_evals(msg)
        elif isinstance(msg, p.Park) and not self.parked:
            # The run stops after a checkpoint: what is in flight goes into it. Finished
            # samples go first (one connection keeps the order), then the parked rollouts.
            self.parked = True
            self.report_parked(now)

    def hand_over(self) -> None:
        """Leaving the rollout pool (runtime/control/hand_over.py): what finished goes
        out as samples, what runs is cut off and reported as parked rollouts, for rank 0
        to hand on. Unlike a stop's :class:`~runtime.transport.protocol.Park`, generating
        starts again when the rank next plays rollout."""
        if not self.active or self.parked:
            return
        rollouts = self.report_parked(time.monotonic())
        log.info(
            "leaving the rollout pool: handed over %d parked rollouts (%d tokens)",
            len(rollouts),
            sum(len(r) for r in rollouts.values()),
        )

    def report_parked(self, now: float) -> dict[int, ParkedRollout]:
        """What finished goes out as samples (one connection keeps the order), then what
        runs is cut off and reported (``Parked``). An engine that fails to park reports
        none: rank 0 puts those requests back from their prompts, and nothing waits."""
        self.reap(now)  # what has finished is a sample, not a parked rollout
        try:
            rollouts = self.park()
        except Exception:
            log.exception("parking the requests in flight failed: reporting none")
            rollouts = {}
        self.loop.flush()
        self.loop.send(wire.parked_message(self.rank, rollouts))
        return rollouts

    def step(self) -> None:
        now = time.monotonic()
        self.reap(now)
        self.loop.flush()
        if self.active and not self.parked:
            self.loop.pull(self.free_slots(), now, self.episodes_in_tools())
