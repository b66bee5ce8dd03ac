"""The GPU check: what one lent GPU can tell about the trainer, measured in one call.

``scripts/gpu-check.sh`` runs the ``gpu`` tests first, then this. Each part is written to
``OUT/gpu-check.json`` as soon as it ends, so a call cut short still returns what it
measured:

- ``env``: the device, torch, CUDA and NCCL versions, the bf16 matrix-product ceiling
  (8192^3, the mean of ten after three warm-ups) and the host <-> device copy rates of a
  1 GiB buffer, pinned and pageable;
- ``models.<name>``: the real trainer (:class:`TorchTrainerSide`, FSDP2 over a one-rank
  NCCL group, bf16 compute, activation checkpointing, chunked log-probs, micro-batches) on
  a Qwen3-shaped model of the public checkpoint's shape, randomly initialised (nothing is
  downloaded): step time, tokens/s and MFU per step; the peak of device memory against what
  the memory plan (:func:`runtime.config.memory_plan.plan_memory`, what ``reflow plan``
  prints) predicts for the same configuration; then a role switch on the device (offload
  to pinned host memory, regroup, restore), its phases timed and the memory it freed.

MFU counts model FLOPs as PaLM's appendix B does (6 N + 12 L d T per token, N the matmul
parameters, the tied head included; the recomputed forward of activation checkpointing
not counted) over the datasheet's dense bf16 peak, 989 TFLOP/s for an H100/H200 SXM, and
also over the ceiling measured in ``env``.

``--dry-run`` runs the same parts on the CPU over gloo with the two tiny embedded models
(the figures mean nothing there; the path and the JSON are what is tested).

    python benchmarks/gpu_check.py --out DIR [--dry-run] [--models 0.6b,1.7b,4b]
        [--steps 3] [--warmup 2] [--budget-s 330] [--junit DIR/gpu-tests.xml]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from runtime.config.architectures import ModelShape, model_shape  # noqa: E402

GIB = 1024**3
# NVIDIA's H100/H200 SXM datasheet, dense bf16 (the H200 has the H100's compute)
DATASHEET_BF16_TFLOPS = 989.0
# The public checkpoints whose shapes the check trains (runtime/config/architectures.py)
MODELS = {"0.6b": "Qwen/Qwen3-0.6B", "1.7b": "Qwen/Qwen3-1.7B", "4b": "Qwen/Qwen3-4B"}
# --dry-run: the embedded models' shapes (runtime/embedded/tiny_qwen3.py)
DRY_MODELS = {
    "tiny": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 32},
    "small": {"hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4, "head_dim": 64},
}
# A role switch copies the whole trainer state into one pinned host buffer: past this
# many bytes of state (the 4B's is 64 GB) the pinning alone would spend the lease
SWITCH_STATE_LIMIT = 32 * GIB


@dataclass(frozen=True)
class Workload:
    """One training step's batch: every sample the same length, so tokens are exact."""

    samples: int
    prompt_tokens: int
    response_tokens: int
    micro_batch_tokens: int

    @property
    def seq_len(self) -> int:
        return self.prompt_tokens + self.response_tokens

    @property
    def tokens(self) -> int:
        return self.samples * self.seq_len


# 32 sequences of 1,024 tokens in passes of 8: a DAPO-like response share, four
# micro-batches per update
GPU_WORKLOAD = Workload(samples=32, prompt_tokens=256, response_tokens=768, micro_batch_tokens=8192)
DRY_WORKLOAD = Workload(samples=8, prompt_tokens=16, response_tokens=48, micro_batch_tokens=256)


