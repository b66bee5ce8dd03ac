"""What an agent builds (:class:`Episode`) and what it may use (:class:`AgentEnv`).

An episode cut off by a stop is kept (a parked rollout, runtime.data.sample.ParkedRollout)
and continued after the resume: the agent runs again from its prompt and
:meth:`AgentEnv.generate` replays the model turns the parked rollout holds instead of
generating them, as long as the episode's context is the one they were generated on (the
environment's tokens between turns, recomputed by the agent, are compared with the parked
rollout's), and continues the turn that was cut from its last token. Where the environment
answers otherwise (a tool whose output changed), the rest of the parked rollout is dropped
and generated anew: a turn is only ever trained on the context it was generated on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.data.codec import Codec
from runtime.data.sample import ParkedRollout, Turn
from runtime.workloads.agents.settings import AgentEnvConfig


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
    turns: list[Turn] = field(default_factory=list)  # the model's turns, in order
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    # A resumed episode: what it had generated before the stop, replayed turn by turn.
    replay: ParkedRollout | None = None
    cut: Generation | None = None  # the turn a stop cut off (an aborted generation)

    def add_model(self, g: Generation) -> None:
        offset = len(self.token_ids)
        if g.tokens:
            stop = g.stop_reason if isinstance(g.stop_reason, str) else None
            self.turns.append(Turn(offset, offset + len(g.tokens), g.finish, stop))
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

    def parked_rollout(self) -> ParkedRollout | None:
        """What this episode has generated so far, the turn a stop cut off included; None
        if nothing. A resumed episode still inside its replay keeps the whole replay."""
        rec = self.replay
        if rec is not None and len(self.token_ids) <= len(rec):
            return rec
        tokens, logprobs = list(self.token_ids), list(self.logprobs)
        mask, spans, turns = list(self.loss_mask), list(self.spans), list(self.turns)
        cut = self.cut
        if cut is not None and cut.tokens:
            offset = len(tokens)
            tokens += cut.tokens
            logprobs += cut.logprobs
            mask += [1] * len(cut.tokens)
            spans += [(v, offset + a, offset + b) for v, a, b in cut.spans if b > a]
            turns.append(Turn(offset, len(tokens), "abort", None))
        if not turns:
            return None
        return ParkedRollout(
            token_ids=tokens, logprobs=logprobs, loss_mask=mask, versions=spans, turns=turns
        )

    def model_ids(self) -> list[int]:
        return [t for t, m in zip(self.token_ids, self.loss_mask, strict=True) if m]

    @property
    def n_model_tokens(self) -> int:
        return sum(self.loss_mask)


class AgentEnv:
    """The rollout side's services for one agent run."""

    def __init__(
        self,
        config: AgentEnvConfig,
        codec: Codec,
        generator: Generator,
        record: Callable[[int], dict[str, Any]] | None,
        pool: Any,
    ) -> None:
        self.config, self.codec, self.generator = config, codec, generator
        self._record, self.pool = record, pool
        self.generating = 0  # episodes inside a generate call now
        self.in_tools = 0  # episodes waiting on the sandbox or a reward now
        self.episodes: dict[str, Episode] = {}  # by request id, while they run
        self._resume: dict[str, ParkedRollout] = {}  # parked rollouts to continue, by request id
        # A stop is taking what runs: no generation starts (each ends as cut off).
        self.parking = False

    def record(self, prompt: dict[str, Any]) -> dict[str, Any]:
        """The dataset record behind a prompt (file prompts carry only its index)."""
        if "index" in prompt and self._record is not None:
            return self._record(prompt["index"])
        return prompt

    def resume(self, request_id: str, rollout: ParkedRollout | None) -> None:
        """The next episode of ``request_id`` continues ``rollout`` (None: from its prompt)."""
        if rollout is not None:
            self._resume[request_id] = rollout

    def episode(self, request_id: str, prompt: dict[str, Any]) -> Episode:
        """A new episode of ``request_id`` (an agent's first call), kept while it runs."""
        ep = Episode(list(prompt["prompt_ids"]), replay=self._resume.pop(request_id, None))
        self.episodes[request_id] = ep
        return ep

    def forget(self, request_id: str) -> None:
        self.episodes.pop(request_id, None)
        self._resume.pop(request_id, None)

    async def generate(
        self, episode: Episode, request_id: str, stop: list[str] | None = None
    ) -> Generation | None:
        """One model turn on the episode's context (replayed, or continued, from its
        parked rollout after a resume); None when no room is left."""
        room = self.config.max_seq_len - len(episode.context)
        max_tokens = min(self.config.workload.max_response_tokens, room)
        if max_tokens < 1:
            return None
        if self.parking:  # before the replay, which would let go of the parked turn
            return Generation([], [], [], "abort")
        prefix = _replayed(episode, max_tokens)
        if prefix is not None and prefix.finish != "abort":
            return prefix  # a whole turn generated before the stop, on this same context
        done = len(prefix.tokens) if prefix is not None else 0
        if done >= max_tokens:  # the cut turn had used its budget: it ends here
            assert prefix is not None
            return Generation(prefix.tokens, prefix.logprobs, prefix.spans, "length")
        context = episode.context + (prefix.tokens if prefix is not None else [])
        self.generating += 1
        try:
            g = await self.generator.generate_turn(request_id, context, max_tokens - done, stop)
        finally:
            self.generating -= 1
        if prefix is not None:
            g = _joined(prefix, g)
        if g.finish == "abort":
            episode.cut = g
        return g

    async def custom_reward(self, episode: Episode, prompt: dict[str, Any]) -> bool:
        """Score ``episode`` with the recipe's own reward function (``workload.reward_fn``,
        runtime/workloads/rewards/custom.py) in the reward pool, on everything generated
        after the prompt; False (nothing done) when the recipe names none, and the agent
        scores as its kind does."""
        ref = self.config.workload.reward_fn
        if ref is None:
            return False
        from runtime.workloads.rewards import custom

        source, truth, extra = custom.verl_arguments(self.record(prompt), self.data_source)
        text = self.codec.decode(episode.token_ids)
        result, error = await self.call(custom.score, ref, source, text, truth, extra)
        episode.reward = float(result["score"]) if result else 0.0
        if result and result["info"]:
            episode.info["reward_info"] = result["info"]
        if error:
            episode.info["reward_error"] = error
        return True

    @property
    def data_source(self) -> str:
        """verl's ``data_source`` for records without one (:class:`AgentEnvConfig`)."""
        return self.config.data_source

    async def call(
        self, fn: Callable[..., Any], *args: Any, on_thread: bool = False
    ) -> tuple[Any, str | None]:
        """``fn(*args)`` in the reward pool: (value, None) or (None, why it failed).
        ``on_thread``: a call that waits on the sandbox (see RewardPool)."""
        self.in_tools += 1
        try:
            return await self.pool.call(fn, *args, on_thread=on_thread)
        finally:
            self.in_tools -= 1


