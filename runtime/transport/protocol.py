"""The control-plane protocol: typed messages, their msgpack encoding and validation.

A message travels as ZeroMQ frames ``[header, *blobs]``. The header is a msgpack map
``{"v": PROTOCOL_VERSION, "type": <name>, **fields}``; raw byte payloads (token ids,
log-probs, weights) travel as extra frames, never inside msgpack and never pickled.

:func:`decode` trusts nothing: a wrong version, unknown type, missing or extra field,
wrong field type or out-of-range value raises :class:`ProtocolError`, which the receiver
counts and drops. ``Any`` fields take JSON values only (no bytes, no msgpack extension
types, finite floats, string keys, bounded depth), so whatever a peer sends can be written
to status, metrics and sample logs; a header may hold at most ``MAX_CONTAINERS`` maps and
arrays. Checks that need the run (vocabulary, sequence length, the dispatched prompt) are
the coordinator's (runtime/control/sample_check.py).

Delivery: results that must not be lost (``SampleDone``, ``SampleFailed``) are kept by the
rank until rank 0 acknowledges their sample ids (``HeartbeatAck.acked``); the leader's
``StepDone`` until a ``HeartbeatAck`` shows its step. A rank that got no answer to a
``WorkRequest`` or ``BatchRequest`` asks again; ``BatchRequest.last_batch_id`` tells rank 0
whether the batch in flight was lost on its way (it is sent again) or already trained.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

import msgpack

PROTOCOL_VERSION = 3  # 3: samples carry their fields explicitly (no ``extra`` map)
MAX_FRAMES = 2 * 8192 + 1
MAX_HEADER_BYTES = 1 << 20
# Containers (maps + arrays) one header may hold. An empty msgpack array is one byte and a
# Python list ~56: without a budget a 1 MB header of empty arrays costs ~63 MiB to decode.
MAX_CONTAINERS = 1 << 16
# How deep ``Any`` fields may nest (info, prompts, status).
MAX_DEPTH = 16
# What an unregistered peer may send at all (Hello and the CLI's requests are this small):
# checked on the raw bytes, before anything is decoded.
MAX_ANONYMOUS_BYTES = 4096
# Sample ids one message may carry (acks, in-flight lists).
MAX_IDS = 65536

RUN_STATES = ("STARTING", "RUNNING", "STOPPING", "COMPLETED", "STOPPED", "FAILED")
WORKER_STATES = ("starting", "idle", "switching", "busy", "stopping", "dead", "exited")
ROLES = ("rollout", "trainer")


class ProtocolError(ValueError):
    """A frame sequence that is not a valid message of this protocol."""


@dataclass(frozen=True)
class Message:
    TYPE: ClassVar[str] = ""
    blobs: tuple[bytes, ...] = field(default=(), kw_only=True, repr=False)

    def check(self) -> None:
        """Message-specific value checks beyond types; raise ProtocolError."""


_REGISTRY: dict[str, type[Message]] = {}


def message(cls: type[Message]) -> type[Message]:
    """Register a message class under its ``TYPE``."""
    if not cls.TYPE or cls.TYPE in _REGISTRY:
        raise TypeError(f"bad or duplicate message type {cls.TYPE!r}")
    _REGISTRY[cls.TYPE] = cls
    return cls


def message_types() -> dict[str, type[Message]]:
    return dict(_REGISTRY)


def _require(cond: bool, text: str) -> None:
    if not cond:
        raise ProtocolError(text)


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
    """Liveness plus the rank's cumulative rollout time: active, and busy generating."""

    TYPE: ClassVar[str] = "heartbeat"
    rank: int
    role: str
    state: str
    layout_epoch: int
    rollout_active_s: float
    rollout_busy_s: float
    # rollout engine load (runtime/engines/vllm/stat_logger.py); {} if none
    engine: dict[str, float]

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")
        _require(self.state in WORKER_STATES, "unknown worker state")
        _require(len(self.engine) <= 16, "too many engine stats")
        for value in self.engine.values():
            _require(
                isinstance(value, (int, float)) and math.isfinite(value) and value >= 0,
                "engine stats must be finite non-negative numbers",
            )


@message
@dataclass(frozen=True)
class RoleSwitchDone(Message):
    TYPE: ClassVar[str] = "role_switch_done"
    rank: int
    role: str
    layout_epoch: int
    duration_s: float

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")
        _require(self.duration_s >= 0, "negative duration")


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
    """A rollout rank has ``slots`` free generation slots."""

    TYPE: ClassVar[str] = "work_request"
    rank: int
    slots: int

    def check(self) -> None:
        _require(0 <= self.slots <= 65536, "bad slot count")