class Report:
    """The JSON under construction, rewritten whole after every part (atomic rename)."""

    def __init__(self, path: Path, meta: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta, "env": {}, "tests": {}, "models": {}}
        self.data["skipped"], self.data["errors"] = [], []
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        tmp.replace(self.path)

    def part(self, name: str, fn: Callable[[], dict[str, Any]], into: dict[str, Any]) -> bool:
        """Run one part; its result (or its error, one line) lands in the JSON at once."""
        start = time.perf_counter()
        try:
            into[name] = fn() | {"part_s": round(time.perf_counter() - start, 2)}
            ok = True
        except Exception as exc:  # a failed part is a result too; the others go on
            traceback.print_exc()  # the whole of it to the log, one line to the JSON
            line = f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.data["errors"].append(line)
            into[name] = {"error": line}
            ok = False
        self.write()
        return ok


# --- the environment ----------------------------------------------------------------------


def _cuda_timed(fn: Callable[[], None], repeat: int) -> float:
    """Seconds per call of ``fn`` on the current stream (CUDA events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / repeat


def matmul_ceiling_tflops(n: int = 8192) -> float:
    """The bf16 ``n^3`` matrix product's rate: the mean of ten after three warm-ups."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    return 2 * n**3 / _cuda_timed(lambda: a @ b, 10) / 1e12


def copy_rates_gb_s(size: int, pinned: bool) -> tuple[float, float]:
    """Device -> host and host -> device GB/s of a ``size``-byte buffer."""
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
    host.copy_(dev)  # first touch of the pages
    d2h = _cuda_timed(lambda: host.copy_(dev, non_blocking=True), 3)
    h2d = _cuda_timed(lambda: dev.copy_(host, non_blocking=True), 3)
    return size / d2h / 1e9, size / h2d / 1e9


def environment(cuda: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host_cpus": os.cpu_count(),
    }
    try:
        import transformers

        out["transformers"] = transformers.__version__
    except ImportError:
        out["transformers"] = None
    if not cuda:
        out["device"] = "cpu"
        return out
    props = torch.cuda.get_device_properties(0)
    out |= {
        "device": props.name,
        "device_memory_bytes": props.total_memory,
        "multiprocessors": props.multi_processor_count,
        "capability": f"{props.major}.{props.minor}",
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    }
    out["matmul_bf16_tflops"] = round(matmul_ceiling_tflops(), 1)
    for pinned in (True, False):
        d2h, h2d = copy_rates_gb_s(GIB, pinned)
        kind = "pinned" if pinned else "pageable"
        out[f"copy_{kind}_d2h_gb_s"], out[f"copy_{kind}_h2d_gb_s"] = round(d2h, 1), round(h2d, 1)
    torch.cuda.empty_cache()
    return out


# --- a model of the public shape ------------------------------------------------------------


def qwen3_config(shape: ModelShape, max_positions: int) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=shape.tied,
        max_position_embeddings=max_positions,
    )


def write_model(name: str, folder: Path, dry_run: bool, max_positions: int) -> Path:
    """A randomly initialised model folder (config.json + bf16 safetensors): the public
    checkpoint's shape, or on a dry run an embedded model's."""
    if dry_run:
        from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained

        return save_pretrained(build_model(seed=3, **DRY_MODELS[name]), build_tokenizer(), folder)
    from transformers import Qwen3ForCausalLM

    shape = model_shape(MODELS[name])
    with torch.device("cuda"):  # random init on the GPU: seconds, where the CPU takes minutes
        model = Qwen3ForCausalLM(qwen3_config(shape, max_positions))
    model.to(torch.bfloat16).save_pretrained(folder)
    del model
    torch.cuda.empty_cache()
    return folder


def matmul_params(shape: ModelShape) -> int:
    """Parameters that take part in a matrix product per token: the blocks and the head
    (the input embedding is a lookup, norms and biases are elementwise; a tied head is the
    embedding's matrix)."""
    h, q, kv = shape.hidden, shape.q_width, shape.kv_width
    block = h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate
    return shape.layers * block + shape.vocab * h


def model_flops_per_token(shape: ModelShape, seq_len: int) -> float:
    """PaLM's appendix B: 6 N for the matrices forward and backward, 12 L d T for the
    attention scores and values (no causal halving; recompute not counted)."""
    return 6.0 * matmul_params(shape) + 12.0 * shape.layers * shape.q_width * seq_len


