"""Which ranks rank 0 knows, and whether they are alive: registration and liveness.

Pure bookkeeping with the coordinator's clock. What a registration or a death *means* for
the run (fail it, requeue a dead rank's work) is the coordinator's call; this module only
says who is there, who is the sender of a message, and who went silent.

Rollout time is counted per replica: with ``rollout_gpus_per_replica > 1`` a replica's
driver (its first rank) speaks for the whole group, its seconds weighted by the group's
size (rank-seconds, what the allocator divides by), and the other ranks' rollout times are
left out: they run no engine and report none of its work (runtime/rank/tp_member.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from runtime.config.layout import Role, is_rollout_driver
from runtime.transport import protocol as p
from runtime.transport.states import GONE, WorkerState

Outgoing = tuple[bytes, p.Message]


@dataclass
class WorkerInfo:
    rank: int
    node: str
    pid: int
    identity: bytes
    role: str
    state: WorkerState = WorkerState.STARTING
    layout_epoch: int = 0
    last_seen: float = 0.0
    rollout_time: tuple[float, float] = (0.0, 0.0)  # cumulative (active, busy) seconds
    beat_at: float = 0.0  # when rollout_time arrived
    failures_in_a_row: int = 0  # generations that failed since its last delivered sample
    to_ack: list[int] = field(default_factory=list)  # sample ids for its next HeartbeatAck
    waiting_on: str = ""  # what its last heartbeat said it was about to wait on
    waiting_since: float = 0.0  # when that heartbeat came

    def waiting(self, now: float) -> str:
        """``"<what> (for <s> s)"``, or "" when its last beat reported no wait."""
        if not self.waiting_on:
            return ""
        return f"{self.waiting_on} (for {now - self.waiting_since:.1f} s)"

    @property
    def gone(self) -> bool:
        return self.state in GONE


class Membership:
    """The registered ranks by rank and by socket identity."""

    def __init__(
        self, world_size: int, clock: Callable[[], float], rollout_group_size: int = 1
    ) -> None:
        self.world_size = world_size
        self.clock = clock
        self.rollout_group_size = rollout_group_size
        self.workers: dict[int, WorkerInfo] = {}
        self._rank_of: dict[bytes, int] = {}  # socket identity -> registered rank
        # Ranks lost to a run with process groups: "gone" in every later layout epoch,
        # until an epoch takes them back. Read-only outside (the rebalancer asks for it).
        self.lost: set[int] = set()
        # ...those of them registered again, "gone" until the epoch that takes them back
        self.rejoining: set[int] = set()
        self.lost_ranks: list[dict[str, Any]] = []  # every rank lost (or released), and why
        self.rejoined_ranks: list[dict[str, Any]] = []  # those taken back, and when

    # --- lost and rejoining ranks --------------------------------------------------------

    def declare_lost(self, record: dict[str, Any], out_of_groups: bool) -> None:
        """Rank ``record["rank"]`` left the run (``record`` says why, for the reports);
        ``out_of_groups``: with process groups, it is "gone" in every later epoch."""
        rank = record["rank"]
        self.lost_ranks.append(record)
        self.rejoining.discard(rank)
        if out_of_groups:
            self.lost.add(rank)

    def start_rejoining(self, rank: int) -> None:
        """Lost ``rank`` registered again: the epoch that takes it back is to come."""
        assert rank in self.lost, f"rank {rank} was not lost"
        self.rejoining.add(rank)

    def take_back(self, ranks: set[int], step: int) -> None:
        """The new epoch takes these rejoining ranks back into the groups."""
        self.lost -= ranks
        self.rejoining -= ranks
        self.rejoined_ranks += [
            {"rank": w.rank, "pid": w.pid, "at_step": step} for w in self.alive() if w.rank in ranks
        ]

    def __iter__(self) -> Iterator[WorkerInfo]:
        return iter(self.workers.values())

    def rank_of(self, identity: bytes) -> int | None:
        return self._rank_of.get(identity)

    def is_anonymous(self, identity: bytes) -> bool:
        """Not a registered, live rank: a CLI client, a rank before its Hello, a dead one."""
        rank = self._rank_of.get(identity)
        return rank is None or self.workers[rank].gone

    def sender(self, identity: bytes, rank: int) -> WorkerInfo | str:
        """The registered, live worker behind a message, or why it is refused. A rank
        declared dead stays dead: it must register again (Hello)."""
        w = self.workers.get(rank)
        if w is None or w.identity != identity:
            return "unknown_sender"
        if w.gone:
            return "dead_sender"
        w.last_seen = self.clock()
        return w

    def may_register(self, identity: bytes, rank: int) -> bool:
        """False when another live process already holds ``rank``."""
        old = self.workers.get(rank)
        return old is None or old.identity == identity or old.gone

    def register(self, identity: bytes, msg: p.Hello, role: str, epoch: int) -> WorkerInfo:
        old = self.workers.get(msg.rank)
        if old is not None:
            self._rank_of.pop(old.identity, None)
        self._rank_of[identity] = msg.rank
        w = WorkerInfo(
            rank=msg.rank,
            node=msg.node,
            pid=msg.pid,
            identity=identity,
            role=role,
            layout_epoch=epoch,
            last_seen=self.clock(),
        )
        self.workers[msg.rank] = w
        return w

    def all_ready(self) -> bool:
        return len(self.workers) == self.world_size and all(
            w.state != WorkerState.STARTING and not w.gone for w in self.workers.values()
        )

    def n_ready(self) -> int:
        return sum(w.state != WorkerState.STARTING and not w.gone for w in self.workers.values())

    def all_gone(self) -> bool:
        return all(w.gone for w in self.workers.values())

    def alive(self) -> list[WorkerInfo]:
        return [w for w in self.workers.values() if not w.gone]

    def leader(self) -> WorkerInfo | None:
        w = self.workers.get(0)
        return w if w is not None and not w.gone else None

    def silent(
        self, now: float, register_timeout_s: float, heartbeat_timeout_s: float
    ) -> Iterator[WorkerInfo]:
        """Live workers silent past their timeout, each marked dead as it is yielded (the
        caller's verdict on one is told to the ranks still alive). A rank starting its
        engines (model build, engine start) is silent for a while; it gets the
        registration budget, not the heartbeat timeout."""
        for w in self.workers.values():
            timeout = register_timeout_s if w.state == WorkerState.STARTING else heartbeat_timeout_s
            if not w.gone and now - w.last_seen > timeout:
                w.state = WorkerState.DEAD
                yield w

    def send(self, msg: p.Message, ranks: Iterable[int] | None = None) -> list[Outgoing]:
        """``msg`` to every live worker, or to the live ones among ``ranks``."""
        members = None if ranks is None else set(ranks)
        return [
            (w.identity, msg)
            for w in self.workers.values()
            if not w.gone and (members is None or w.rank in members)
        ]

    # --- rollout time, from heartbeats ---------------------------------------------------

    def drives(self, rank: int) -> bool:
        """Whether ``rank`` drives its rollout replica's engine (when it plays rollout)."""
        return is_rollout_driver(rank, self.rollout_group_size)

    def driver_of(self, rank: int) -> int:
        """The driver of ``rank``'s rollout group (the rank itself for a driver)."""
        return rank - rank % self.rollout_group_size

    def _drivers(self) -> Iterator[WorkerInfo]:
        return (w for w in self.workers.values() if self.drives(w.rank))

    def rollout_busy_s(self, now: float, cap_s: float) -> float:
        """Rollout rank-seconds busy up to ``now``. The drivers report theirs with each
        heartbeat, each second of a replica counting for its ``rollout_group_size``
        ranks; a driver busy at its last one is counted busy since (up to ``cap_s``), so
        that windows of a few seconds are not off by a heartbeat interval per replica."""
        total = 0.0
        size = self.rollout_group_size
        for w in self._drivers():
            total += w.rollout_time[1] * size
            if w.state == WorkerState.BUSY and w.role == Role.ROLLOUT.value:
                total += min(max(now - w.beat_at, 0.0), cap_s) * size
        return total

    def rollout_idle_ratio(self) -> float:
        """Share of rollout-replica time with nothing generating (from the drivers'
        heartbeats; a replica's ranks are idle or busy together)."""
        active = sum(w.rollout_time[0] for w in self._drivers())
        busy = sum(w.rollout_time[1] for w in self._drivers())
        return 1.0 - busy / active if active > 0 else 0.0

    def rollout_replicas(self, groups: Iterable[tuple[int, ...]]) -> list[dict[str, Any]]:
        """The rollout replicas of a layout as ``reflow status`` shows them: the ranks of
        each, and its driver's state (the state of the replica's engine)."""
        out = []
        for group in groups:
            driver = self.workers.get(group[0])
            out.append(
                {
                    "driver": group[0],
                    "ranks": list(group),
                    "state": driver.state if driver is not None else WorkerState.STARTING,
                }
            )
        return out

    def status(self, now: float) -> list[dict[str, Any]]:
        """One entry per rank; ``rollout_driver``: while it plays rollout, the rank whose
        engine its replica runs on (itself for a driver), else None."""
        return [
            {
                "rank": w.rank,
                "node": w.node,
                "pid": w.pid,
                "role": w.role,
                "state": w.state,
                "layout_epoch": w.layout_epoch,
                "heartbeat_age_s": round(now - w.last_seen, 3),
                "waiting_on": (w.waiting(now) or None) if not w.gone else None,
                "rollout_driver": (
                    self.driver_of(w.rank) if w.role == Role.ROLLOUT.value else None
                ),
            }
            for w in (self.workers[r] for r in sorted(self.workers))
        ]
