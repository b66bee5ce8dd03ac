"""The control-plane protocol: the typed messages and their value checks.

The envelope (frames ``[header, *blobs]``, the msgpack header, the limits and the decoder
that trusts nothing) is :mod:`runtime.transport.envelope`; its public names are handed on
here, so a caller needs this module only. ``Any`` fields take JSON values only (no bytes,
no msgpack extension types, finite floats, string keys, bounded depth), so whatever a peer
sends can be written to status, metrics and sample logs. Checks that need the run
(vocabulary, sequence length, the dispatched prompt) are the coordinator's
(runtime/control/sample_check.py); the shape of sample fields is
:mod:`runtime.transport.sample_shape`.

Delivery: results that must not be lost (``SampleDone``, ``SampleFailed``) are kept by the
rank until rank 0 acknowledges their sample ids (``HeartbeatAck.acked``); the leader's
``StepDone`` until a ``HeartbeatAck`` shows its step. A rank that got no answer to a
``WorkRequest`` or ``BatchRequest`` asks again; ``BatchRequest.last_batch_id`` tells rank 0
whether the batch in flight was lost on its way (it is sent again) or already trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict, get_type_hints

from runtime.data.micro_batches import UpdatePlan
from runtime.transport.envelope import (  # noqa: F401 - the protocol's public face
    MAX_ANONYMOUS_BYTES,
    MAX_CONTAINERS,
    MAX_DEPTH,
    MAX_FRAMES,
    MAX_HEADER_BYTES,
    MAX_HEADER_BYTES_FROM_COORDINATOR,
    MAX_IDS,
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    _require,
    decode,
    encode,
    is_plain,
    message,
    message_types,
)
from runtime.transport.eval_messages import (  # noqa: F401 - the protocol's public face
    EvalDone,
    EvalTaskRecord,
    EvalWork,
)
from runtime.transport.layout_messages import (  # noqa: F401 - the protocol's public face
    GONE_ROLE,
    LAYOUT_ROLES,
    ROLES,
    SWITCH_PHASES,
    Lend,
    RoleSwitch,
    RoleSwitchDone,
)
from runtime.transport.sample_shape import (
    BATCH_FIELDS,
    DONE_FIELDS,
    SAMPLE_FRAMES,
    BatchRecord,
    DoneRecord,
    ParkedEntry,
    check_parked,
    check_sample,
)
from runtime.transport.states import RunState, WorkerState

MAX_WAIT_LABEL = 200  # characters of a heartbeat's waiting_on

RUN_STATES = tuple(s.value for s in RunState)
WORKER_STATES = tuple(s.value for s in WorkerState)
# samples a batch layout may describe: far above the largest batches recipes use (DAPO's
# 512 prompts x 16 = 8,192), a bound so a layout cannot ask for unbounded work
MAX_BATCH_SAMPLES = 1 << 17
# tokens one sample may have: far above any context window, a bound so that a batch's token
# counts sum without overflow (MAX_BATCH_SAMPLES of them fit an int64 many times over)
MAX_SAMPLE_TOKENS = (1 << 31) - 1


# --- worker -> coordinator -------------------------------------------------------------


@message
@dataclass(frozen=True)
class Hello(Message):
    """First message of a rank: who it is. Answered by :class:`Welcome`."""

    TYPE: ClassVar[str] = "hello"
    rank: int
    world_size: int
    node: str
    pid: int

    def check(self) -> None:
        _require(0 <= self.rank < self.world_size, "rank outside world")
        _require(self.pid > 0, "bad pid")


@message
@dataclass(frozen=True)
class Ready(Message):
    """The rank has started its role and is ready for work."""

    TYPE: ClassVar[str] = "ready"
    rank: int
    role: str
    layout_epoch: int

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")


@message
@dataclass(frozen=True)
class Heartbeat(Message):
    """Liveness plus the rank's cumulative rollout time: active, busy (requests in its
    engine), and of that paused for weight syncs (held, generating nothing)."""

    TYPE: ClassVar[str] = "heartbeat"
    rank: int
    role: str
    state: str
    layout_epoch: int
    rollout_active_s: float
    rollout_busy_s: float
    # rollout engine load (runtime/engines/vllm/stat_logger.py); {} if none
    engine: dict[str, float]
    rollout_paused_s: float = 0.0
    # what the rank is about to block on, and for whom (e.g. "training batch 7 with
    # trainer ranks [0, 1]"): sent just before the wait, "" once it is over; rank 0 shows
    # it in status and names it if the rank then goes silent
    waiting_on: str = ""

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")
        _require(self.state in WORKER_STATES, "unknown worker state")
        _require(
            isinstance(self.waiting_on, str)
            and len(self.waiting_on) <= MAX_WAIT_LABEL
            and self.waiting_on.isprintable(),
            f"waiting_on must be printable text of at most {MAX_WAIT_LABEL} characters",
        )
        times = (self.rollout_active_s, self.rollout_busy_s, self.rollout_paused_s)
        _require(
            all(isinstance(t, (int, float)) and math.isfinite(t) and t >= 0 for t in times),
            "rollout times must be finite non-negative numbers",
        )
        # cumulative seconds of nested states (a float's rounding aside)
        slack = 1e-6 * (1.0 + self.rollout_active_s)
        _require(
            self.rollout_paused_s <= self.rollout_busy_s + slack
            and self.rollout_busy_s <= self.rollout_active_s + slack,
            "rollout times must nest: paused <= busy <= active",
        )
        _require(len(self.engine) <= 16, "too many engine stats")
        for value in self.engine.values():
            _require(
                isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
                "engine stats must be finite non-negative numbers",
            )


@message
@dataclass(frozen=True)
class StepDone(Message):
    """A trainer replica finished an optimisation step on batch ``batch_id`` (-1: none)."""

    TYPE: ClassVar[str] = "step_done"
    rank: int
    step: int
    policy_version: int
    batch_id: int
    metrics: dict[str, float]

    def check(self) -> None:
        _require(self.step >= 1 and self.policy_version >= 0, "bad step or version")
        _require(self.batch_id >= -1, "bad batch id")
        _require(len(self.metrics) <= 256, "too many metrics")


@message
@dataclass(frozen=True)
class WorkRequest(Message):
    """A rollout rank has ``slots`` free generation slots, and ``in_tools`` of the episodes
    it runs wait on a tool call or a reward now (they hold no generation slot: rank 0
    counts only the others against the rank's cap, and clamps ``in_tools`` to what it has
    running there)."""

    TYPE: ClassVar[str] = "work_request"
    rank: int
    slots: int
    in_tools: int = 0

    def check(self) -> None:
        _require(0 <= self.slots <= 65536, "bad slot count")
        _require(0 <= self.in_tools <= 65536, "bad in-tools count")


@message
@dataclass(frozen=True)
class SampleDone(Message):
    """One finished sample (runtime.data.sample.Sample): its fields declared for this
    message as the header's ``sample`` record, and one frame per per-token field
    (runtime/transport/sample_shape.py ``FRAMES``: token ids int32, behaviour log-probs
    float32, little-endian), then one per byte-string field (``BLOBS``: a MoE's routes)."""

    TYPE: ClassVar[str] = "sample_done"
    rank: int
    sample: DoneRecord

    @property
    def sample_id(self) -> int:  # what the rank keeps it under until rank 0 acknowledges
        return self.sample["sample_id"]

    def check(self) -> None:
        check_sample(self.sample, self.blobs, DONE_FIELDS)
        s = self.sample
        _require(s["finished_at"] >= s["started_at"], "finished before it started")


@message
@dataclass(frozen=True)
class Parked(Message):
    """A rollout rank's answer to :class:`Park`: what it had generated of each request in
    flight, one entry and two frames (token ids int32, log-probs float32) per parked rollout.
    A request it had not started, or had nothing of, is left out (rank 0 requeues it from
    its prompt, as every request not reported)."""

    TYPE: ClassVar[str] = "parked"
    rank: int
    rollouts: list[ParkedEntry]

    def check(self) -> None:
        _require(len(self.blobs) == 2 * len(self.rollouts), "frames do not match rollouts")
        seen: set[int] = set()
        for i, e in enumerate(self.rollouts):
            check_parked(self.blobs[2 * i], self.blobs[2 * i + 1], e)
            _require(e["sample_id"] not in seen, "a parked rollout repeats")
            seen.add(e["sample_id"])


@message
@dataclass(frozen=True)
class SampleFailed(Message):
    """Generation or scoring of a sample failed on a rollout rank; rank 0 requeues it."""

    TYPE: ClassVar[str] = "sample_failed"
    rank: int
    sample_id: int
    reason: str

    def check(self) -> None:
        _require(self.sample_id >= 0, "negative sample id")


@message
@dataclass(frozen=True)
class BatchRequest(Message):
    TYPE: ClassVar[str] = "batch_request"
    rank: int
    last_batch_id: int = -1  # the last batch this leader trained (-1: none yet)

    def check(self) -> None:
        _require(self.last_batch_id >= -1, "bad batch id")


@message
@dataclass(frozen=True)
class Bye(Message):
    """The rank is leaving (after a stop, or on its own with a reason)."""

    TYPE: ClassVar[str] = "bye"
    rank: int
    reason: str


@message
@dataclass(frozen=True)
class PeerLost(Message):
    """The trainer leader dropped receiver ``peer`` from a weight sync of ``layout_epoch``
    (it failed, or took nothing for ``control.peer_timeout_s``): rank 0 declares it lost
    at once instead of waiting for its heartbeat to time out."""

    TYPE: ClassVar[str] = "peer_lost"
    rank: int
    peer: int
    layout_epoch: int
    reason: str

    def check(self) -> None:
        _require(self.peer >= 0 and self.peer != self.rank, "bad peer")
        _require(self.layout_epoch >= 0, "bad epoch")
        _require(len(self.reason) <= 1000, "reason too long")


# --- coordinator -> worker -------------------------------------------------------------


@message
@dataclass(frozen=True)
class CheckpointSaved(Message):
    """The trainer leader wrote (or failed to write) its part of checkpoint ``step``."""

    TYPE: ClassVar[str] = "checkpoint_saved"
    rank: int
    step: int
    ok: bool
    error: str

    def check(self) -> None:
        _require(self.step >= 1, "checkpoint step must be positive")


@message
@dataclass(frozen=True)
class HeartbeatAck(Message):
    """Answer to a heartbeat: tells a rank the coordinator is alive, and where the run is."""

    TYPE: ClassVar[str] = "heartbeat_ack"
    step: int
    policy_version: int
    # sample ids whose SampleDone / SampleFailed from this rank rank 0 has taken in (or
    # already had) since its previous ack to this rank: the rank may forget them
    acked: list[int] = field(default_factory=list)

    def check(self) -> None:
        _require(len(self.acked) <= MAX_IDS, "too many acked ids")


@message
@dataclass(frozen=True)
class Welcome(Message):
    TYPE: ClassVar[str] = "welcome"
    rank: int
    role: str
    layout_epoch: int
    heartbeat_interval_s: float
    roles: list[str]  # every rank's role at ``layout_epoch`` (or gone), in rank order

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")
        _require(self.heartbeat_interval_s > 0, "bad heartbeat interval")
        _require(all(r in LAYOUT_ROLES for r in self.roles), "unknown role")
        _require(0 <= self.rank < len(self.roles), "rank outside the layout")
        # a lost rank rejoining is "gone" in the current epoch; it takes its role at the next
        _require(self.roles[self.rank] in (self.role, GONE_ROLE), "role disagrees with the layout")


@message
@dataclass(frozen=True)
class WeightSync(Message):
    """Sync point: the trainer leader broadcasts ``policy_version`` to the rollout ranks of
    ``layout_epoch`` now (torch.distributed); sent to all of them at once."""

    TYPE: ClassVar[str] = "weight_sync"
    policy_version: int
    layout_epoch: int
    # a rollout driver pinned to an eval round's version takes part and keeps its weights
    # (runtime/control/evals.py): received and dropped, as by an engine that has them
    hold: bool = False

    def check(self) -> None:
        _require(self.policy_version >= 1 and self.layout_epoch >= 0, "bad version or epoch")


class RequestRecord(TypedDict):
    """One request of a :class:`Work` answer (runtime.data.sample.Request as a rollout rank
    needs it). ``resume``: the parked rollout it continues (its token ids and log-probs are
    the message's next two frames, in request order), or None."""

    sample_id: int
    group_id: int
    prompt_id: int
    prompt: dict[str, Any]
    resume: ParkedEntry | None


@message
@dataclass(frozen=True)
class Work(Message):
    """Requests for a rollout rank (runtime/transport/frames.py converts)."""

    TYPE: ClassVar[str] = "work"
    policy_version: int
    requests: list[RequestRecord]

    def check(self) -> None:
        frames = 0
        for r in self.requests:
            _require(min(r["sample_id"], r["group_id"], r["prompt_id"]) >= 0, "negative id")
            resume = r["resume"]
            if resume is not None:  # a parked rollout to continue: the next two frames
                _require(len(self.blobs) >= frames + 2, "frames do not match parked rollouts")
                _require(resume["sample_id"] == r["sample_id"], "parked rollout of another request")
                check_parked(self.blobs[frames], self.blobs[frames + 1], resume)
                frames += 2
        _require(len(self.blobs) == frames, "frames do not match parked rollouts")


# A trainer rank's part of one optimizer update (runtime.data.micro_batches.UpdatePlan),
# the record its declaration gives.
UpdateRecord = TypedDict("UpdateRecord", get_type_hints(UpdatePlan))  # type: ignore[misc]


@message
@dataclass(frozen=True)
class Batch(Message):
    """A training batch (runtime.data.sample.Batch), or a trainer rank's part of one: its
    samples as records of their declared fields, one frame per per-token field each, in
    order. With ``updates`` (a data-parallel trainer: rank 0's plan, made once), the
    samples are this rank's share, carried update by update, and each update says which
    micro-batches it trains them in and what the loss's normalisers need of the whole
    update; without, the whole batch, fresh samples first, then replayed ones."""

    TYPE: ClassVar[str] = "batch"
    batch_id: int
    policy_version: int
    samples: list[BatchRecord]
    updates: list[UpdateRecord] | None = None

    def check(self) -> None:
        k = SAMPLE_FRAMES
        _require(len(self.blobs) == k * len(self.samples), "frames do not match samples")
        _require(self.batch_id >= 0 and self.policy_version >= 0, "bad batch id or version")
        for i, s in enumerate(self.samples):
            check_sample(s, self.blobs[k * i : k * (i + 1)], BATCH_FIELDS)
            _require(s["replay_count"] >= 0, "negative replay count")
        if self.updates is not None:
            self._check_updates(self.updates)

    def _check_updates(self, updates: list[UpdateRecord]) -> None:
        carried = total = 0
        for u in updates:
            n = len(u["n_valid"])
            total += n
            _require(total <= MAX_BATCH_SAMPLES, f"updates of over {MAX_BATCH_SAMPLES} samples")
            _require(len(u["replayed"]) == n, "an update's lists differ")
            _require(
                all(0 <= v <= MAX_SAMPLE_TOKENS for v in u["n_valid"]), "valid tokens out of range"
            )
            mine = u["positions"]
            _require(len(set(mine)) == len(mine), "a position repeats")
            _require(all(0 <= i < n for i in mine), "a position is outside the update")
            # every rank takes as many micro-steps, at most one per sample of the update
            _require(1 <= len(u["micro_batches"]) <= max(1, n), "micro-steps out of range")
            planned = sorted(i for m in u["micro_batches"] for i in m)
            _require(planned == sorted(mine), "micro-batches do not cover the samples once")
            _require(carried + len(mine) <= len(self.samples), "positions exceed the samples")
            for s, at in zip(self.samples[carried : carried + len(mine)], mine, strict=True):
                # the carried samples must be what the update says of them
                _require(
                    u["n_valid"][at] == s["n_valid"]
                    and u["replayed"][at] == (s["replay_count"] > 0),
                    f"sample {s['sample_id']} does not match its update at {at}",
                )
            carried += len(mine)
        _require(carried == len(self.samples), "samples outside every update")


@message
@dataclass(frozen=True)
class BatchWait(Message):
    """No batch now (the batch rule is not met yet); ask again shortly."""

    TYPE: ClassVar[str] = "batch_wait"
    reason: str


@message
@dataclass(frozen=True)
class Checkpoint(Message):
    """To the trainer leader: write your state for step ``step`` into its staging folder
    (runtime/store/checkpoint.py); answered by :class:`CheckpointSaved`."""

    TYPE: ClassVar[str] = "checkpoint"
    step: int

    def check(self) -> None:
        _require(self.step >= 1, "checkpoint step must be positive")


@message
@dataclass(frozen=True)
class Park(Message):
    """To the rollout replicas' drivers when the run stops after a checkpoint: stop
    generating and report what you have of each request in flight (:class:`Parked`), so
    the checkpoint keeps it and a resumed run continues it instead of regenerating it."""

    TYPE: ClassVar[str] = "park"
    step: int


@message
@dataclass(frozen=True)
class Stop(Message):
    TYPE: ClassVar[str] = "stop"
    reason: str


# --- clients (reflow status / rebalance / stop) ----------------------------------------


@message
@dataclass(frozen=True)
class StatusRequest(Message):
    TYPE: ClassVar[str] = "status_request"


@message
@dataclass(frozen=True)
class StatusReply(Message):
    TYPE: ClassVar[str] = "status_reply"
    status: dict[str, Any]


@message
@dataclass(frozen=True)
class RebalanceRequest(Message):
    TYPE: ClassVar[str] = "rebalance_request"
    rollout: int
    trainer: int

    def check(self) -> None:
        _require(self.rollout >= 0 and self.trainer >= 0, "negative ranks")


@message
@dataclass(frozen=True)
class AllocatorRequest(Message):
    """Turn the automatic (producer/consumer) rebalancing on or off."""

    TYPE: ClassVar[str] = "allocator_request"
    auto: bool


@message
@dataclass(frozen=True)
class StopRequest(Message):
    TYPE: ClassVar[str] = "stop_request"
    reason: str


@message
@dataclass(frozen=True)
class Reply(Message):
    """Answer to a client request that changes something: accepted or not, and why."""

    TYPE: ClassVar[str] = "reply"
    ok: bool
    text: str
