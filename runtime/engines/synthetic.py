"""Synthetic engines: the data plane end to end without a language model.

``SyntheticRollout`` stands in for an LLM engine: each request "generates" a long-tailed
number of tokens (log-normal, p99/p50 about 6) at a fixed per-token time, with random
token ids and log-probs, and a 0/1 reward from a per-prompt success rate, with the response
lengths of runtime/data/lengths.py (the simulator's model too). It talks to rank 0 through
the rollout pull loop every rollout engine shares (runtime/rank/rollout_loop.py), and
tracks policy versions like a real engine does across a weight sync: a generation that
spans a version change records a span per version (partial rollout). Like a real engine,
one runs per rollout replica, on its driver: with ``rollout_gpus_per_replica > 1`` the
other ranks of a group get a :class:`runtime.rank.tp_member.TensorParallelMember`
(runtime/engines/registry.py), and building one on them is an error. A ``WeightSync``
means nothing to it: rank 0's policy version, in every ``Work`` and ``HeartbeatAck``, is
the version it generates with.

``SyntheticTrainer`` asks rank 0's buffer for batches and takes a real optimiser step of a
tiny torch policy with the ReFlow loss (replay weights from the batch), then reports the
step. It learns nothing useful (the tokens are random); it exists to run the data cycle,
idle accounting and metrics with real processes and sockets, in seconds.
"""

from __future__ import annotations

import itertools
import math
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from runtime.config.layout import is_rollout_driver
from runtime.config.schema import Config
from runtime.data.lengths import synthetic_lengths
from runtime.data.sample import ParkedRollout, Request, Sample, Turn
from runtime.rank.rollout_loop import RolloutSide, Spans
from runtime.rank.sides import BatchConsumer
from runtime.transport import frames as wire
from runtime.transport import protocol as p

VOCAB = 64


