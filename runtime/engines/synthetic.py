"""Synthetic engines: the data plane end to end without a language model.

``SyntheticRollout`` stands in for an LLM engine: each request "generates" a long-tailed
number of tokens (log-normal, p99/p50 about 6) at a fixed per-token time, with random
token ids and log-probs, and a 0/1 reward from a per-prompt success rate. It tracks policy
versions like a real engine does across a weight sync: a generation that spans a version
change records two spans (partial rollout).

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
from dataclasses import dataclass, field
from typing import Any

from runtime.config.schema import Config
from runtime.data.sample import Trajectory
from runtime.rank.sides import BatchConsumer, LinkedSide
from runtime.transport import frames as wire
from runtime.transport import protocol as p

VOCAB = 64


def synthetic_prompts(seed: int) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    for i in itertools.count():
        yield {"id": i, "success_rate": round(rng.random(), 3)}


class _SyntheticSide(LinkedSide):
    def __init__(self, cfg: Config, rank: int) -> None:
        super().__init__(cfg, rank)
        self.cfg: Config = cfg
        self.version = 0


@dataclass
class _Generation:
    request: dict[str, Any]
    n_tokens: int
    started: float
    done_at: float
    spans: list[list[int]] = field(default_factory=list)  # [version, first, end]


def length_multiplier(schedule: list[tuple[int, float]], version: int) -> float:
    """Piecewise-linear multiplier of the response length at a policy version (a workload
    whose responses grow, then shrink, drives the allocator in tests)."""
    if not schedule:
        return 1.0
    if version <= schedule[0][0]:
        return schedule[0][1]
    for (v0, m0), (v1, m1) in itertools.pairwise(schedule):
        if version <= v1:
            return m0 + (m1 - m0) * (version - v0) / max(v1 - v0, 1)
    return schedule[-1][1]


class SyntheticRollout(_SyntheticSide):
    name = "rollout"

    def __init__(self, cfg: Config, rank: int) -> None:
        super().__init__(cfg, rank)
        self.slots = min(cfg.scheduler.max_concurrency, 16)
        self.token_time_s = cfg.engine.synthetic_token_s
        self.schedule = sorted((int(k), v) for k, v in cfg.engine.synthetic_length_schedule.items())
        self.rng = random.Random(cfg.train.seed * 1000 + rank)
        self.running: dict[int, _Generation] = {}
        self.delivered = 0

    def deactivate(self) -> None:
        # Leaving the rollout pool: in-flight work is dropped; the coordinator requeues it.
        self.active = False
        self.running.clear()
        self._asked = False

    @property
    def state(self) -> str:
        return "busy" if self.running else "idle"

    def _median(self) -> float:
        cap = self.cfg.workload.max_response_tokens
        return cap / 8 * length_multiplier(self.schedule, self.version)

    def _length(self) -> int:
        cap = self.cfg.workload.max_response_tokens
        return max(1, min(cap, int(self.rng.lognormvariate(math.log(self._median()), 0.8))))

    def _free_slots(self) -> int:
        free = self.slots - len(self.running)
        budget = self.cfg.engine.synthetic_kv_tokens
        if budget:  # a KV cache holds so many tokens: long responses, fewer at once
            expected = self._median() * math.exp(0.8**2 / 2)  # log-normal mean
            held = sum(g.n_tokens for g in self.running.values())
            free = min(free, int((budget - held) // expected))
        return free

    def _set_version(self, version: int, now: float) -> None:
        if version <= self.version:
            return
        for g in self.running.values():
            done = min(g.n_tokens, int((now - g.started) / self.token_time_s))
            last = g.spans[-1]
            if done > last[1]:  # close the span at the tokens generated so far
                last[2] = done
                g.spans.append([version, done, done])
            else:
                last[0] = version
        self.version = version

    def on_message(self, msg: p.Message) -> None:
        now = time.monotonic()
        if isinstance(msg, (p.Work, p.HeartbeatAck)):
            self._set_version(msg.policy_version, now)
        if isinstance(msg, p.Work):
            self._asked = False
            if not msg.requests:  # nothing admissible now: do not spin on the coordinator
                self._retry_at = now + 0.05
            for req in msg.requests:
                if req["sample_id"] in self.running:
                    continue  # handed back after a timeout while our copy still runs
                n = self._length()
                self.running[req["sample_id"]] = _Generation(
                    req, n, now, now + n * self.token_time_s, [[self.version, 0, 0]]
                )

    def step(self) -> None:
        if not self.active:
            return
        now = time.monotonic()
        for sid in [s for s, g in self.running.items() if g.done_at <= now]:
            g = self.running.pop(sid)
            g.spans[-1][2] = g.n_tokens
            req = g.request
            rate = float(req["prompt"].get("success_rate", 0.5))
            t = Trajectory(
                sample_id=sid,
                group_id=req["group_id"],
                prompt_id=req["prompt_id"],
                versions=[(s[0], s[1], s[2]) for s in g.spans],
                token_ids=[self.rng.randrange(VOCAB) for _ in range(g.n_tokens)],
                logprobs=[-math.log(VOCAB)] * g.n_tokens,
                reward=float(self.rng.random() < rate),
                n_valid=g.n_tokens,
                worker=self.rank,
                started_at=g.started,
                finished_at=now,
            )
            self._send(wire.sample_done(t, self.rank))
            self.delivered += 1
        free = self._free_slots()
        if free > 0 and self._may_ask(now):
            self._ask(p.WorkRequest(rank=self.rank, slots=free), now)


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

    def on_layout(self, change) -> None:
        self.trainer_ranks = max(1, len(change.ranks("trainer")))

    def _build(self) -> None:
        import torch

        torch.manual_seed(self.cfg.train.seed)
        self._model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))
        self._opt = torch.optim.AdamW(self._model.parameters(), lr=self.cfg.train.lr)

    def save_checkpoint(self, path, step: int) -> None:
        import torch

        if self.step_no != step:
            raise RuntimeError(f"asked for step {step}, the trainer is at {self.step_no}")
        tmp = path.with_suffix(".tmp")
        torch.save(
            {
                "step": self.step_no,
                "version": self.version,
                "model": self._model.state_dict(),
                "optimizer": self._opt.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
            tmp,
        )
        tmp.rename(path)

    def restore(self, folder) -> None:
        import torch

        from runtime.store.checkpoint import TRAINER_FILE, load_trainer_state

        state = load_trainer_state(folder / TRAINER_FILE)  # weights_only: no code runs
        self._build()
        self._model.load_state_dict(state["model"])
        self._opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["torch_rng"])
        self.step_no, self.version = state["step"], state["version"]

    def observe(self, step: int, policy_version: int) -> None:
        self.step_no = max(self.step_no, step)
        self.version = max(self.version, policy_version)

    def train_batch(self, msg: p.Batch) -> None:
        import torch

        from runtime.engines.torch.loss import batch_loss

        if not self.leader:
            return  # one replica, no process group: the other trainer ranks stand by
        start = time.perf_counter()
        samples = wire.batch_samples(msg)
        width = max(len(s["token_ids"]) for s in samples)
        tokens = torch.zeros(len(samples), width + 1, dtype=torch.long)
        behavior = torch.zeros(len(samples), width)
        mask = torch.zeros(len(samples), width)
        for i, s in enumerate(samples):
            n = len(s["token_ids"])
            tokens[i, 1 : n + 1] = torch.tensor(s["token_ids"])
            behavior[i, :n] = torch.tensor(s["logprobs"])
            mask[i, : s["n_valid"]] = 1
        logits = self._model(tokens[:, :-1])
        logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None]).squeeze(-1)
        loss, stats = batch_loss(logp, behavior, mask, samples, self.cfg)
        self._opt.zero_grad()
        loss.backward()
        self._opt.step()
        # Simulated data parallelism: the compute a real trainer would do, shared by the
        # trainer ranks (only the leader computes here).
        tokens = sum(s["n_valid"] for s in samples)
        time.sleep(tokens * self.cfg.engine.synthetic_train_token_s / self.trainer_ranks)
        self.step_no += 1
        self.version = max(self.version, msg.policy_version) + 1
        self._send(
            p.StepDone(
                rank=self.rank,
                step=self.step_no,
                policy_version=self.version,
                batch_id=msg.batch_id,
                metrics={
                    "loss": stats.loss,
                    "clip_fraction": stats.clip_fraction,
                    "step_time_s": time.perf_counter() - start,
                },
            )
        )


def synthetic_rollout(
    cfg: Config, rank: int, paths: object, collective: object = None
) -> SyntheticRollout:
    return SyntheticRollout(cfg, rank)


def synthetic_trainer(
    cfg: Config, rank: int, paths: object, collective: object = None
) -> SyntheticTrainer:
    return SyntheticTrainer(cfg, rank)
