"""Log-probs of the response tokens without the ``[tokens, vocabulary]`` logits at once.

A Qwen3 step of 16k tokens over a 152k vocabulary would hold 2.4G float32 logits (10 GB)
plus as much again for the log-softmax. The trainer needs one number per response token,
so :class:`TargetLogprobHead` stands in for the model's ``lm_head``: while a request is
set (:meth:`TargetLogprobHead.targets`) it returns, for the wanted positions only, the
log-prob of the given next token, computed ``chunk`` positions at a time, each chunk
checkpointed so its logits are rebuilt in the backward pass instead of kept. Outside a
request it is the plain linear head, so generation (the embedded model's evaluation)
works unchanged. It keeps the head's ``weight`` under the same name (a tied head stays
tied, state dicts and checkpoints keep Hugging Face names) and runs inside the model's
forward, so FSDP2's root gathers it like any other root parameter.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.utils.checkpoint import checkpoint


@dataclass
class _Request:
    next_ids: torch.Tensor  # [B, T]: the token each position predicts
    want: torch.Tensor  # [B, T] bool: the positions whose log-prob is needed
    temperature: float


def _chunk_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = torch.nn.functional.linear(hidden, weight).float() / temperature
    return logits.gather(1, target[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)


class TargetLogprobHead(torch.nn.Module):
    def __init__(self, head: torch.nn.Linear, chunk: int) -> None:
        super().__init__()
        if head.bias is not None:
            raise ValueError("a language-model head with a bias is not supported")
        self.weight = head.weight
        self.chunk = chunk
        self._request: _Request | None = None

    @contextlib.contextmanager
    def targets(
        self, next_ids: torch.Tensor, want: torch.Tensor, temperature: float
    ) -> Iterator[None]:
        """Within this block the model's ``logits`` output is ``[B, T]`` log-probs of
        ``next_ids`` at the ``want`` positions (0 elsewhere)."""
        self._request = _Request(next_ids, want, temperature)
        try:
            yield
        finally:
            self._request = None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        r = self._request
        if r is None:
            return torch.nn.functional.linear(hidden, self.weight)
        picked = hidden[r.want]  # [N, H]
        target = r.next_ids[r.want]
        parts = []
        for s in range(0, picked.shape[0], self.chunk):
            h, t = picked[s : s + self.chunk], target[s : s + self.chunk]
            if torch.is_grad_enabled():
                parts.append(
                    checkpoint(
                        _chunk_logprobs, h, self.weight, t, r.temperature, use_reentrant=False
                    )
                )
            else:
                parts.append(_chunk_logprobs(h, self.weight, t, r.temperature))
        flat = torch.cat(parts) if parts else picked.new_zeros(0, dtype=torch.float32)
        out = torch.zeros(r.want.shape, dtype=torch.float32, device=hidden.device)
        return out.masked_scatter(r.want, flat)


def install(model: torch.nn.Module, chunk: int) -> TargetLogprobHead:
    """Replace ``model.lm_head`` by a :class:`TargetLogprobHead` (before sharding)."""
    head = model.get_output_embeddings()
    if isinstance(head, TargetLogprobHead):
        return head
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__}: its output head is not a linear layer")
    new = TargetLogprobHead(head, chunk)
    model.set_output_embeddings(new)
    return new
