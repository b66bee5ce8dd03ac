"""Generation scheduling: adaptive caps + token-aware routing vs a fixed cap + round-robin,
and the router's decision latency at 1,024 workers.

1. Throughput, in simulation (``runtime/sim/engine_model.py``: continuous batching over a
   fixed KV cache, prefix sharing among siblings, recompute preemption): the same request
   stream (GRPO groups of 8, long-tailed responses) on the same simulated workers, once
   with a fixed concurrency cap and round-robin placement, once with the real
   :class:`ConcurrencyController` (AIMD) and :class:`TokenRouter` deciding. Useful tokens
   per simulated second, and the ratio. Simulated, not measured on engines.
2. Latency of one routing decision (route + release) with 1,024 workers, real code, wall
   clock: p50 and p99 in microseconds.
3. ``--real N``: the demo recipe on real vLLM engines (CPU build), same 4 ranks, one run
   after the other in this invocation, with a KV cache of ``--real-kv`` bytes per engine:
   a fixed cap (``scheduler.max_concurrency``, no token admission) against AIMD caps +
   token admission, N training steps each; rollout tokens/s over the training window
   (``summary.json``). Work is pulled by the ranks, so there is no round-robin here: the
   baseline is the fixed cap alone.

    .venv/bin/python benchmarks/scheduling.py [--workers 8] [--groups 300] [--seed 0]
                                              [--real 30 [--real-kv 2097152]]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import time
from collections import deque

from push_router import PushRouter  # a sibling: benchmarks/ run as scripts

from runtime.control.scheduling import ConcurrencyController, WorkerSignals
from runtime.control.scheduling.concurrency import AimdSettings
from runtime.sim.engine_model import SimEngine, SimRequest


def workload(groups: int, n: int, seed: int) -> list[SimRequest]:
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = rng.randint(300, 1500)
        for _ in range(n):
            length = min(6000, max(16, int(rng.lognormvariate(math.log(700), 0.9))))
            out.append(SimRequest(len(out), g, prompt, length))
    return out


def simulate(reqs: list[SimRequest], workers: int, kv: int, adaptive: bool, fixed_cap: int):
    engines = [SimEngine(kv) for _ in range(workers)]
    queue = deque(SimRequest(r.rid, r.group, r.prompt, r.length) for r in reqs)
    useful = sum(r.length for r in reqs)
    caps = [
        ConcurrencyController(AimdSettings(min_cap=1, max_cap=256, initial_cap=fixed_cap))
        for _ in engines
    ]
    router = PushRouter()
    for i in range(workers):
        router.add_worker(i, budget=kv, cap=fixed_cap)
    rr = 0
    clock = [0.0] * workers  # each engine's own time
    next_update = 1.0
    where: dict[int, int] = {}

    def dispatch(now: float) -> None:
        nonlocal rr
        while queue:
            r = queue[0]
            if adaptive:
                w = router.route(r.rid, r.group, r.prompt)
                if w is None:
                    return
            else:
                free = [
                    i for i in range(workers) if engines[(rr + i) % workers].outstanding < fixed_cap
                ]
                if not free:
                    return
                w = (rr + free[0]) % workers
                rr = w + 1
            queue.popleft()
            where[r.rid] = w
            engines[w].submit(r)

    dispatch(0.0)
    heap = [(0.0, i) for i in range(workers)]
    done = 0
    while done < len(reqs):
        now, i = heapq.heappop(heap)  # the engine whose step comes first
        dt, finished = engines[i].step()
        for r in finished:
            done += 1
            router.finished(r.rid, r.length)
        if adaptive and now >= next_update:
            for j, e in enumerate(engines):
                sig = WorkerSignals(
                    e.kv_used() / e.kv_tokens, len(e.waiting), e.preemptions, len(e.running)
                )
                cap = caps[j].update(sig)
                router.observe(
                    j, util=sig.kv_util, queue=sig.waiting, pressure=caps[j].preempt_growth, cap=cap
                )
            next_update = now + 1.0
        dispatch(now)
        clock[i] = now + (dt if dt > 0 else 0.01)
        heapq.heappush(heap, (clock[i], i))
    return useful / now, sum(e.preemptions for e in engines)


def latency(workers: int = 1024, decisions: int = 50_000, seed: int = 0) -> tuple[float, float]:
    rng = random.Random(seed)
    r = PushRouter()
    for i in range(workers):
        r.add_worker(i, budget=200_000, cap=256)
    live: list[int] = []
    lat = []
    for req in range(decisions):
        if live and rng.random() < 0.5:
            r.finished(live.pop(rng.randrange(len(live))), rng.randint(100, 2000))
        start = time.perf_counter_ns()
        w = r.route(req, req // 8, rng.randint(100, 1000))
        lat.append(time.perf_counter_ns() - start)
        if w is not None:
            live.append(req)
    lat.sort()
    return lat[len(lat) // 2] / 1000, lat[int(len(lat) * 0.99)] / 1000


def real_runs(steps: int, kv: int) -> list[tuple[str, dict]]:
    """Two demo runs on real engines; (policy, summary) each."""
    import json
    import os
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    runs = Path(tempfile.mkdtemp(prefix="reflow-sched-"))
    out = []
    for name, adaptive in (("fixed", "false"), ("adaptive", "true")):
        sets = [
            f"name=sched-{name}",
            f"train.steps={steps}",
            f"engine.kv_cache_memory_bytes={kv}",
            f"scheduler.adaptive_caps={adaptive}",
            f"scheduler.token_admission={adaptive}",
            "scheduler.cap_interval_s=1.0",
        ]
        cmd = [
            sys.executable,
            "-m",
            "reflow_cli.main",
            "launch",
            str(repo / "recipes/demo.yaml"),
            "--local",
            "--wait",
        ] + [a for s in sets for a in ("--set", s)]
        env = {**os.environ, "REFLOW_RUNS_DIR": str(runs)}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=repo)
        run_dir = next(runs.glob(f"sched-{name}-*"))
        if done.returncode != 0:
            raise SystemExit(f"{name}: run failed; see {run_dir}")
        out.append((name, json.loads((run_dir / "summary.json").read_text())))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--groups", type=int, default=300)
    ap.add_argument("--kv", type=int, default=48_000, help="KV tokens per simulated worker")
    ap.add_argument("--fixed-cap", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real", type=int, default=0, help="steps of each real-engine run")
    ap.add_argument("--real-kv", type=int, default=2 << 20, help="KV bytes per real engine")
    args = ap.parse_args()
    reqs = workload(args.groups, 8, args.seed)
    base, base_pre = simulate(reqs, args.workers, args.kv, False, args.fixed_cap)
    adapt, adapt_pre = simulate(reqs, args.workers, args.kv, True, args.fixed_cap)
    print(
        f"simulated: {args.workers} workers x {args.kv} KV tokens, {len(reqs)} requests "
        f"(groups of 8), fixed cap {args.fixed_cap}"
    )
    print("| policy | useful tokens/s (simulated) | preemptions | ratio |")
    print("|---|---|---|---|")
    print(f"| fixed cap + round-robin | {base:,.0f} | {base_pre} | 1.00 |")
    print(f"| AIMD caps + token-aware routing | {adapt:,.0f} | {adapt_pre} | {adapt / base:.2f} |")
    p50, p99 = latency()
    print(f"routing decision at 1,024 workers (wall clock): p50 {p50:.1f} us, p99 {p99:.1f} us")
    if args.real:
        rows = real_runs(args.real, args.real_kv)
        base_rate = rows[0][1]["rollout_tokens_per_s"]
        print(f"\nreal engines: demo recipe, {args.real} steps, {args.real_kv} KV bytes per engine")
        print("| policy | rollout tokens/s | trainer tokens/s | ratio |")
        print("|---|---|---|---|")
        for name, s in rows:
            rate = s["rollout_tokens_per_s"]
            print(
                f"| {name} | {rate:,.0f} | {s['trainer_tokens_per_s']:,.0f} | "
                f"{rate / base_rate:.2f} |"
            )


if __name__ == "__main__":
    main()
