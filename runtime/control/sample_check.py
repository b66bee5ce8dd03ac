"""What rank 0 checks of a finished sample before it enters the buffer.

:mod:`runtime.transport.protocol` checks a ``SampleDone`` on its own (frame sizes, spans
covering the tokens, a loss mask that agrees with ``n_valid``, JSON-only ``info``). This
module checks it against the run: what a well-behaved rollout rank could have produced for
the request rank 0 dispatched. A sample that fails is refused and its request goes back to
the queue (someone generates it again); it never reaches the buffer, a checkpoint or the
trainer.

Pure logic: the coordinator passes the request and what it knows of the run.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from runtime.data.routes import ExpertRoutes, RoutesError, route_positions
from runtime.data.sample import Request, Sample

# vLLM's log-probs are <= 0; float32 rounding can put a certain token a hair above it.
_LOGPROB_MAX = 1e-3
# Rewards here are 0/1 or small scores; a bound this loose keeps every group statistic and
# advantage finite (two rewards of 1e308 overflow the group mean and lost the group).
MAX_ABS_REWARD = 1e6


@dataclass(frozen=True)
class RunBounds:
    """What a sample of this run may contain."""

    max_seq_len: int  # prompt + response tokens (model.max_seq_len)
    vocab_size: int | None  # token ids are below it; None: any non-negative int32
    # a mixture of experts' routes a sample carries, (MoE layers, top_k, experts); None:
    # the run takes none (a dense model, or algorithm.routing_replay disabled)
    routes: tuple[int, int, int] | None = None


def sample_problem(
    s: Sample, request: Request, *, policy_version: int, bounds: RunBounds
) -> str | None:
    """Why sample ``s`` cannot be one the run produced for ``request``; None if it can."""
    token_ids = s.token_ids
    n = len(token_ids)
    if (s.group_id, s.prompt_id) != (request.group_id, request.prompt_id):
        return "mismatched_ids"
    if not abs(s.reward) <= MAX_ABS_REWARD:
        return "reward_out_of_range"
    expected = request.prompt.get("prompt_ids")
    got = s.prompt_token_ids
    if expected is not None:
        if len(got) == 0 and len(expected) != 0:
            return "missing_prompt"
        # exact types: True == 1 in Python, and a list of bools is not a prompt
        if not isinstance(got, list) or [*map(type, got)] != [int] * len(got):
            return "wrong_prompt"
        if got != (expected if isinstance(expected, list) else list(expected)):
            return "wrong_prompt"
    elif len(got) != 0:  # no prompt tokens were sent: none may come back
        return "wrong_prompt"
    n_prompt = len(got)
    if n_prompt + n > bounds.max_seq_len:
        return "too_long"
    if n and not _ids_in_range(token_ids, bounds.vocab_size):
        return "token_out_of_vocabulary"
    if n_prompt and not _ids_in_range(got, bounds.vocab_size):
        return "token_out_of_vocabulary"
    if n and not _logprobs_ok(s.logprobs):
        return "bad_logprob"
    for span in s.versions:
        if not 0 <= span[0] <= policy_version:
            return "version_out_of_range"
    if s.routes is not None:
        if bounds.routes is None:
            return "routes_unexpected"
        positions = route_positions(n_prompt, n)
        try:
            if ExpertRoutes.from_bytes(s.routes).problem(positions, *bounds.routes) is not None:
                return "bad_routes"
        except RoutesError:
            return "bad_routes"
    return None


# Frames from the wire are typed arrays (runtime/transport/frames.py): numpy reads long ones
# in place, without a Python int or float per token; below this length its call overhead costs more.
_NUMPY_FROM = 128


def _ids_in_range(ids: Sequence[int], vocab_size: int | None) -> bool:
    if isinstance(ids, array) and ids.typecode == "i" and len(ids) >= _NUMPY_FROM:
        # Read as unsigned, a negative id is >= 2**31: one pass checks both bounds.
        return int(np.frombuffer(ids, dtype=np.uintc).max()) < (vocab_size or 2**31)
    lo, hi = min(ids), max(ids)
    return lo >= 0 and (not vocab_size or hi < vocab_size)


def _logprobs_ok(logprobs: Sequence[float]) -> bool:
    """Finite and <= 0 (up to float32 rounding)."""
    if isinstance(logprobs, array) and logprobs.typecode == "f" and len(logprobs) >= _NUMPY_FROM:
        a = np.frombuffer(logprobs, dtype=np.float32)
        # A NaN or +inf fails the first test (a NaN propagates through the max), -inf the second.
        return (
            float(np.maximum.reduce(a)) <= _LOGPROB_MAX and float(np.minimum.reduce(a)) > -math.inf
        )
    # A NaN, or infinities of either sign, make the sum non-finite.
    return math.isfinite(sum(logprobs)) and max(logprobs) <= _LOGPROB_MAX
