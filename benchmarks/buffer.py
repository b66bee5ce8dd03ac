"""Replay-buffer throughput: insert + sample, against a list + random.sample baseline.

Both sides do the same work per sample: take a finished sample in, and hand it out in
a batch of ``b``. ReFlow's buffer additionally completes groups (advantages), enforces the
unused minimum and staleness, and reinserts consumed samples as replay. Run:

    .venv/bin/python benchmarks/buffer.py [--samples 200000] [--batch 256]

Prints samples/s for both and the ratio, measured in this run on one core.
"""

from __future__ import annotations

import argparse
import random
import time

from runtime.control.replay_buffer import ReplayBuffer
from runtime.control.samplers import AcceptAll
from runtime.data.sample import Sample


def make_samples(n: int, group: int) -> list[Sample]:
    return [
        Sample(
            sample_id=i,
            group_id=i // group,
            prompt_id=i // group,
            versions=[(0, 0, 8)],
            token_ids=[1] * 8,
            logprobs=[-1.0] * 8,
            reward=float(i % 3 == 0),
            n_valid=8,
            worker=1,
        )
        for i in range(n)
    ]


def bench_reflow(samples: list[Sample], b: int, group: int) -> float:
    buf = ReplayBuffer(
        batch_size=b, sigma=0.5, delta=1, group_size=group, replay_filter=AcceptAll(), seed=0
    )
    version = 0
    start = time.perf_counter()
    for t in samples:
        t.versions = [(version, 0, 8)]
        buf.add(t)
        if len(buf.unused) >= b:
            batch = buf.sample_batch(version)
            if batch is not None:
                buf.complete_batch(batch.batch_id)
                version += 1
    return len(samples) / (time.perf_counter() - start)


def bench_baseline(samples: list[Sample], b: int) -> float:
    rng = random.Random(0)
    pool: list[Sample] = []
    start = time.perf_counter()
    for t in samples:
        pool.append(t)
        if len(pool) >= b:
            batch = rng.sample(pool, b)
            taken = {id(x) for x in batch}
            pool = [x for x in pool if id(x) not in taken]
    return len(samples) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    reflow_rates, base_rates = [], []
    for _ in range(args.repeats):
        base_rates.append(bench_baseline(make_samples(args.samples, args.group), args.batch))
        reflow_rates.append(
            bench_reflow(make_samples(args.samples, args.group), args.batch, args.group)
        )
    r, base = max(reflow_rates), max(base_rates)
    print(f"samples={args.samples} batch={args.batch} group={args.group} (best of {args.repeats})")
    print(f"baseline list+random.sample : {base:12,.0f} samples/s")
    print(f"ReplayBuffer insert+sample  : {r:12,.0f} samples/s")
    print(f"ratio ReplayBuffer/baseline : {r / base:.2f}")
    print(f"target >= 50,000 samples/s  : {'met' if r >= 50_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