def make_batch(wl: Workload, vocab: int, seed: int = 0) -> list[Any]:
    """``wl.samples`` samples of random token ids, advantages +-1, every fourth replayed."""
    from runtime.data.sample import Sample

    rng = random.Random(seed)
    lo = 4  # past the embedded vocabularies' specials
    out = []
    for i in range(wl.samples):
        resp = [rng.randrange(lo, vocab) for _ in range(wl.response_tokens)]
        out.append(
            Sample(
                sample_id=i,
                group_id=i // 4,
                prompt_id=i // 4,
                versions=[(0, 0, wl.response_tokens)],
                prompt_token_ids=[rng.randrange(lo, vocab) for _ in range(wl.prompt_tokens)],
                token_ids=resp,
                logprobs=[-2.0] * wl.response_tokens,
                n_valid=wl.response_tokens,
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
                replay_count=int(i % 4 == 3),
            )
        )
    return out


def recipe(folder: Path, wl: Workload, cuda: bool) -> Any:
    from runtime.config.recipe import build_config

    return build_config(
        {
            "model": {"path": str(folder), "dtype": "bfloat16", "max_seq_len": wl.seq_len},
            "workload": {"max_response_tokens": wl.response_tokens},
            "train": {
                "lr": 1e-5,
                "steps": 100,
                "batch_size": wl.samples,
                "strategy": "fsdp2",
                "param_dtype": "bfloat16",
                "activation_checkpointing": True,
                "micro_batch_tokens": wl.micro_batch_tokens,
            },
            # colocated_sync: a rank leaving the trainer keeps its state (offloaded to
            # pinned memory) for its next phase; in the other modes a sharded trainer's
            # leaving rank frees its shards with no copy, which leaves nothing to time
            "reflow": {"mode": "colocated_sync"},
            "resources": {
                "device": "cuda" if cuda else "cpu",
                "gpus_per_node": 1,
                "trainer_gpus_per_replica": 1,
            },
        }
    )


def device_state_bytes(trainer: Any) -> int:
    """Parameters (local shards), their gradients and AdamW's moments on the device: what
    the plan's ``state_bytes`` counts."""
    from runtime.engines.torch.offload import local_tensor
    from runtime.engines.torch.shard_handoff import training_tensors

    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    seen: dict[int, int] = {}
    for x in [*training_tensors(trainer.model, trainer.opt), *grads]:
        s = local_tensor(x).untyped_storage()
        if s.device.type == "cuda":
            seen.setdefault(s.data_ptr(), s.nbytes())
    return sum(seen.values())


