"""ReFlow's sample pool: group completion, staleness eviction, batch sampling with replay.

Pure logic (no I/O, no clock): the coordinator owns one and drives it.

Batch rule, for batch size ``b`` and replay cap ``sigma``:

- at least ``ceil(b * (1 - sigma))`` unused samples, else no batch (the trainer waits);
- unused samples first, up to ``b``; the rest from the replay pool;
- if unused + replay cannot make ``b``, no batch either.

Staleness: a sample is eligible while ``current_version - version <= delta``, where a
sample's version is that of its oldest span (``age_from="oldest_span"``, the default) or,
for a partial rollout that crossed a weight sync, of its newest span (``"newest_span"``:
its older spans' tokens are then older than ``delta``, and the loss's per-token
importance ratios, ``algorithm.tis_cap``, are what corrects them); older ones are
evicted (reason ``stale_unused`` / ``stale_replay``).

Stragglers (``max_stragglers`` > 0): a group becomes available only once all its members
are in, and its members all carry the version they were dispatched at; one member that
generates for more than ``delta`` versions then makes the whole group stale on arrival.
So when a batch is the last that may take a group's finished members (its caller, which
counts steps, says which versions: ``last_chance``) and at most ``max_stragglers``
members are still missing (two or more in), the group is *closed*:
it completes with the members in (advantages over them), and a missing member that
arrives later is evicted as ``straggler``.

Fresh samples are taken oldest version first, in arrival order within a version
(``fresh_order="oldest"``, the default with the built-in samplers: the FIFO queue
verl's fully-async trainer reads),
so that a batch never leaves an older sample to expire while it takes a newer one; with
``"sampler"`` the sampler's ``select`` chooses among them, as it always does for replay.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from collections.abc import Set as AbstractSet

from runtime.control.samplers import BatchSampler, RandomSampler, ReplayFilter
from runtime.data.sample import Batch, Phase, Sample, sample_from_state, sample_state

__all__ = ["AGE_FROM", "FRESH_ORDERS", "Batch", "ReplayBuffer", "version_of"]

FRESH_ORDERS = ("oldest", "sampler")
AGE_FROM = ("oldest_span", "newest_span")


def _oldest(t: Sample) -> int:
    return t.oldest_version


def _newest(t: Sample) -> int:
    return t.newest_version


def version_of(age_from: str) -> Callable[[Sample], int]:
    """The version a sample's age counts from (module doc)."""
    return _newest if age_from == "newest_span" else _oldest


_TINY = 1e-6


