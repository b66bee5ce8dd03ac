"""Trainer throughput and memory per rank: ``train.strategy`` replicate against fsdp2.

On the mid-size embedded model (``embedded:small-qwen3``, a 25M-parameter Qwen3 with a
26-token character vocabulary, randomly initialised), each configuration starts 2 fresh
processes (gloo on 127.0.0.1, one torch thread each) that build the real
:class:`runtime.engines.torch.trainer.TorchTrainer` and train the same synthetic batch:

- ``replicate`` x 2 ranks (a whole copy per rank, gradients all-reduced);
- ``fsdp2`` x 2 ranks (one replica group of 2: parameters, gradients and AdamW state
  sharded), one pass per update (``micro_batch_tokens`` none), then the
  ``train.micro_batch_tokens`` sweep (``--micro``; 0 means none).

    .venv/bin/python benchmarks/trainer.py [--steps 3] [--warmup 1] [--batch 32]
        [--response-tokens 256] [--micro 0,512,2048] [--json out.json] [--timeout 1800]

Per rank: the median step time over the measured steps (``train_step``'s ``step_time_s``,
after ``--warmup`` unmeasured steps; the ranks start each step at a barrier), tokens/s
(the batch's prompt + response tokens over that time: both ranks train the one batch
together, so each rank's figure is the group's rate as that rank saw it), the bytes of
parameters + AdamW state the rank holds (local shards of DTensors; gradients apart), and
the peak RSS (``ru_maxrss``) after imports, after the trainer is built, and at the end.
Peak RSS also counts the torch/transformers import and the model loaded whole before it is
sharded, so it does not halve under fsdp2; the parameter + optimizer bytes are what
sharding divides. Ratios fsdp2/replicate are from this run only
(rank means, ``micro_batch_tokens`` none for both). Nothing here asserts a direction.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD = 2
PROMPT_TOKENS = (56, 72)  # prompt length range (inclusive), about 64
TOKEN_IDS = (4, 25)  # the character vocabulary past the specials (pad, bos, eos, unk)
MiB = 1 << 20


# --- the batch ----------------------------------------------------------------------------


def make_batch(n: int, response_tokens: int, seed: int = 0) -> list:
    """``n`` synthetic samples: random prompt and response ids, responses of varying
    length (a quarter to all of ``response_tokens``), advantages +-1, every fourth one
    replayed once."""
    from runtime.data.sample import Sample

    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randint(*TOKEN_IDS) for _ in range(rng.randint(*PROMPT_TOKENS))]
        length = rng.randint(max(1, response_tokens // 4), response_tokens)
        resp = [rng.randint(*TOKEN_IDS) for _ in range(length)]
        out.append(
            Sample(
                sample_id=i,
                group_id=i // 4,
                prompt_id=i // 4,
                versions=[(0, 0, length)],
                prompt_token_ids=prompt,
                token_ids=resp,
                logprobs=[-2.0] * length,
                n_valid=length,
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
                replay_count=int(i % 4 == 3),
            )
        )
    return out


def batch_tokens(samples: list) -> int:
    return sum(len(s.prompt_token_ids) + len(s.token_ids) for s in samples)


# --- one rank (a fresh process) -----------------------------------------------------------


def maxrss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def local_bytes(t) -> int:
    from torch.distributed.tensor import DTensor

    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def rank_main(spec: dict, rank: int) -> dict:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch

    torch.set_num_threads(1)
    import transformers  # noqa: F401  (counted in the RSS after imports)

    from runtime.config.recipe import build_config
    from runtime.engines.torch.settings import TorchTrainerConfig
    from runtime.engines.torch.trainer import TorchTrainer
    from runtime.rank.collective import Collective

    rss_imports = maxrss_kib()
    world, group = spec["world"], spec["group"]
    train = {"lr": 1e-5, "steps": 1000, "strategy": spec["strategy"]}
    if spec["micro"] is not None:
        train["micro_batch_tokens"] = spec["micro"]
    cfg = build_config(
        {
            "model": {"path": spec["model"]},
            "train": train,
            "reflow": {"tau": 0.5},
            "resources": {
                "device": "cpu",
                "gpus_per_node": world + 1,
                "trainer_gpus_per_replica": group,
                "initial_ratio": f"1:{world}",
            },
        }
    )
    c = Collective.join(
        rank=rank,
        world_size=world,
        rendezvous=Path(spec["dir"]) / "dist.json",
        bind_host="127.0.0.1",
        advertise_host="127.0.0.1",
        backend="gloo",
        # as runtime/entry.py: the replicated path all-reduces gradients in these buckets
        bucket_bytes=int(cfg.engine.weight_bucket_mb * 2**20),
        timeout_s=spec["collective_timeout_s"],
        trainer_group_size=group,
    )
    try:
        c.regroup(0, ("trainer",) * world)
        trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), spec["model"], rank, c.mesh)
        if trainer.sharded != (spec["strategy"] == "fsdp2"):
            raise RuntimeError(f"strategy {spec['strategy']} but sharded={trainer.sharded}")
        rss_init = maxrss_kib()
        samples = make_batch(spec["batch"], spec["response_tokens"], spec["seed"])
        tokens = batch_tokens(samples)
        times, micro_steps, losses = [], [], []
        for i in range(spec["warmup"] + spec["steps"]):
            # every rank starts the step together: its time is the step's, not a wait
            torch.distributed.barrier(group=c.mesh.group)
            m = trainer.train_step(samples, c.data_parallel, rank, world)
            if i >= spec["warmup"]:
                times.append(m["step_time_s"])
                micro_steps.append(int(m["micro_steps"]))
                losses.append(m["loss"])
        params = list(trainer.model.parameters())
        param_bytes = sum(local_bytes(p) for p in params)
        optim_bytes = sum(
            local_bytes(v)
            for st in trainer.opt.state.values()
            for v in st.values()
            if torch.is_tensor(v)
        )
        grad_bytes = sum(local_bytes(p.grad) for p in params if p.grad is not None)
        median = statistics.median(times)
        return {
            "rank": rank,
            "model_parameters": sum(p.numel() for p in params),  # global, DTensor or not
            "batch_tokens": tokens,
            "step_times_s": times,
            "median_step_s": median,
            "tokens_per_s": tokens / median,
            "micro_steps": micro_steps[-1],
            "loss_last": losses[-1],
            "param_bytes": param_bytes,
            "optimizer_bytes": optim_bytes,
            "param_optimizer_bytes": param_bytes + optim_bytes,
            "grad_bytes": grad_bytes,
            "maxrss_after_imports_kib": rss_imports,
            "maxrss_after_init_kib": rss_init,
            "maxrss_peak_kib": maxrss_kib(),
        }
    finally:
        c.close()


def rank_entry(spec_path: str, rank: int) -> None:
    """A rank process: the result as JSON next to the spec; on failure one line on stderr
    (after the traceback) and exit status 1."""
    spec = json.loads(Path(spec_path).read_text())
    try:
        result = rank_main(spec, rank)
    except Exception as err:  # any failure: one line, non-zero
        import traceback

        traceback.print_exc()
        line = f"{type(err).__name__}: {err}".replace("\n", " ")[:400]
        print(f"rank {rank} failed: {line}", file=sys.stderr, flush=True)
        sys.exit(1)
    (Path(spec["dir"]) / f"rank{rank}.json").write_text(json.dumps(result))


# --- the driver ---------------------------------------------------------------------------


class ConfigFailed(Exception):
    pass


def last_line(path: Path) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()]
    return lines[-1] if lines else "(no output)"


def run_config(spec: dict, timeout_s: float) -> list[dict]:
    """Start the ranks, wait for all of them (at most ``timeout_s``), their results."""
    folder = Path(spec["dir"])
    folder.mkdir(parents=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs, logs = [], []
    for rank in range(spec["world"]):
        log = folder / f"rank{rank}.log"
        logs.append(log)
        with open(log, "w") as f:
            cmd = [sys.executable, __file__, "--rank-spec", str(spec_path), "--rank", str(rank)]
            procs.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, rc in enumerate(codes) if rc not in (None, 0)]
            if failed:
                r = failed[0]
                raise ConfigFailed(
                    f"rank {r} exited {codes[r]}: {last_line(logs[r])} (log {logs[r]})"
                )
            if all(rc == 0 for rc in codes):
                break
            if time.monotonic() > deadline:
                raise ConfigFailed(f"timed out after {timeout_s:.0f} s (logs in {folder})")
            time.sleep(0.2)
    finally:
        for p in procs:  # only the processes started here, by their handle
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(spec["world"])]


def configurations(micro: list[int | None]) -> list[tuple[str, str, int | None]]:
    out = [("replicate", "replicate", None), ("fsdp2", "fsdp2", None)]
    out += [(f"fsdp2 micro {m}", "fsdp2", m) for m in micro if m is not None]
    return out


def mean(xs) -> float:
    return statistics.fmean(xs)


def table(configs: list[dict]) -> str:
    lines = [
        "| configuration | rank | micro-steps | median step s | tokens/s | "
        "params+AdamW MiB | grads MiB | peak RSS MiB: imports / init / end |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in configs:
        for r in c["ranks"]:
            lines.append(
                f"| {c['name']} | {r['rank']} | {r['micro_steps']} | {r['median_step_s']:.3f} | "
                f"{r['tokens_per_s']:,.0f} | {r['param_optimizer_bytes'] / MiB:.1f} | "
                f"{r['grad_bytes'] / MiB:.1f} | {r['maxrss_after_imports_kib'] / 1024:.0f} / "
                f"{r['maxrss_after_init_kib'] / 1024:.0f} / {r['maxrss_peak_kib'] / 1024:.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    ap.add_argument("--batch", type=int, default=32, help="samples per batch")
    ap.add_argument("--response-tokens", type=int, default=256, help="longest response")
    ap.add_argument("--micro", default="0,512,2048", help="micro_batch_tokens sweep, 0 = none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the measurements there")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per configuration")
    ap.add_argument("--rank-spec", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_spec is not None:
        rank_entry(args.rank_spec, args.rank)
        return
    if args.steps < 1 or args.warmup < 0 or args.batch < 1 or args.response_tokens < 1:
        ap.error("--steps and --batch and --response-tokens must be positive, --warmup >= 0")
    try:
        micro = list(dict.fromkeys(int(x) or None for x in args.micro.split(",") if x.strip()))
    except ValueError:
        ap.error(f"--micro {args.micro!r}: comma-separated integers")
    if any(m is not None and m < 0 for m in micro):
        ap.error("--micro: values must be >= 0")

    from runtime.embedded.warm_start import small_model_path

    model = small_model_path()
    limit = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    if PROMPT_TOKENS[1] + args.response_tokens > limit:
        ap.error(f"--response-tokens: prompt (<= {PROMPT_TOKENS[1]}) + response exceeds {limit}")
    samples = make_batch(args.batch, args.response_tokens, args.seed)
    import torch

    print(
        f"embedded:small-qwen3 ({model}); batch {args.batch} samples, "
        f"{batch_tokens(samples):,} prompt+response tokens; {WORLD} ranks over gloo, 1 torch "
        f"thread each; {args.warmup} warm-up + {args.steps} measured steps per configuration; "
        f"{os.cpu_count()} CPUs, torch {torch.__version__}",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="reflow-bench-trainer-"))
    results = []
    for i, (name, strategy, m) in enumerate(configurations(micro)):
        spec = {
            "dir": str(work / f"c{i}"),
            "model": str(model),
            "world": WORLD,
            "group": WORLD if strategy == "fsdp2" else 1,
            "strategy": strategy,
            "micro": m,
            "batch": args.batch,
            "response_tokens": args.response_tokens,
            "seed": args.seed,
            "steps": args.steps,
            "warmup": args.warmup,
            "collective_timeout_s": min(args.timeout, 600),
        }
        start = time.monotonic()
        try:
            ranks = run_config(spec, args.timeout)
        except ConfigFailed as err:
            raise SystemExit(f"{name}: {err}") from None
        results.append(
            {
                "name": name,
                "strategy": strategy,
                "trainer_gpus_per_replica": spec["group"],
                "micro_batch_tokens": m,
                "wall_s": time.monotonic() - start,
                "ranks": ranks,
            }
        )
        print(f"  {name}: done in {results[-1]['wall_s']:.0f} s", flush=True)
    shutil.rmtree(work, ignore_errors=True)

    rep, fsdp = results[0], results[1]
    ratios = {
        "tokens_per_s": mean(r["tokens_per_s"] for r in fsdp["ranks"])
        / mean(r["tokens_per_s"] for r in rep["ranks"]),
        "param_optimizer_bytes": mean(r["param_optimizer_bytes"] for r in fsdp["ranks"])
        / mean(r["param_optimizer_bytes"] for r in rep["ranks"]),
        "maxrss_peak": mean(r["maxrss_peak_kib"] for r in fsdp["ranks"])
        / mean(r["maxrss_peak_kib"] for r in rep["ranks"]),
    }
    print()
    print(f"Model parameters: {rep['ranks'][0]['model_parameters']:,} (fp32 master weights).")
    print()
    print(table(results))
    print()
    print(
        "fsdp2 / replicate (micro_batch_tokens none, rank means, this run): "
        f"tokens/s {ratios['tokens_per_s']:.2f}x, params+AdamW bytes per rank "
        f"{ratios['param_optimizer_bytes']:.2f}x, peak RSS {ratios['maxrss_peak']:.2f}x."
    )
    print(
        "Peak RSS (ru_maxrss) includes the torch/transformers import and the model loaded "
        "whole before sharding, so it does not halve; params+AdamW is the local shard bytes."
    )
    if args.json is not None:
        doc = {
            "benchmark": "trainer",
            "measured_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": {
                "cpu_count": os.cpu_count(),
                "torch": torch.__version__,
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "model": "embedded:small-qwen3",
            "model_parameters": rep["ranks"][0]["model_parameters"],
            "settings": {
                "world": WORLD,
                "steps": args.steps,
                "warmup": args.warmup,
                "batch": args.batch,
                "response_tokens": args.response_tokens,
                "prompt_tokens": list(PROMPT_TOKENS),
                "batch_tokens": rep["ranks"][0]["batch_tokens"],
                "micro": list(micro),
                "seed": args.seed,
                "torch_threads_per_rank": 1,
            },
            "configurations": results,
            "ratios_fsdp2_over_replicate": ratios,
            "notes": "rss in KiB (ru_maxrss); peak RSS includes imports and the model "
            "loaded whole before sharding; param/optimizer/grad bytes are local shards",
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