class Agent(Protocol):
    async def run(self, env: AgentEnv, request_id: str, prompt: dict[str, Any]) -> Episode | None:
        """The scored episode, or None when generation was aborted (rank 0 requeues)."""
        ...


def _replayed(ep: Episode, max_tokens: int) -> Generation | None:
    """The turn of a resumed episode's parked rollout that starts where the episode is
    now, if the episode's tokens so far begin it and the turn fits this turn's budget
    (``max_tokens``); else the replay ends here (None)."""
    rec = ep.replay
    if rec is None:
        return None
    n = len(ep.token_ids)
    turn = next((t for t in rec.turns if t.start == n), None)
    fits = turn is not None and turn.end - turn.start <= max_tokens
    if not fits or rec.token_ids[:n] != ep.token_ids:
        if n < len(rec):  # the environment answered otherwise: the rest is not valid here
            ep.info["resume_diverged_at"] = n
        ep.replay = None
        return None
    a, b = turn.start, turn.end
    spans = [(v, max(x, a) - a, min(y, b) - a) for v, x, y in rec.versions if x < b and y > a]
    if turn.finish == "abort":
        ep.replay = None  # the rest of the turn is generated now
    ep.info["resumed_tokens"] = ep.info.get("resumed_tokens", 0) + b - a
    return Generation(rec.token_ids[a:b], rec.logprobs[a:b], spans, turn.finish, turn.stop)


def _joined(head: Generation, tail: Generation) -> Generation:
    """A cut turn and its continuation as one turn (spans of one version merged)."""
    k = len(head.tokens)
    spans = list(head.spans)
    for v, a, b in tail.spans:
        if b <= a:
            continue
        if spans and spans[-1][0] == v and spans[-1][2] == a + k:
            spans[-1] = (v, spans[-1][1], b + k)
        else:
            spans.append((v, a + k, b + k))
    return Generation(
        head.tokens + tail.tokens,
        head.logprobs + tail.logprobs,
        spans,
        tail.finish,
        tail.stop_reason,
    )