def synthetic_prompts(seed: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in itertools.count():
        yield {"id": i, "success_rate": round(rng.random(), 3)}


@dataclass
class _Generation:
    request: Request
    n_tokens: int
    started: float
    done_at: float
    spans: Spans


class SyntheticRollout(RolloutSide[_Generation]):
    name = "rollout"

    def __init__(self, cfg: Config, rank: int) -> None:
        super().__init__(cfg, rank)
        self.cfg: Config = cfg
        self.version = 0
        self.slots = min(cfg.scheduler.max_concurrency, 16)
        self.token_time_s = cfg.engine.synthetic_token_s
        self.lengths = synthetic_lengths(
            cfg.workload.max_response_tokens, cfg.engine.synthetic_length_schedule
        )
        self.rng = random.Random(cfg.train.seed * 1000 + rank)
        self.delivered = 0

    def free_slots(self) -> int:
        running = self.loop.running
        free = self.slots - len(running)
        budget = self.cfg.engine.synthetic_kv_tokens
        if budget:  # a KV cache holds so many tokens: long responses, fewer at once
            held = sum(g.n_tokens for g in running.values())
            free = min(free, int((budget - held) // self.lengths.mean(self.version)))
        return free

    def observe(self, msg: p.Message, now: float) -> None:
        """Rank 0's policy version is this engine's: a generation that spans a change
        records a span per version (partial rollout)."""
        if isinstance(msg, (p.Work, p.HeartbeatAck)) and msg.policy_version > self.version:
            for g in self.loop.running.values():
                done = min(g.n_tokens - _head(g), int((now - g.started) / self.token_time_s))
                g.spans.sync(msg.policy_version, done)
            self.version = msg.policy_version

    def start(self, req: Request, now: float) -> _Generation:
        n = self.lengths.draw(self.rng, self.version)
        done = len(req.resume) if req.resume is not None else 0  # continued, not redone
        n = max(n, done + 1)
        return _Generation(req, n, now, now + (n - done) * self.token_time_s, Spans(self.version))

    def park(self) -> dict[int, ParkedRollout]:
        """A stop: each generation's tokens so far (the ones before a resume included)."""
        now = time.monotonic()
        out: dict[int, ParkedRollout] = {}
        for sid, g in self.loop.drop().items():
            prefix, head = g.request.resume, _head(g)
            done = min(g.n_tokens - head, int((now - g.started) / self.token_time_s))
            if head + done == 0:
                continue
            tokens = [self.rng.randrange(VOCAB) for _ in range(done)]
            spans = Spans(0)
            spans.spans = [list(s) for s in g.spans.spans]
            versions = _after(prefix, spans.close(done))
            out[sid] = ParkedRollout(
                token_ids=(list(prefix.token_ids) if prefix else []) + tokens,
                logprobs=(list(prefix.logprobs) if prefix else []) + [-math.log(VOCAB)] * done,
                loss_mask=[1] * (head + done),
                versions=versions,
                turns=[Turn(0, head + done, "abort", None)],
            )
        return out

    def reap(self, now: float) -> None:
        running = self.loop.running
        for sid in [s for s, g in running.items() if g.done_at <= now]:
            g = running.pop(sid)
            req = g.request
            rate = float(req.prompt.get("success_rate", 0.5))
            prefix = req.resume
            head = len(prefix) if prefix is not None else 0
            new = g.n_tokens - head
            self.loop.finished(
                Sample(
                    sample_id=sid,
                    group_id=req.group_id,
                    prompt_id=req.prompt_id,
                    versions=_after(prefix, g.spans.close(new)),
                    token_ids=(list(prefix.token_ids) if prefix else [])
                    + [self.rng.randrange(VOCAB) for _ in range(new)],
                    logprobs=(list(prefix.logprobs) if prefix else []) + [-math.log(VOCAB)] * new,
                    reward=float(self.rng.random() < rate),
                    n_valid=g.n_tokens,
                    worker=self.rank,
                    started_at=g.started,
                    finished_at=now,
                )
            )
            self.delivered += 1


def _after(
    prefix: ParkedRollout | None, spans: list[tuple[int, int, int]]
) -> list[tuple[int, int, int]]:
    """A continuation's version spans after its prefix's (one span per version)."""
    if prefix is None:
        return spans
    k = len(prefix)
    out = list(prefix.versions)
    for v, a, b in spans:
        if b <= a and out:
            continue
        if out and out[-1][0] == v and out[-1][2] == a + k:
            out[-1] = (v, out[-1][1], b + k)
        else:
            out.append((v, a + k, b + k))
    return out


class SyntheticTrainer(BatchConsumer):
    name = "trainer"
    retry_s = 0.02

    def __init__(self, cfg: Config, rank: int) -> None:
        super().__init__(cfg, rank)
        self.cfg: Config = cfg
        self.version = 0
        self.step_no = 0
        # Built now, while the rank is still registering: importing torch takes seconds
        # here, and inside the first step it would silence the rank's heartbeats.
        self._build()
        from runtime.config.layout import parse_ratio

        assert cfg.resources.initial_ratio is not None, "config not validated"
        self.trainer_ranks = parse_ratio(cfg.resources.initial_ratio)[1]
        if cfg.reflow.policy.colocated:  # every rank trains (and no layout change says so)
            self.trainer_ranks = cfg.world_size

    def on_layout(self, change) -> None:
        self.trainer_ranks = max(1, len(change.ranks("trainer")))

    def _build(self) -> None:
        import torch

        torch.manual_seed(self.cfg.train.seed)
        self._model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
        self._opt = torch.optim.AdamW(self._model.parameters(), lr=self.cfg.train.lr)

    def save_checkpoint(self, checkpoints, step: int) -> None:
        """The leader's model, optimizer and RNG (one replica: the others hold nothing)."""
        import torch

        from runtime.engines.torch.sharded_state import save_sharded
        from runtime.store import checkpoint

        if not self.leader:
            return
        if self.step_no != step:
            raise RuntimeError(f"asked for step {step}, the trainer is at {self.step_no}")
        staging = checkpoint.start(checkpoints, step)
        extra = {"step": self.step_no, "version": self.version, "torch_rng": torch.get_rng_state()}
        save_sharded(checkpoint.trainer_dir(staging), self._model, self._opt, extra)

    def restore(self, folder) -> None:
        import torch

        from runtime.engines.torch.sharded_state import load_sharded
        from runtime.store.checkpoint import trainer_dir

        self._build()
        # weights_only for the extras: no code runs
        extra = load_sharded(trainer_dir(folder), self._model, self._opt)
        torch.set_rng_state(extra["torch_rng"])
        self.step_no, self.version = extra["step"], extra["version"]

    def observe(self, step: int, policy_version: int) -> None:
        self.step_no = max(self.step_no, step)
        self.version = max(self.version, policy_version)

    def train_batch(self, msg: p.Batch) -> None:
        import torch

        from runtime.engines.torch.loss import batch_loss

        if not self.leader:
            return  # one replica, no process group: the other trainer ranks stand by
        start = time.perf_counter()
        samples = wire.batch(msg).samples
        width = max(len(s.token_ids) for s in samples)
        tokens = torch.zeros(len(samples), width + 1, dtype=torch.long)
        behavior = torch.zeros(len(samples), width)
        mask = torch.zeros(len(samples), width)
        for i, s in enumerate(samples):
            n = len(s.token_ids)
            tokens[i, 1 : n + 1] = torch.tensor(s.token_ids)
            behavior[i, :n] = torch.tensor(s.logprobs)
            mask[i, : s.n_valid] = 1
        k = self.cfg.train.mini_batches

        def logprobs(rows: list[int]) -> torch.Tensor:
            logits = self._model(tokens[rows, :-1])
            return torch.log_softmax(logits, -1).gather(-1, tokens[rows, 1:, None]).squeeze(-1)

        old = None
        if self.cfg.algorithm.recompute_old_logprobs:  # before the step's first update
            with torch.no_grad():
                old = logprobs(list(range(len(samples))))
        losses, clipped = [], []
        for j in range(k):  # the batch in k optimizer updates, strided as the real trainer
            rows = list(range(j, len(samples), k))
            logp = logprobs(rows)
            mini = [samples[i] for i in rows]
            old_rows = None if old is None else old[rows]
            loss, stats = batch_loss(
                logp,
                old_rows,
                behavior[rows],
                mask[rows],
                mini,
                self.cfg.algorithm,
                self.cfg.reflow.tau,
            )
            self._opt.zero_grad()
            loss.backward()
            self._opt.step()
            losses.append(stats.loss)
            clipped.append(stats.clip_fraction)
        # Simulated data parallelism: the compute a real trainer would do, shared by the
        # trainer ranks (only the leader computes here).
        tokens = sum(s.n_valid for s in samples)
        time.sleep(tokens * self.cfg.engine.synthetic_train_token_s / self.trainer_ranks)
        self.step_no += 1
        self.version = self.cfg.train.version_at(self.step_no)
        self._send(
            p.StepDone(
                rank=self.rank,
                step=self.step_no,
                policy_version=self.version,
                batch_id=msg.batch_id,
                metrics={
                    "loss": sum(losses) / k,
                    "clip_fraction": sum(clipped) / k,
                    "optimizer_updates": float(k),
                    "step_time_s": time.perf_counter() - start,
                },
            )
        )


def synthetic_rollout(
    cfg: Config, rank: int, paths: object, collective: object = None
) -> SyntheticRollout:
    size = cfg.resources.rollout_gpus_per_replica
    if not is_rollout_driver(rank, size):
        raise ValueError(
            f"rank {rank} does not drive its rollout replica (resources."
            f"rollout_gpus_per_replica {size}): rank {rank - rank % size} runs its engine"
        )
    return SyntheticRollout(cfg, rank)


def synthetic_trainer(
    cfg: Config, rank: int, paths: object, collective: object = None
) -> SyntheticTrainer:
    return SyntheticTrainer(cfg, rank)


def _head(g: _Generation) -> int:
    """Tokens of a generation generated before a stop (continued, not redone)."""
    return len(g.request.resume) if g.request.resume is not None else 0
