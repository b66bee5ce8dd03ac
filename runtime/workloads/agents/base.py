"""What an agent builds (:class:`Episode`) and what it may use (:class:`AgentEnv`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.config.schema import Config
from runtime.data.codec import Codec


@dataclass
class Generation:
    tokens: list[int]
    logprobs: list[float]
    spans: list[tuple[int, int, int]]  # (policy version, first, end) within ``tokens``
    finish: str  # stop | length | abort
    stop_reason: str | int | None = None  # the stop string that ended it, if any


class Generator(Protocol):
    async def generate_turn(
        self, request_id: str, prompt_ids: list[int], max_tokens: int, stop: list[str] | None
    ) -> Generation: ...


@dataclass
class Episode:
    """A trajectory over turns: model tokens (trained on) and environment tokens (mask 0)."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    spans: list[tuple[int, int, int]] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)

    def add_model(self, g: Generation) -> None:
        offset = len(self.token_ids)
        self.token_ids += g.tokens
        self.logprobs += g.logprobs
        self.loss_mask += [1] * len(g.tokens)
        self.spans += [(v, offset + a, offset + b) for v, a, b in g.spans if b > a]

    def add_env(self, ids: list[int]) -> None:
        # Spans must cover every token (the wire checks it): environment tokens join the
        # span before them; they carry no log-probs of any policy anyway.
        offset = len(self.token_ids)
        if self.spans and self.spans[-1][2] == offset:
            v, a, _ = self.spans[-1]
            self.spans[-1] = (v, a, offset + len(ids))
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.token_ids

    def model_ids(self) -> list[int]:
        return [t for t, m in zip(self.token_ids, self.loss_mask, strict=True) if m]

    @property
    def n_model_tokens(self) -> int:
        return sum(self.loss_mask)


class AgentEnv:
    """The rollout side's services for one agent run."""

    def __init__(
        self,
        cfg: Config,
        codec: Codec,
        generator: Generator,
        record: Callable[[int], dict[str, Any]] | None,
        pool: Any,
    ) -> None:
        self.cfg, self.codec, self.generator = cfg, codec, generator
        self._record, self.pool = record, pool
        self.generating = 0  # episodes inside a generate call now
        self.in_tools = 0  # episodes waiting on the sandbox or a reward now

    def record(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """The dataset record behind a prompt (file prompts carry only its index)."""
        if "index" in prompt and self._record is not None:
            return self._record(prompt["index"])
        return prompt

    async def generate(
        self, episode: Episode, request_id: str, stop: list[str] | None = None
    ) -> Generation | None:
        """One model turn on the episode's context; None when no room is left."""
        room = self.cfg.model.max_seq_len - len(episode.context)
        max_tokens = min(self.cfg.workload.max_response_tokens, room)
        if max_tokens < 1:
            return None
        self.generating += 1
        try:
            return await self.generator.generate_turn(request_id, episode.context, max_tokens, stop)
        finally:
            self.generating -= 1

    async def call(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, str | None]:
        """``fn(*args)`` in the reward pool: (value, None) or (None, why it failed)."""
        self.in_tools += 1
        try:
            return await self.pool.call(fn, *args)
        finally:
            self.in_tools -= 1


class Agent(Protocol):
    async def run(self, env: AgentEnv, request_id: str, prompt: dict[str, Any]) -> Episode | None:
        """The scored episode, or None when generation was aborted (rank 0 requeues)."""
        ...