class Check:
    """The trainer parts on one process group, model after model."""

    def __init__(self, args: argparse.Namespace, report: Report, work: Path) -> None:
        from runtime.rank.collective import Collective

        self.args = args
        self.report = report
        self.work = work
        self.cuda = not args.dry_run
        self.wl = DRY_WORKLOAD if args.dry_run else GPU_WORKLOAD
        os.environ.setdefault("LOCAL_RANK", "0")
        self.collective = Collective.join(
            rank=0,
            world_size=1,
            rendezvous=work / "dist.json",
            bind_host="127.0.0.1",
            advertise_host="127.0.0.1",
            backend="cpu:gloo,cuda:nccl" if self.cuda else "gloo",
            bucket_bytes=64 << 20,
            timeout_s=300,
            trainer_group_size=1,
        )
        self.epoch = 0
        self.collective.regroup(self.epoch, ("trainer",))

    def model(self, name: str) -> dict[str, Any]:
        """Train ``name`` for warm-up + measured steps, then switch its role and back."""
        from runtime.config.memory_plan import plan_memory
        from runtime.engines.torch.trainer_side import TorchTrainerSide
        from runtime.store.run_dir import RunPaths

        args, wl, c = self.args, self.wl, self.collective
        folder = self.work / f"model-{name}"
        t0 = time.perf_counter()
        write_model(name, folder, args.dry_run, wl.seq_len)
        built_s = time.perf_counter() - t0
        cfg = recipe(folder, wl, self.cuda)
        shape = model_shape(str(folder))
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory if self.cuda else None
        plan = plan_memory(cfg, gpu_bytes, shape).trainer
        assert plan is not None
        t0 = time.perf_counter()
        side = TorchTrainerSide(cfg, 0, RunPaths(self.work / f"run-{name}"), c)
        loaded_s = time.perf_counter() - t0
        trainer = side.trainer
        batch = make_batch(wl, shape.vocab)
        out: dict[str, Any] = {
            "checkpoint_shape": MODELS.get(name, f"embedded {name}"),
            "params": shape.total_params,
            "matmul_params": matmul_params(shape),
            "workload": asdict(wl) | {"tokens_per_step": wl.tokens},
            "strategy": "fsdp2 over 1 rank",
            "param_dtype": "bfloat16",
            "activation_checkpointing": True,
            "logprob_chunk_tokens": cfg.train.logprob_chunk_tokens,
            "build_s": round(built_s, 2),
            "load_s": round(loaded_s, 2),
        }
        for _ in range(args.warmup):  # the first step allocates AdamW's state
            trainer.train_step(batch, c.data_parallel, 0, 1)
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(args.steps):
            start = time.perf_counter()
            m = trainer.train_step(batch, c.data_parallel, 0, 1)
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            losses.append(m["loss"])
        step_s = statistics.median(times)
        flops = model_flops_per_token(shape, wl.seq_len) * wl.tokens / step_s
        out |= {
            "step_s": [round(t, 4) for t in times],
            "step_s_median": round(step_s, 4),
            "micro_steps": m["micro_steps"],
            "loss": losses,
            "tokens_per_s": round(wl.tokens / step_s, 1),
            "model_tflops_per_s": round(flops / 1e12, 2),
            "mfu_datasheet": round(flops / (DATASHEET_BF16_TFLOPS * 1e12), 4)
            if self.cuda
            else None,
        }
        ceiling = self.report.data["env"].get("matmul_bf16_tflops")
        out["mfu_measured_ceiling"] = round(flops / (ceiling * 1e12), 4) if ceiling else None
        planned_tensors = plan.total_bytes - plan.reserve_bytes
        out["plan"] = {
            "state_bytes": plan.state_bytes,
            "pass_bytes": plan.pass_bytes - plan.reserve_bytes,
            "after_backward_bytes": plan.after_backward_bytes - plan.reserve_bytes,
            "optimizer_step_bytes": plan.optimizer_step_bytes - plan.reserve_bytes,
            "peak_bytes": planned_tensors,
            "reserve_bytes": plan.reserve_bytes,
            "tokens_per_pass": plan.tokens_per_pass,
        }
        if self.cuda:
            peak = torch.cuda.max_memory_allocated()
            reserved = torch.cuda.max_memory_reserved()
            state = device_state_bytes(trainer)  # the last step's gradients still held
            out["measured"] = {
                "peak_allocated_bytes": peak,
                "peak_reserved_bytes": reserved,
                "state_bytes": state,
            }
            out["peak_over_plan"] = round(peak / planned_tensors, 3)
            out["reserved_over_plan"] = round(reserved / planned_tensors, 3)
            out["state_over_plan"] = round(state / plan.state_bytes, 3)
        out["switch"] = self.switch(side, batch, plan.state_bytes)
        del side, trainer
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()
        for f in folder.glob("*"):
            f.unlink()
        return out

    def switch(self, side: Any, batch: list[Any], state_bytes: int) -> dict[str, Any]:
        """Role switches on the device, twice, as ``colocated_sync`` makes them (and a
        replicated trainer in any mode): the trainer side leaves (offload to pinned
        memory), the groups are made again, the side comes back (restore) and trains a
        step. The first offload pins a fresh host buffer; the second finds torch's
        pinned-memory cache."""
        if state_bytes > SWITCH_STATE_LIMIT:
            return {"skipped": f"state of {state_bytes / GIB:.0f} GiB > the pinned-buffer limit"}
        return {key: self._one_switch(side, batch) for key in ("first", "again")}

    def _one_switch(self, side: Any, batch: list[Any]) -> dict[str, Any]:
        c = self.collective
        alloc = torch.cuda.memory_allocated() if self.cuda else 0
        side.deactivate()
        left = dict(side.last_switch)
        freed = alloc - torch.cuda.memory_allocated() if self.cuda else None
        self.epoch += 1
        start = time.perf_counter()
        c.regroup(self.epoch, ("trainer",))
        regroup_s = time.perf_counter() - start
        side.activate()
        back = dict(side.last_switch)
        loss = side.trainer.train_step(batch, c.data_parallel, 0, 1)["loss"]
        out = {
            "offload_s": round(left["offload_s"], 4),
            "offload_bytes": int(left["offload_bytes"]),
            "freed_bytes": freed,
            "regroup_s": round(regroup_s, 4),
            "restore_s": round(back["restore_s"], 4),
            "restore_bytes": int(back["restore_bytes"]),
            "loss_after": loss,
        }
        for key in ("offload", "restore"):
            s, b = out[f"{key}_s"], out[f"{key}_bytes"]
            out[f"{key}_gb_s"] = round(b / s / 1e9, 2) if b and s else None
        return out

    def close(self) -> None:
        self.collective.close()


