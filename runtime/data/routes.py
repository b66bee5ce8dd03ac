"""The experts a mixture of experts routed a sample's tokens to (routing replay, R3).

Every MoE layer picks ``top_k`` experts for each input position of the sequence the
trainer's forward sees (the prompt, then the response but its last token, whose output
nothing uses): ``positions = len(prompt) + len(response) - 1``. Each position keeps the
routes of the forward that read it, so a partial rollout's spans keep their own policy's
routes. The trainer's forward replays them instead of its own router's choice
(``algorithm.routing_replay: rollout``), its router still weighing the chosen experts.

On the wire and in checkpoints the routes are one byte string, self-describing: an
8-byte header (``RT``, format 1, bytes per expert id, top_k, layers) and the ids,
``[positions, layers, top_k]`` row-major, one byte each for up to 256 experts, else two
(little-endian).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

_HEADER = struct.Struct("<2sBBHH")  # magic, format, id width, top_k, layers
_MAGIC, _FORMAT = b"RT", 1
_DTYPES = {1: np.dtype("<u1"), 2: np.dtype("<u2")}


class RoutesError(ValueError):
    """Routes that are malformed, or that do not fit the model or the sample."""


@dataclass(frozen=True)
class ExpertRoutes:
    layers: int
    top_k: int
    width: int  # bytes per expert id
    ids: bytes

    @property
    def positions(self) -> int:
        return len(self.ids) // (self.layers * self.top_k * self.width)

    @classmethod
    def from_array(cls, ids: np.ndarray, experts: int) -> ExpertRoutes:
        """Routes from an integer array ``[positions, layers, top_k]`` of a model with
        ``experts`` experts per layer."""
        if ids.ndim != 3 or min(ids.shape[1:]) < 1:
            raise RoutesError(f"routes of shape {tuple(ids.shape)}: not [positions, layers, k]")
        width = 1 if experts <= 256 else 2
        return cls(ids.shape[1], ids.shape[2], width, ids.astype(_DTYPES[width]).tobytes())

    def array(self) -> np.ndarray:
        """The ids, ``[positions, layers, top_k]``, int64."""
        flat = np.frombuffer(self.ids, dtype=_DTYPES[self.width])
        return flat.reshape(self.positions, self.layers, self.top_k).astype(np.int64)

    def to_bytes(self) -> bytes:
        return _HEADER.pack(_MAGIC, _FORMAT, self.width, self.top_k, self.layers) + self.ids

    @classmethod
    def from_bytes(cls, data: bytes) -> ExpertRoutes:
        """The routes a byte string holds (:class:`RoutesError` naming what is wrong)."""
        width, top_k, layers, _ = _read_header(data)
        return cls(layers, top_k, width, data[_HEADER.size :])

    def problem(self, positions: int, layers: int, top_k: int, experts: int) -> str | None:
        """Why these cannot be a sample's routes on a model of ``layers`` MoE layers of
        ``experts`` experts, ``top_k`` per token, for ``positions`` input positions; None
        if they can: the shape, every id an expert, and the ``top_k`` of a position in a
        layer distinct (a router picks each expert once: a repeated one would count
        twice in the replayed forward)."""
        if (self.layers, self.top_k) != (layers, top_k):
            mine, model = f"{self.layers} x {self.top_k}", f"{layers} x {top_k}"
            return f"routes of {mine} layers x top-k, the model's {model}"
        if self.positions != positions:
            return f"routes of {self.positions} positions, the sample has {positions}"
        ids = self.array()
        if ids.size and int(ids.max()) >= experts:
            return f"an expert id {int(ids.max())} of {experts} experts"
        if top_k > 1 and ids.size and bool((np.diff(np.sort(ids, axis=-1), axis=-1) == 0).any()):
            return "an expert chosen twice for one position in one layer"
        return None


def _read_header(data: bytes) -> tuple[int, int, int, int]:
    """(id width, top_k, layers, positions) of routes' bytes, from the header and the
    length alone (:class:`RoutesError` naming what is wrong)."""
    if len(data) < _HEADER.size:
        raise RoutesError("routes shorter than their header")
    magic, fmt, width, top_k, layers = _HEADER.unpack_from(data)
    if magic != _MAGIC or fmt != _FORMAT:
        raise RoutesError("routes of an unknown format")
    if width not in _DTYPES or top_k < 1 or layers < 1:
        raise RoutesError(f"routes of id width {width}, top_k {top_k}, {layers} layers")
    ids, position = len(data) - _HEADER.size, layers * top_k * width
    if ids % position:
        raise RoutesError("routes that are not whole positions")
    return width, top_k, layers, ids // position


def wire_problem(data: bytes, n_prompt: int, n_response: int) -> str | None:
    """Why ``data`` cannot travel as the routes of a sample of ``n_prompt`` prompt and
    ``n_response`` response tokens (its format and length; read from the header, no id
    copied), or None. Their content against the model is :meth:`ExpertRoutes.problem`,
    checked where the model is known (rank 0)."""
    try:
        positions = _read_header(data)[3]
    except RoutesError as exc:
        return str(exc)
    return None if positions == route_positions(n_prompt, n_response) else "routes length"


def route_positions(n_prompt: int, n_response: int) -> int:
    """The input positions whose routes a sample carries (see the module docstring)."""
    return n_prompt + n_response - 1