def _check_sample(
    tokens: bytes,
    logprobs: bytes,
    ids: tuple[int, int, int],
    versions: list[list[int]],
    n_valid: int,
    loss_mask: list[int] | None,
) -> None:
    """What one sample's fields must satisfy together, wherever it travels (a rollout rank's
    :class:`SampleDone`, a sample of a :class:`Batch`)."""
    _require(len(tokens) % 4 == 0 and len(tokens) == len(logprobs), "frame sizes differ")
    n = len(tokens) // 4
    _require(n >= 1, "no tokens")
    _require(min(ids) >= 0, "negative id")
    _require(0 <= n_valid <= n, "n_valid exceeds the tokens")
    _require(0 < len(versions) <= 4096, "no version spans, or too many")
    end, version = 0, 0
    for span in versions:
        _require(len(span) == 3 and span[0] >= 0, "bad span, or a negative version")
        _require(span[1] == end and span[2] >= span[1], "bad spans")
        _require(span[0] >= version, "span versions go backwards")
        end, version = span[2], span[0]
    _require(end == n, "spans do not cover the tokens")
    if loss_mask is not None:  # multi-turn: environment tokens are not trained on
        _require(len(loss_mask) == n, "loss_mask length")
        _require(all(m in (0, 1) for m in loss_mask), "loss_mask values")
        _require(sum(loss_mask) == n_valid, "loss_mask and n_valid disagree")


@message
@dataclass(frozen=True)
class SampleDone(Message):
    """One finished sample (runtime.data.sample.Sample). Blobs: response token ids (int32
    LE), behaviour log-probs (float32 LE).

    ``versions`` holds ``[policy_version, first_token, end_token]`` per span;
    ``loss_mask`` one 0/1 per response token (None: the first ``n_valid`` are trained on);
    ``info`` the workload's free-form diagnostics (JSON)."""

    TYPE: ClassVar[str] = "sample_done"
    rank: int
    sample_id: int
    group_id: int
    prompt_id: int
    versions: list[list[int]]
    prompt_token_ids: list[int]
    loss_mask: list[int] | None
    n_valid: int
    reward: float
    info: dict[str, Any]
    started_at: float
    finished_at: float

    def check(self) -> None:
        _require(len(self.blobs) == 2, "needs token and log-prob frames")
        ids = (self.sample_id, self.group_id, self.prompt_id)
        _check_sample(*self.blobs, ids, self.versions, self.n_valid, self.loss_mask)
        _require(self.finished_at >= self.started_at, "finished before it started")


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
    roles: list[str]  # every rank's role at ``layout_epoch``, in rank order

    def check(self) -> None:
        _require(self.role in ROLES, "unknown role")
        _require(self.heartbeat_interval_s > 0, "bad heartbeat interval")
        _require(all(r in ROLES for r in self.roles), "unknown role")
        _require(0 <= self.rank < len(self.roles), "rank outside the layout")
        _require(self.roles[self.rank] == self.role, "role disagrees with the layout")


@message
@dataclass(frozen=True)
class RoleSwitch(Message):
    """Broadcast: the new role of every rank, in rank order, for ``layout_epoch``."""

    TYPE: ClassVar[str] = "role_switch"
    layout_epoch: int
    roles: list[str]

    def check(self) -> None:
        _require(all(r in ROLES for r in self.roles), "unknown role")


@message
@dataclass(frozen=True)
class WeightSync(Message):
    """Sync point: the trainer leader broadcasts ``policy_version`` to the rollout ranks of
    ``layout_epoch`` now (torch.distributed); sent to all of them at once."""

    TYPE: ClassVar[str] = "weight_sync"
    policy_version: int
    layout_epoch: int

    def check(self) -> None:
        _require(self.policy_version >= 1 and self.layout_epoch >= 0, "bad version or epoch")


@message
@dataclass(frozen=True)
class Work(Message):
    """Requests for a rollout rank: ``[{sample_id, group_id, prompt_id, prompt}]``
    (runtime.data.sample.Request; runtime/transport/frames.py converts)."""

    TYPE: ClassVar[str] = "work"
    policy_version: int
    requests: list[dict[str, Any]]

    def check(self) -> None:
        for r in self.requests:
            _require(
                isinstance(r.get("sample_id"), int)
                and isinstance(r.get("group_id"), int)
                and isinstance(r.get("prompt_id"), int)
                and isinstance(r.get("prompt"), dict),
                "bad request entry",
            )


class BatchSample(TypedDict):
    """One sample of a :class:`Batch`: its fields as the header carries them (its token ids
    and log-probs are two of the batch's frames). A map with exactly these keys."""

    sample_id: int
    group_id: int
    prompt_id: int
    versions: list[list[int]]
    prompt_token_ids: list[int]
    loss_mask: list[int] | None
    n_valid: int
    reward: float
    advantage: float
    replay_count: int
    info: dict[str, Any]