# --- the tests' results ---------------------------------------------------------------------


def junit_results(path: Path) -> dict[str, Any]:
    """pytest's JUnit XML as counts and one line per test (passed, failed, skipped)."""
    if not path.exists():
        return {"error": f"{path.name}: not written (pytest did not run to its end)"}
    root = ET.parse(path).getroot()
    cases = []
    for case in root.iter("testcase"):
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (
                    (node.get("message") or "").splitlines()[0][:200] if node.get("message") else ""
                )
                break
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        cases.append(
            {"test": name, "outcome": outcome, "s": float(case.get("time", 0)), "why": message}
        )
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "failed", "skipped")}
    return counts | {"cases": cases}


# --- the page -------------------------------------------------------------------------------


def summary(data: dict[str, Any]) -> str:
    env, lines = data["env"], []
    meta = data["meta"]
    lines.append(f"GPU check {meta['date']} ({'dry run, CPU' if meta['dry_run'] else 'device'})")
    lines.append(
        f"  {env.get('device')} | torch {env.get('torch')} CUDA {env.get('cuda')} "
        f"NCCL {env.get('nccl')} | Python {env.get('python')}"
    )
    if "matmul_bf16_tflops" in env:
        lines.append(
            f"  bf16 8192^3 matmul {env['matmul_bf16_tflops']} TFLOP/s; host<->device pinned "
            f"{env['copy_pinned_d2h_gb_s']}/{env['copy_pinned_h2d_gb_s']} GB/s (d2h/h2d), "
            f"pageable {env['copy_pageable_d2h_gb_s']}/{env['copy_pageable_h2d_gb_s']}"
        )
    tests = data["tests"]
    if tests:
        if "error" in tests:
            lines.append(f"  gpu tests: {tests['error']}")
        else:
            lines.append(
                f"  gpu tests: {tests['passed']} passed, {tests['failed']} failed, "
                f"{tests['skipped']} skipped"
            )
            for case in tests["cases"]:
                if case["outcome"] != "skipped" or not meta["dry_run"]:
                    why = f" ({case['why']})" if case["why"] else ""
                    lines.append(f"    {case['outcome']:7} {case['test']}{why}")
    for name, m in data["models"].items():
        if "error" in m:
            lines.append(f"  {name}: {m['error']}")
            continue
        mfu = m.get("mfu_datasheet")
        lines.append(
            f"  {name} ({m['params'] / 1e9:.2f}B): {m['tokens_per_s']:.0f} tok/s, step "
            f"{m['step_s_median']:.3f} s, {m['model_tflops_per_s']} TFLOP/s"
            + (f", MFU {100 * mfu:.1f}% of {DATASHEET_BF16_TFLOPS:.0f}" if mfu else "")
        )
        if "measured" in m:
            lines.append(
                f"    peak {m['measured']['peak_allocated_bytes'] / GIB:.2f} GiB allocated, "
                f"plan {m['plan']['peak_bytes'] / GIB:.2f} GiB: x{m['peak_over_plan']} "
                f"(state x{m['state_over_plan']}, reserved x{m['reserved_over_plan']})"
            )
        sw = m.get("switch", {})
        if "skipped" in sw:
            lines.append(f"    switch: skipped ({sw['skipped']})")
        for key, one in sw.items() if "skipped" not in sw else []:
            lines.append(
                f"    switch ({key}): offload {one['offload_s']} s ({one['offload_gb_s']} "
                f"GB/s), regroup {one['regroup_s']} s, restore {one['restore_s']} s "
                f"({one['restore_gb_s']} GB/s)"
            )
    for line in data["skipped"]:
        lines.append(f"  skipped: {line}")
    for line in data["errors"]:
        lines.append(f"  error: {line}")
    return "\n".join(lines)


