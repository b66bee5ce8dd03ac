"""A sample's wire records, derived from its declaration, and what sample-shaped fields
must satisfy together wherever they travel: a finished sample (``SampleDone``, a
``Batch``'s samples) and a parked rollout (``Parked``, a ``Work`` request that continues
one). Shape only; what needs the run (vocabulary, lengths, the dispatched prompt, the
run's versions) is runtime/control/sample_check.py."""

from __future__ import annotations

from array import array
from dataclasses import fields
from typing import Any, TypedDict

from runtime.data.sample import Sample, Wire, blob_wires, frame_fields
from runtime.transport.envelope import _require


def _declared(message: str) -> dict[str, Wire]:
    """The :class:`Sample` fields one message carries in its header, by name."""
    out = {}
    for f in fields(Sample):
        w = f.metadata.get("wire")
        if w is not None and w.frame is None and not w.blob and getattr(w, message):
            out[f.name] = w
    return out


# The header fields of a sample in each message, and the records the envelope checks them
# as (a map with exactly these keys and types), derived from runtime/data/sample.py.
DONE_FIELDS = _declared("done")
BATCH_FIELDS = _declared("batch")
DoneRecord = TypedDict("DoneRecord", {k: w.type for k, w in DONE_FIELDS.items()})  # type: ignore[misc]
BatchRecord = TypedDict("BatchRecord", {k: w.type for k, w in BATCH_FIELDS.items()})  # type: ignore[misc]
# The per-token frames of a sample, ``(name, typecode)``, in order (both messages), then
# its byte-string fields' frames (empty: None), by name.
FRAMES = frame_fields()
BLOB_WIRES = blob_wires()
BLOBS = list(BLOB_WIRES)
SAMPLE_FRAMES = len(FRAMES) + len(BLOBS)


def check_sample(
    record: dict[str, Any], frames: tuple[bytes, ...], declared: dict[str, Wire]
) -> None:
    """What one sample's fields must satisfy together, wherever it travels (a rollout rank's
    :class:`SampleDone`, a sample of a :class:`Batch`; ``declared``: the fields that message
    carries): a value per response token in each frame and per-token list, and the spans,
    ids and valid tokens that agree with them."""
    _require(len(frames) == SAMPLE_FRAMES, "frames do not match the sample's frame fields")
    n = -1
    for (_, code), frame in zip(FRAMES, frames[: len(FRAMES)], strict=True):
        size = array(code).itemsize
        _require(len(frame) % size == 0 and n in (-1, len(frame) // size), "frame sizes differ")
        n = len(frame) // size
    for name in (k for k, w in declared.items() if w.per_token):
        values = record[name]
        _require(values is None or len(values) == n, f"{name} length")
    ids = (record["sample_id"], record["group_id"], record["prompt_id"])
    check_shape(n, ids, record["versions"], record["n_valid"], record["loss_mask"])
    for (name, w), value in zip(BLOB_WIRES.items(), frames[len(FRAMES) :], strict=True):
        problem = w.check(value, len(record["prompt_token_ids"]), n) if value else None
        _require(problem is None, f"{name}: {problem}")


def check_shape(
    n: int,
    ids: tuple[int, int, int],
    versions: list[list[int]],
    n_valid: int,
    loss_mask: list[int] | None,
) -> None:
    """What ``n`` response tokens' spans, ids, valid count and loss mask must satisfy."""
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


FINISHES = ("stop", "length", "abort")  # how a model turn ends (abort: cut off by a stop)
MAX_STOP_STRING = 200  # characters of the stop string that ended a turn


class ParkedTurn(TypedDict):
    """One model turn of a parked rollout (runtime.data.sample.Turn)."""

    start: int
    end: int
    finish: str
    stop: str | None


class ParkedEntry(TypedDict):
    """One parked rollout (runtime.data.sample.ParkedRollout) of a :class:`Parked` or a
    ``Work`` request: its fields; its token ids and log-probs are two frames. Its loss mask
    is not sent: it is 1 on the model turns' tokens and 0 elsewhere. A map with exactly
    these keys."""

    sample_id: int
    versions: list[list[int]]
    turns: list[ParkedTurn]


PARKED_KEYS = frozenset(ParkedEntry.__annotations__)


def turns_mask(turns: list[tuple[int, int]], n: int) -> list[int]:
    """The loss mask of ``n`` response tokens whose model turns are ``(start, end)``."""
    mask = [0] * n
    for start, end in turns:
        mask[start:end] = [1] * (end - start)
    return mask


def check_parked(tokens: bytes, logprobs: bytes, e: ParkedEntry) -> None:
    """What a parked rollout must satisfy: model turns in order inside its tokens, only
    the last one cut off, and a sample's shape (tokens, log-probs, spans) with the turns'
    loss mask. Decoded by the envelope, or (inside ``Work``) checked for types here."""
    _require(
        isinstance(e, dict) and set(e) == PARKED_KEYS and type(e["sample_id"]) is int,
        "bad parked entry",
    )
    turns = e["turns"]
    _require(isinstance(turns, list), "bad parked entry")
    _require(
        isinstance(e["versions"], list)
        and all(isinstance(v, list) and all(type(x) is int for x in v) for v in e["versions"]),
        "bad parked spans",
    )
    _require(len(tokens) % 4 == 0, "frame sizes differ")
    n = len(tokens) // 4
    _require(0 < len(turns) <= 4096, "no model turns, or too many")
    end = 0
    for i, t in enumerate(turns):
        _require(
            isinstance(t, dict)
            and set(t) == {"start", "end", "finish", "stop"}
            and type(t["start"]) is int
            and type(t["end"]) is int
            and t["finish"] in FINISHES
            and (t["stop"] is None or isinstance(t["stop"], str)),
            "bad turn",
        )
        _require(end <= t["start"] < t["end"] <= n, "turns out of order or outside the tokens")
        _require(t["finish"] != "abort" or i == len(turns) - 1, "only the last turn is cut off")
        _require(t["stop"] is None or len(t["stop"]) <= MAX_STOP_STRING, "stop string too long")
        end = t["end"]
    _require(len(tokens) == len(logprobs), "frame sizes differ")
    mask = turns_mask([(t["start"], t["end"]) for t in turns], n)
    check_shape(n, (e["sample_id"], 0, 0), e["versions"], sum(mask), mask)