class ReplayBuffer:
    def __init__(
        self,
        *,
        batch_size: int,
        sigma: float,
        delta: int,
        group_size: int,
        sampler: BatchSampler | None = None,
        replay_filter: ReplayFilter | None = None,
        seed: int = 0,
        fresh_order: str = "oldest",
        age_from: str = "oldest_span",
        max_stragglers: int = 0,
    ) -> None:
        if not 0 <= sigma < 1:
            raise ValueError("sigma must be in [0, 1)")
        self.batch_size = batch_size
        self.sigma = sigma
        self.delta = delta
        self.group_size = group_size
        self.sampler: BatchSampler = sampler or RandomSampler()
        self.replay_filter = replay_filter
        self.rng = random.Random(seed)
        if fresh_order not in FRESH_ORDERS:
            raise ValueError(f"fresh_order {fresh_order!r}: expected one of {FRESH_ORDERS}")
        if age_from not in AGE_FROM:
            raise ValueError(f"age_from {age_from!r}: expected one of {AGE_FROM}")
        self.fresh_order = fresh_order
        self.version_of = version_of(age_from)
        self.min_unused = math.ceil(batch_size * (1 - sigma) - 1e-9)
        if max_stragglers < 0:
            raise ValueError(f"max_stragglers {max_stragglers}: expected >= 0")
        self.max_stragglers = max_stragglers
        # groups closed without their stragglers: a member arriving later is dropped
        self._closed: set[int] = set()
        self._groups: dict[int, list[Sample]] = {}
        self._n_waiting = 0  # samples in incomplete groups (kept in step: a hot path)
        self.unused: dict[int, Sample] = {}
        self.replay: dict[int, Sample] = {}
        self.in_batch: dict[int, Batch] = {}
        self._by_version: dict[int, set[int]] = {}
        self._next_batch = 0
        self._ids: set[int] = set()  # every sample held, in any phase
        self.transitions: Counter[str] = Counter()
        self.evicted: Counter[str] = Counter()
        self.recent: list[tuple[int, int]] = []  # (unused, replay) of the last batches
        # why the last sample_batch made none: too few fresh, too little replay, or the
        # sampler picked fewer than it needed (None: it made one)
        self.shortfall: str | None = None
        # work wasted and the length bias of eviction: tokens of samples evicted by
        # reason, and (count, tokens) of evicted vs first consumed samples
        self.evicted_tokens: Counter[str] = Counter()
        self.length_tally: dict[str, list[int]] = {"evicted": [0, 0], "consumed": [0, 0]}

    # --- arrival -----------------------------------------------------------------------

    def add(self, t: Sample) -> None:
        """A finished sample; it becomes available once its whole group is in."""
        if t.sample_id in self._ids:
            raise ValueError(f"sample {t.sample_id} delivered twice")
        t.phase = Phase.FINISHED
        if t.group_id in self._closed:  # its group trained without it (module doc)
            self._evict(t, Phase.FINISHED, "straggler")
            return
        group = self._groups.setdefault(t.group_id, [])
        self._ids.add(t.sample_id)
        group.append(t)
        self._n_waiting += 1
        if len(group) >= self.group_size:
            self._complete(t.group_id)

    def _complete(self, group_id: int) -> None:
        group = self._groups.pop(group_id)
        self._n_waiting -= len(group)
        mean, std = _group_stats(tuple(sorted(t.reward for t in group)))
        for t in group:
            t.advantage = (t.reward - mean) / (std + _TINY)
            t.group_mean_reward = mean
        if not self.sampler.accept_group(group):
            for t in group:
                self._evict(t, Phase.FINISHED, "sampler_rejected")
            return
        for t in group:
            self._enter(t, Phase.FINISHED, Phase.AVAILABLE, self.unused)

    # --- pools -------------------------------------------------------------------------

    def _enter(self, t: Sample, src: Phase, dst: Phase, pool: dict[int, Sample]) -> None:
        t.phase = dst
        pool[t.sample_id] = t
        self._by_version.setdefault(self.version_of(t), set()).add(t.sample_id)
        self.transitions[f"{src.value}->{dst.value}"] += 1

    def _leave_pool(self, t: Sample) -> None:
        pool = self.unused if t.phase is Phase.AVAILABLE else self.replay
        del pool[t.sample_id]
        version = self.version_of(t)
        bucket = self._by_version[version]
        bucket.discard(t.sample_id)
        if not bucket:
            del self._by_version[version]

    def _evict(self, t: Sample, src: Phase, reason: str) -> None:
        t.phase = Phase.EVICTED
        self._ids.discard(t.sample_id)
        self.transitions[f"{src.value}->evicted"] += 1
        self.evicted[reason] += 1
        self.evicted_tokens[reason] += t.n_valid
        if src is not Phase.REPLAYED:  # never trained on: its generation was wasted
            tally = self.length_tally["evicted"]
            tally[0], tally[1] = tally[0] + 1, tally[1] + t.n_valid

    def evict_stale(self, current_version: int) -> int:
        """Drop pool samples older than ``delta`` versions; returns how many."""
        limit = current_version - self.delta
        n = 0
        for version in [v for v in self._by_version if v < limit]:
            for sid in list(self._by_version[version]):
                t = self.unused.get(sid) or self.replay[sid]
                src = t.phase
                self._leave_pool(t)
                self._evict(t, src, "stale_unused" if src is Phase.AVAILABLE else "stale_replay")
                n += 1
        return n

    def close_expiring(self, up_to_version: int) -> None:
        """Close the groups whose finished members are of ``up_to_version`` or older (the
        caller's: those the batch being made is the last to take) with at most
        ``max_stragglers`` members missing (module doc)."""
        if self.max_stragglers <= 0:
            return
        least = max(2, self.group_size - self.max_stragglers)
        closing = [
            g
            for g, members in self._groups.items()
            if len(members) >= least and min(map(self.version_of, members)) <= up_to_version
        ]
        for g in closing:
            self._closed.add(g)
            self._complete(g)

    # --- batches -----------------------------------------------------------------------

    def sample_batch(self, current_version: int, last_chance: int | None = None) -> Batch | None:
        """A batch of exactly ``batch_size`` samples, or None when the rule cannot be met.
        ``last_chance``: the newest version this batch is the last to take; groups of it
        or older close first, without their stragglers (module doc)."""
        if last_chance is not None:
            self.close_expiring(last_chance)
        self.evict_stale(current_version)
        b = self.batch_size
        self.shortfall = "fresh"
        if len(self.unused) < self.min_unused:
            return None
        self.shortfall = "replay"
        if len(self.unused) + len(self.replay) < b:
            return None
        self.shortfall = "sampler"
        if self.fresh_order == "oldest":
            # sorted() is stable: arrival order within a version
            fresh = sorted(self.unused.values(), key=self.version_of)[:b]
        else:
            fresh = self.sampler.select(list(self.unused.values()), b, self.rng)
        if len(fresh) < self.min_unused:
            return None
        need = b - len(fresh)
        old = self.sampler.select(list(self.replay.values()), need, self.rng) if need else []
        if len(old) < need:
            return None
        self.shortfall = None
        batch = Batch(self._next_batch, current_version, [*fresh, *old], len(fresh), len(old))
        self._next_batch += 1
        for t in batch.samples:
            src = t.phase
            self._leave_pool(t)
            t.phase = Phase.CONSUMED
            self.transitions[f"{src.value}->consumed"] += 1
        tally = self.length_tally["consumed"]
        tally[0] += batch.n_unused
        tally[1] += sum(t.n_valid for t in batch.samples[: batch.n_unused])
        self.in_batch[batch.batch_id] = batch
        self.recent = [*self.recent[-19:], (batch.n_unused, batch.n_replay)]
        return batch

    def complete_batch(self, batch_id: int) -> None:
        """Training on the batch is done: samples the filter keeps come back as replay."""
        batch = self.in_batch.pop(batch_id)
        for t in batch.samples:
            if self.replay_filter is not None and self.replay_filter.keep(t):
                t.replay_count += 1
                self._enter(t, Phase.CONSUMED, Phase.REPLAYED, self.replay)
            else:
                t.phase = Phase.RETIRED
                self._ids.discard(t.sample_id)
                self.transitions["consumed->retired"] += 1

    # --- checkpoints -------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Everything held, as plain data; only between batches (none in training)."""
        if self.in_batch:
            raise ValueError("a batch is in training: checkpoint at a step boundary")
        return {
            "groups": {str(g): [sample_state(t) for t in ts] for g, ts in self._groups.items()},
            # lists, not maps: the pools' order feeds the sampler, so it must survive
            "unused": [sample_state(t) for t in self.unused.values()],
            "replay": [sample_state(t) for t in self.replay.values()],
            "rng": _rng_state(self.rng),
            "next_batch": self._next_batch,
            "transitions": dict(self.transitions),
            "evicted": dict(self.evicted),
            "evicted_tokens": dict(self.evicted_tokens),
            "length_tally": {k: list(v) for k, v in self.length_tally.items()},
            "recent": [list(x) for x in self.recent],
            "closed_groups": sorted(self._closed),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace the contents with a :meth:`state_dict` (same batch size, sigma, delta)."""
        self._groups = {
            int(g): [sample_from_state(d) for d in ts] for g, ts in state["groups"].items()
        }
        self._n_waiting = sum(len(g) for g in self._groups.values())
        self.unused, self.replay, self.in_batch, self._by_version = {}, {}, {}, {}
        for pool, key in ((self.unused, "unused"), (self.replay, "replay")):
            for d in state[key]:
                t = sample_from_state(d)
                pool[t.sample_id] = t
                self._by_version.setdefault(self.version_of(t), set()).add(t.sample_id)
        self._ids = {t.sample_id for t in self.samples()}
        self.rng.setstate(_rng_from_state(state["rng"]))
        self._next_batch = int(state["next_batch"])
        self.transitions = Counter(state["transitions"])
        self.evicted = Counter(state["evicted"])
        self.evicted_tokens = Counter(state["evicted_tokens"])
        self.length_tally = {k: [int(a), int(b)] for k, (a, b) in state["length_tally"].items()}
        self.recent = [(int(a), int(b)) for a, b in state["recent"]]
        # (checkpoints from before straggler closing have none)
        self._closed.clear()  # in place: a view of it handed out stays live
        self._closed.update(int(g) for g in state.get("closed_groups", []))

    # --- inspection --------------------------------------------------------------------

    def holds(self, sample_id: int) -> bool:
        return sample_id in self._ids

    @property
    def closed_groups(self) -> AbstractSet[int]:
        """Groups that trained without their stragglers (a live, read-only view)."""
        return self._closed

    @property
    def n_waiting_for_group(self) -> int:
        return self._n_waiting

    def samples(self) -> Iterable[Sample]:
        """Every sample the buffer holds, in any phase."""
        for group in self._groups.values():
            yield from group
        yield from self.unused.values()
        yield from self.replay.values()
        for batch in self.in_batch.values():
            yield from batch.samples

    def stats(self) -> dict:
        u = sum(n for n, _ in self.recent)
        r = sum(n for _, n in self.recent)
        return {
            "waiting_for_group": self.n_waiting_for_group,
            "unused": len(self.unused),
            "replay": len(self.replay),
            "in_batch": sum(len(b.samples) for b in self.in_batch.values()),
            "consumed": sum(v for k, v in self.transitions.items() if k.endswith("->consumed")),
            "replayed": self.transitions["consumed->replayed"],
            "retired": self.transitions["consumed->retired"],
            "evicted": dict(self.evicted),
            "evicted_tokens": dict(self.evicted_tokens),
            "replay_fraction_recent": round(r / (u + r), 4) if u + r else 0.0,
        }

    def length_bias(self) -> dict[str, float | None]:
        """Mean response tokens of the samples evicted before any training, against those
        of the samples trained on fresh: what the eviction rule (a sample is as old as its
        oldest version span) costs long responses."""
        out: dict[str, float | None] = {}
        for key, (n, tokens) in self.length_tally.items():
            out[f"{key}_mean_tokens"] = round(tokens / n, 2) if n else None
        return out


@functools.lru_cache(maxsize=4096)
def _group_stats(rewards: tuple[float, ...]) -> tuple[float, float]:
    """Mean and population standard deviation of a group's rewards (sorted: both are exact
    or correctly rounded, so the order does not matter). Cached: rewards are mostly 0/1,
    so a few groups' values repeat, and ``pstdev`` computes in exact fractions."""
    std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
    return statistics.fmean(rewards), std


def _rng_state(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_state(state: list) -> tuple:
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
