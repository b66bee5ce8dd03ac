"""The envelope of every control-plane message: the base class, its registry, the limits,
and the msgpack encoding with the checks that trust nothing (the messages themselves are
:mod:`runtime.transport.protocol`).

A message travels as ZeroMQ frames ``[header, *blobs]``. The header is a msgpack map
``{"v": PROTOCOL_VERSION, "type": <name>, **fields}``; raw byte payloads travel as extra
frames, never inside msgpack and never pickled. :func:`decode` refuses a wrong version,
an unknown type, a missing or extra field, a wrong field type, and headers past the limits
below, with :class:`ProtocolError`.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

from runtime.data.sample import frames_per_sample

PROTOCOL_VERSION = 12  # 3: samples carry their fields explicitly; 4: heartbeats, sync pauses;
# 5: a trainer rank is sent its own samples of a batch and the layout of the rest;
# 6: a role switch reports its phases; 7: a work request says how many episodes wait in tools;
# 8: a layout's roles may say "gone" (a rank lost), and the leader reports lost receivers;
# 9: a heartbeat says what the rank is about to wait on; 10: parked rollouts at a stop
# (Park, Parked) and in Work; 11: a Welcome may say its rank "gone" (a lost rank rejoining);
# 12: a sample is one record of its declared fields, and a trainer rank's batch carries
# rank 0's micro-batch plan and the update's normalisers instead of the batch's layout;
# a Work request is a record with every key (``resume`` None when there is none);
# ``Parked.partials`` is renamed ``rollouts``
# a header and a batch's samples' frames (8,192 samples; a parked rollout has two)
MAX_FRAMES = max(2, frames_per_sample()) * 8192 + 1
MAX_HEADER_BYTES = 1 << 20
# What a rank takes from rank 0 (authenticated, the one peer it has): a batch's header
# carries each sample's prompt ids and loss mask, over 2 MB for 256 samples of a 1,024-token
# prompt and a multi-turn 4,096-token response, which the 1 MiB limit refused (the trainer
# dropped the batch and asked for it again until the step timeout).
MAX_HEADER_BYTES_FROM_COORDINATOR = 256 << 20
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


def decode(
    frames: list[bytes],
    *,
    max_containers: int = MAX_CONTAINERS,
    max_header_bytes: int = MAX_HEADER_BYTES,
) -> Message:
    _require(1 <= len(frames) <= MAX_FRAMES, f"{len(frames)} frames")
    head = frames[0]
    _require(len(head) <= max_header_bytes, "header too large")
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
    # msgpack's strict map keys are str or bytes: a bytes key is no field name (and a mix
    # of both could not even be sorted into an error message)
    _require(all(type(k) is str for k in header), "header keys are not all strings")
    version = header.get("v")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError(f"protocol version {repr(version)[:40]}")
    kind = header.get("type")
    _require(type(kind) is str, "message type is not a string")  # a list is unhashable
    cls = _REGISTRY.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown message type {kind[:64]!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - {"blobs"}
    given = set(header) - {"v", "type"}
    if given != names:
        extra, missing = sorted(given - names)[:8], sorted(names - given)
        raise ProtocolError(f"{cls.TYPE}: fields {extra} not its own, {missing} missing")
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