@message
@dataclass(frozen=True)
class Batch(Message):
    """A training batch (runtime.data.sample.Batch): fresh samples first, then replayed
    ones. Blobs: two frames per sample (token ids int32, behaviour log-probs float32), in
    order."""

    TYPE: ClassVar[str] = "batch"
    batch_id: int
    policy_version: int
    samples: list[BatchSample]

    def check(self) -> None:
        _require(len(self.blobs) == 2 * len(self.samples), "frames do not match samples")
        _require(self.batch_id >= 0 and self.policy_version >= 0, "bad batch id or version")
        for i, s in enumerate(self.samples):
            ids = (s["sample_id"], s["group_id"], s["prompt_id"])
            tokens, logprobs = self.blobs[2 * i], self.blobs[2 * i + 1]
            _check_sample(tokens, logprobs, ids, s["versions"], s["n_valid"], s["loss_mask"])
            _require(s["replay_count"] >= 0, "negative replay count")


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


# --- encoding --------------------------------------------------------------------------


def encode(msg: Message) -> list[bytes]:
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": msg.TYPE}
    for f in dataclasses.fields(msg):
        if f.name != "blobs":
            header[f.name] = getattr(msg, f.name)
    return [msgpack.packb(header, use_bin_type=True), *msg.blobs]


class _Budget:
    """Counts the containers msgpack builds and stops it past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.left = limit

    def spend(self, value: Any) -> Any:
        self.left -= 1
        if self.left < 0:
            raise ProtocolError("too many maps and arrays in the header")
        return value


def _no_ext(code: int, data: bytes) -> Any:
    raise ProtocolError(f"msgpack extension type {code} in the header")


def decode(frames: list[bytes], *, max_containers: int = MAX_CONTAINERS) -> Message:
    _require(1 <= len(frames) <= MAX_FRAMES, f"{len(frames)} frames")
    head = frames[0]
    _require(len(head) <= MAX_HEADER_BYTES, "header too large")
    budget = _Budget(max_containers)
    try:
        header = msgpack.unpackb(
            head,
            raw=False,
            strict_map_key=True,
            list_hook=budget.spend,
            object_hook=budget.spend,
            ext_hook=_no_ext,
        )
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise ProtocolError(f"header is not msgpack: {type(exc).__name__}") from None
    _require(isinstance(header, dict), "header is not a map")
    _require(header.get("v") == PROTOCOL_VERSION, f"protocol version {header.get('v')!r}")
    cls = _REGISTRY.get(header.get("type"))  # type: ignore[arg-type]
    _require(cls is not None, f"unknown message type {header.get('type')!r}")
    assert cls is not None
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - {"blobs"}
    given = set(header) - {"v", "type"}
    _require(given == names, f"{cls.TYPE}: fields {sorted(given)} != {sorted(names)}")
    kwargs = {}
    for name in names:
        value = header[name]
        _require(_conforms(hints[name], value), f"{cls.TYPE}.{name}: wrong type")
        kwargs[name] = float(value) if hints[name] is float else value
    msg = cls(**kwargs, blobs=tuple(frames[1:]))
    msg.check()
    return msg


def is_plain(value: Any, depth: int = 0) -> bool:
    """A JSON value: None, bool, int (|x| < 2**62), finite float, str, list, str-keyed map;
    no bytes or extension types; nested at most ``MAX_DEPTH`` deep."""
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return abs(value) < 2**62
    if isinstance(value, float):
        return math.isfinite(value)
    if depth >= MAX_DEPTH:
        return False
    if isinstance(value, list):
        return all(is_plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_plain(v, depth + 1) for k, v in value.items())
    return False


_RECORDS: dict[type, dict[str, Any]] = {}


def _record_hints(tp: type) -> dict[str, Any]:
    hints = _RECORDS.get(tp)
    if hints is None:
        hints = _RECORDS[tp] = typing.get_type_hints(tp)
    return hints


def _conforms(tp: Any, value: Any) -> bool:
    origin = typing.get_origin(tp)
    if tp is Any:
        return is_plain(value)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(a, value) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**62
    if tp is float:
        return (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
    if tp is str:
        return isinstance(value, str) and len(value) <= 65536
    if tp is bytes:
        return isinstance(value, bytes)
    if origin is list:
        (item,) = typing.get_args(tp)
        if item is int:  # token ids: the long lists, so without a call per element
            return isinstance(value, list) and all(
                type(v) is int and -(2**62) < v < 2**62 for v in value
            )
        return isinstance(value, list) and all(_conforms(item, v) for v in value)
    if typing.is_typeddict(tp):  # a record: a map with exactly these keys and types
        hints = _record_hints(tp)
        return (
            isinstance(value, dict)
            and value.keys() == hints.keys()
            and all(_conforms(hints[k], v) for k, v in value.items())
        )
    if origin is dict:
        kt, vt = typing.get_args(tp)
        return isinstance(value, dict) and all(
            _conforms(kt, k) and _conforms(vt, v) for k, v in value.items()
        )
    return False