def model_folder_base() -> str | None:
    """Where the model folders go: memory (/dev/shm) when it has room for the largest
    (the 4B's 8 GB of bf16), else the default temporary folder."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        stat = os.statvfs(shm)
        if stat.f_bavail * stat.f_frsize >= 20 * GIB:
            return str(shm)
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, the tiny models")
    ap.add_argument("--models", help="comma-separated (default: all for the mode)")
    ap.add_argument("--steps", type=int, default=3, help="measured steps per model")
    ap.add_argument("--warmup", type=int, default=2, help="unmeasured steps first")
    ap.add_argument("--budget-s", type=float, default=330.0, help="no model starts past this")
    ap.add_argument("--junit", type=Path, help="pytest's JUnit XML of the gpu tests")
    args = ap.parse_args(argv)
    known = DRY_MODELS if args.dry_run else MODELS
    names = args.models.split(",") if args.models else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"--models: {', '.join(unknown)} not among {', '.join(known)}")
    if args.steps < 1 or args.warmup < 1:
        ap.error("--steps and --warmup: at least 1 (the first step allocates AdamW's state)")
    args.models = names
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (--dry-run runs on the CPU)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dry_run": args.dry_run,
        "models": args.models,
        "steps": args.steps,
        "warmup": args.warmup,
        "budget_s": args.budget_s,
    }
    report = Report(args.out / "gpu-check.json", meta)
    if args.junit is not None:
        report.data["tests"] = junit_results(args.junit)
    report.part("env", lambda: environment(not args.dry_run), report.data)
    base = model_folder_base()
    with tempfile.TemporaryDirectory(prefix="reflow-gpu-check-", dir=base) as tmp:
        try:
            check: Check | None = Check(args, report, Path(tmp))
        except Exception as exc:  # no process group, no trainer part: said, not raised
            report.data["errors"].append(f"process group: {type(exc).__name__}: {exc}")
            check = None
        for name in args.models if check is not None else []:
            if time.perf_counter() - started > args.budget_s:
                report.data["skipped"].append(f"{name}: past --budget-s {args.budget_s:g}")
                continue
            report.part(name, lambda n=name: check.model(n), report.data["models"])
        if check is not None:
            check.close()
    report.data["meta"]["total_s"] = round(time.perf_counter() - started, 1)
    report.write()
    page = summary(report.data)
    (args.out / "summary.txt").write_text(page + "\n")
    print(page)
    return 1 if report.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
