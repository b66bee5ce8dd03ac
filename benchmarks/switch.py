"""Role-switch time by phase and weight-sync GB/s, against the full-state paths they replaced.

One run, one machine. Four fresh processes (gloo on 127.0.0.1, one torch thread each;
``--device cuda``: ``cpu:gloo,cuda:nccl`` as runtime/entry.py, a GPU per rank) build the
real ``TorchTrainerSide`` over ``embedded:small-qwen3`` (25M parameters) or ``--model``,
``train.strategy: fsdp2`` in replica groups of 2. Ranks 0-1 train a step (AdamW state
exists), ranks 2-3 are rollout drivers; then ``--warmup`` + ``--repeats`` rounds of:

1. **Weight sync** (T T R R): streamed from the replica group (``stream_weights``, a
   bucket of gathered tensors at a time) to ranks 2-3 (``p2p.receive_whole``), against
   ``gather_weights()`` (the whole dict on the leader) + ``p2p.send_whole``. Seconds
   from a barrier until the leader and both receivers are done, bytes, GB/s, peak
   gathered bytes (the baseline's: its fp32 state dict and rollout-dtype copy, alive
   together, from the shapes), and whether both delivered the same tensors.
2. **A replica group joins** (T T R R -> T T T T, the worker's order: activate, regroup,
   ``on_layout``): shard to shard (``last_switch``: rebuild, transfer, bytes per pair),
   against (b) today's full-state broadcast, how a replicated trainer's new replica was
   initialised: the whole model + AdamW state gathered, broadcast to the trainer group in
   buckets (:func:`broadcast_from_leader`; without the rebuild and resharding its
   receivers would still need), and (c) the DCP disk handoff sharded layout changes used:
   ``save_state`` on the old trainer ranks before the regroup, build over the new mesh
   and ``load_state`` on the new ones (checked equal to the shard-to-shard state). Then
   the group leaves (ranks 2-3 deactivate, drop their shards, receive the weights).
3. **Offload/restore** of a trainer rank: ``deactivate``/``activate`` (on the CPU nothing
   is copied) and the copy-and-resize path ``offload(move=True)`` (what a GPU does).
4. ``--demo`` (on by default): ``reflow launch recipes/demo.yaml --local --set
   train.strategy=fsdp2 --set train.steps=14``, rebalanced 3:1 at step >= 3, 2:2 once that
   is done; each switch's ``duration_s`` and ``phases_max_s`` from the final status. vLLM's
   CPU build has no sleep mode: there the rollout sleep and wake are state only.

    .venv/bin/python benchmarks/switch.py [--repeats 5] [--warmup 1] [--model PATH]
        [--device cpu|cuda] [--baselines broadcast,dcp] [--no-demo] [--json PATH]

Medians, min/max over the rounds; a phase's time is its slowest rank's. Ratios
new/baseline from this run only. Nothing here asserts a direction.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORLD, GROUP = 4, 2
ONE = ("trainer", "trainer", "rollout", "rollout")  # one replica group of 2
TWO = ("trainer",) * 4  # a second replica group joined
DELIVERY = (0, 2, 3)  # a weight sync is done when the leader and the receivers are
REPO = Path(__file__).resolve().parents[1]
MB = 1e6
BASELINES = ("broadcast", "dcp")
PHASES = ("offload", "wake", "regroup", "state_transfer", "weight_load")
NOTE = """A weight sync's s: from a barrier until the leader and both receivers are done. The
broadcast baseline leaves out the rebuild over the new mesh and the resharding its receivers
would still need; the DCP baseline counts both (its files on this machine's disk). On the
CPU deactivate/activate copy nothing (the state is in host memory already); the copy path
is offload(move=True)."""


# --- one rank (a fresh process) -----------------------------------------------------------


def make_batch(n: int, vocab: int, seed: int) -> list:
    """``n`` short samples (prompt 32, response 16-32 tokens): a step to make AdamW state."""
    from runtime.data.sample import Sample

    rng, ids, out = random.Random(seed), (4, min(vocab, 1000) - 1), []
    for i in range(n):
        k = rng.randint(16, 32)
        prompt, resp = [rng.randint(*ids) for _ in range(32)], [rng.randint(*ids) for _ in range(k)]
        out.append(Sample(sample_id=i, group_id=i // 4, prompt_id=i // 4, versions=[(0, 0, k)],
                          prompt_token_ids=prompt, token_ids=resp, logprobs=[-2.0] * k,
                          n_valid=k, reward=float(i % 2),
                          advantage=1.0 if i % 2 else -1.0))  # fmt: skip
    return out


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Rank:
    """This process's part: the trainer side, its process group, a clock, a barrier."""

    def __init__(self, spec: dict, rank: int) -> None:
        import torch

        from runtime.config.recipe import build_config
        from runtime.engines.torch.parallelize import trainer_device
        from runtime.engines.torch.trainer_side import TorchTrainerSide
        from runtime.rank.collective import Collective
        from runtime.store.run_dir import RunPaths

        self.torch, self.rank, self.dir = torch, rank, Path(spec["dir"])
        self.cfg = build_config({
            "model": {"path": spec["model"], "dtype": spec["dtype"]},
            "train": {"lr": 1e-5, "steps": 1000, "strategy": "fsdp2"},
            "engine": {"weight_bucket_mb": spec["bucket_mb"]},
            "reflow": {"tau": 0.5},
            "resources": {"device": spec["device"], "gpus_per_node": WORLD, "torch_threads": 1,
                          "trainer_gpus_per_replica": GROUP, "initial_ratio": "2:2"},
        })  # fmt: skip
        self.cuda = spec["device"] == "cuda"
        if self.cuda:
            trainer_device(self.cfg.resources, rank)  # binds this rank's GPU before NCCL starts
        self.c = Collective.join(
            rank=rank, world_size=WORLD, rendezvous=self.dir / "dist.json",
            bind_host="127.0.0.1", advertise_host="127.0.0.1",
            backend="cpu:gloo,cuda:nccl" if self.cuda else "gloo",
            bucket_bytes=int(self.cfg.engine.weight_bucket_mb * 2**20),
            timeout_s=spec["collective_timeout_s"], trainer_group_size=GROUP,
        )  # fmt: skip
        self.c.regroup(0, ONE)
        self.epoch = 0
        self.side = TorchTrainerSide(self.cfg, rank, RunPaths(self.dir), self.c)
        if self.side.streamer is not None:
            # the receivers here are plain ranks, not vLLM engines: gloo buckets, as on CPU
            self.side.streamer.cuda = False
        # the worker's first role: the side not played starts asleep
        self.side.activate() if ONE[rank] == "trainer" else self.side.deactivate()

    def now(self) -> float:
        if self.cuda:
            self.torch.cuda.synchronize()  # the device work issued so far is done
        return time.perf_counter()

    def sync(self, group: object = None) -> None:
        """A barrier on a CPU tensor (gloo under either backend)."""
        self.torch.distributed.all_reduce(self.torch.zeros(1), group=group)

    def switch(self, after: tuple[str, ...]) -> dict:
        """One role switch in the worker's order (runtime/rank/worker.py ``_switch``); a
        rank joining the rollout pool then receives the weights, as its rollout side does."""
        from runtime.config.layout import LayoutChange
        from runtime.weights import p2p

        before, side, rank = self.c.roles, self.side, self.rank
        self.epoch += 1
        change = LayoutChange(self.epoch, before, after)
        t0 = self.now()
        if before[rank] != after[rank]:
            (side.deactivate if before[rank] == "trainer" else side.activate)()
        t1 = self.now()  # nothing runs between the role change and the regroup
        self.c.regroup(self.epoch, after)
        t2 = self.now()
        side.on_layout(change)
        t3 = self.now()
        out = {"enter_s": t1 - t0, "regroup_s": t2 - t1, "on_layout_s": t3 - t2}
        out |= {"wall_s": t3 - t0, **side.last_switch}
        if rank in change.joined("rollout"):
            _, weights = p2p.receive_whole(self.c.sync)
            out["weights_s"], out["weights_bytes"] = self.now() - t3, nbytes(weights.values())
        return out


def weight_sync_round(r: Rank) -> dict:
    """Streamed, then gathered whole and sent; layout ONE."""
    from runtime.weights import p2p
    from runtime.weights.send import stream_weights

    t, c, out, streamed = r.side.trainer, r.c, {}, None
    r.sync()
    start = r.now()
    if r.rank < GROUP:
        tied = bool(getattr(t.model.config, "tie_word_embeddings", False))
        out["record"] = stream_weights(
            t.model, c.sync, t.version, dtype=getattr(r.torch, r.cfg.model.dtype),
            bucket_bytes=r.side.streamer.bucket_bytes, tied_lm_head=tied,
        ).as_dict()  # fmt: skip
    else:
        _, streamed = p2p.receive_whole(c.sync)
    out["stream_s"] = r.now() - start
    r.sync()
    start = r.now()
    if r.rank < GROUP:
        weights = t.gather_weights()  # every rank of the mesh; the whole dict on the leader
        out["gather_s"] = r.now() - start
        if r.rank == 0:
            fp32 = nbytes(t.model.state_dict().values())  # DTensors: their global sizes
            out["held_bytes"] = fp32 + nbytes(weights.values())
            out["sent_bytes"] = nbytes(weights.values())
            out["send_s"] = p2p.send_whole(c.sync, t.version, weights, c.bucket_bytes)
        del weights
    else:
        _, whole = p2p.receive_whole(c.sync)
        same = streamed.keys() == whole.keys()
        out["identical"] = same and all(r.torch.equal(streamed[k], whole[k]) for k in whole)
    out["baseline_s"] = r.now() - start
    r.sync()
    return out


def full_state(r: Rank, gather: bool) -> list:
    """[step, version], then per parameter the whole param, exp_avg, exp_avg_sq, step:
    gathered (the leader's replica group) or empty of the full shapes (a receiver)."""
    from torch.distributed.tensor import DTensor

    from runtime.engines.torch.shard_handoff import ADAM_KEYS

    torch, t = r.torch, r.side.trainer
    out = [torch.tensor([t.step, t.version], dtype=torch.int64, device=t.device)]
    with torch.no_grad():
        for p in t.model.parameters():
            for x in (p, *(t.opt.state[p][k] for k in ADAM_KEYS)):
                if not gather:
                    out.append(torch.empty(tuple(x.shape), dtype=x.dtype, device=t.device))
                elif isinstance(x, DTensor):
                    out.append(x.full_tensor())  # an all-gather over the shard dimension only
                else:
                    out.append(x.detach().to(t.device, copy=True))
    return out


def broadcast_from_leader(r: Rank, tensors: list, group: object) -> None:
    """The old path's broadcast of a whole state from rank 0, in buckets, every buffer on
    the trainer's device (NCCL takes no CPU buffer; on the CPU, gloo's the same)."""
    from runtime.rank.groups import tensor_buckets

    torch, device = r.torch, r.side.trainer.device
    for idx in tensor_buckets(tensors, r.c.bucket_bytes):
        part = [tensors[i] for i in idx]
        if r.rank == 0:
            flat = torch.cat([x.reshape(-1).to(device) for x in part])
        else:
            flat = torch.empty(sum(x.numel() for x in part), dtype=part[0].dtype, device=device)
        torch.distributed.broadcast(flat, src=0, group=group)
        pieces = flat.split([x.numel() for x in part]) if r.rank != 0 else []
        for x, piece in zip(part[: len(pieces)], pieces, strict=True):
            x.copy_(piece.view_as(x))


def shard_of(full, index: int):
    """FSDP2's dim-0 shard ``index`` of ``full`` (torch.chunk's split, unpadded)."""
    chunks = full.chunk(GROUP, dim=0) if full.dim() else [full] * GROUP
    return chunks[index] if index < len(chunks) else full[:0]


def broadcast_round(r: Rank) -> dict:
    """Baseline (b), in layout TWO: the whole state gathered, broadcast to the group."""
    from runtime.engines.torch.shard_handoff import training_tensors

    r.sync()
    start = r.now()
    state = full_state(r, gather=r.rank < GROUP)
    out = {"gather_s": r.now() - start if r.rank < GROUP else 0.0, "state_bytes": nbytes(state)}
    r.sync()
    start = r.now()
    broadcast_from_leader(r, state, r.c.mesh.group)
    out["broadcast_s"] = r.now() - start
    if r.rank >= GROUP:  # a joiner: its shard of every tensor received whole is its own
        mine = training_tensors(r.side.trainer.model, r.side.trainer.opt)
        pairs = zip(state[1:], mine, strict=True)
        out["consistent"] = all(  # AdamW's step counters live on the CPU
            r.torch.equal(shard_of(x, r.rank % GROUP).to(y.device), y) for x, y in pairs
        )
    del state
    r.sync()
    return out


def dcp_load(r: Rank, folder: Path) -> dict:
    """Baseline (c), second half, in layout TWO: build over the new mesh, load."""
    from runtime.engines.torch.settings import TorchTrainerConfig
    from runtime.engines.torch.shard_handoff import training_tensors
    from runtime.engines.torch.trainer import TorchTrainer

    torch, out = r.torch, {}
    r.sync()
    start = r.now()
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if r.cuda else []):
        trainer = TorchTrainer(
            TorchTrainerConfig.from_config(r.cfg), r.side.trainer.model_path, r.rank, r.c.mesh
        )
    out["build_s"] = r.now() - start
    start = r.now()
    trainer.load_state(folder, r.c.mesh.group)
    r.sync(r.c.mesh.group)  # every rank has read it (the old path then removed it)
    out["load_s"] = r.now() - start
    live = training_tensors(r.side.trainer.model, r.side.trainer.opt)
    loaded = zip(training_tensors(trainer.model, trainer.opt), live, strict=True)
    out["same_state"] = all(torch.equal(a, b) for a, b in loaded)
    trainer.release()
    if r.rank == 0:
        out["folder_bytes"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        shutil.rmtree(folder, ignore_errors=True)
    r.sync()
    return out


def state_round(r: Rank, i: int, baselines: list[str]) -> dict:
    """Join (and the baselines), leave. DCP's first half in layout ONE: the trainer ranks
    write their shards before the regroup."""
    folder, out = r.dir / "handoff" / f"round-{i}", {}
    r.sync()
    start = r.now()
    if "dcp" in baselines and r.rank < GROUP:
        if r.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
            folder.parent.mkdir(parents=True, exist_ok=True)
        r.sync(r.c.mesh.group)  # nobody writes before the folder is fresh
        r.side.trainer.save_state(folder, r.c.mesh.group)
    out["dcp_save_s"] = r.now() - start
    r.sync()
    out["join"] = r.switch(TWO)
    r.sync()
    if "broadcast" in baselines:
        out["broadcast"] = broadcast_round(r)
    if "dcp" in baselines:
        out["dcp"] = dcp_load(r, folder)
    out["leave"] = r.switch(ONE)
    r.sync()
    return out


def offload_round(r: Rank) -> dict:
    """A trainer rank's deactivate/activate, then the copy path; layout ONE."""
    out: dict = {}
    if r.rank < GROUP:
        r.side.deactivate()
        out["deactivate_s"] = r.side.last_switch["offload_s"]
        r.side.activate()
        out["activate_s"] = r.side.last_switch["restore_s"]
        moved, back = r.side.trainer.offload(move=True), r.side.trainer.reload()
        out |= {"copy_s": moved.seconds, "restore_s": back.seconds, "bytes": moved.bytes}
    r.sync()
    return out


def rank_main(spec: dict, rank: int) -> dict:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch

    torch.set_num_threads(1)
    r = Rank(spec, rank)
    try:
        if rank < GROUP:
            t = r.side.trainer
            batch = make_batch(spec["batch"], int(t.model.config.vocab_size), spec["seed"])
            t.train_step(batch, r.c.data_parallel, rank, GROUP)
        r.sync()
        rounds = range(spec["warmup"] + spec["repeats"])
        out: dict = {"rank": rank, "weights": [weight_sync_round(r) for _ in rounds]}
        out["state"] = [state_round(r, i, spec["baselines"]) for i in rounds]
        out["offload"] = [offload_round(r) for _ in rounds]
        model = r.side.trainer.model  # rebuilt by every switch
        out["params"] = sum(p.numel() for p in model.parameters()) if rank < GROUP else 0
        return out
    finally:
        r.side.close()
        r.c.close()


def rank_entry(spec_path: str, rank: int) -> None:
    """A rank process: its result as JSON next to the spec; on failure one line on stderr
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


def run_ranks(spec: dict, timeout_s: float) -> list[dict]:
    """Start the ranks, wait for all of them (at most ``timeout_s``), their results."""
    folder = Path(spec["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs, logs = [], [folder / f"rank{rank}.log" for rank in range(WORLD)]
    for rank, log in enumerate(logs):
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
                tail = [x for x in logs[r].read_text(errors="replace").splitlines() if x.strip()]
                raise SystemExit(f"rank {r} exited {codes[r]}: {tail[-1:]} ({logs[r]})")
            if all(rc == 0 for rc in codes):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"ranks timed out after {timeout_s:.0f} s (logs in {folder})")
            time.sleep(0.2)
    finally:
        for p in procs:  # only the processes started here, by their handle
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]


def gbps(nbytes: float, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def measures(ranks: list[dict], warmup: int) -> dict[str, dict[str, float]]:
    """Every measure of the table over the measured rounds (a phase: its slowest rank)."""
    rows: dict[str, list[float]] = {}

    def put(section: str, **values: float) -> None:
        for name, v in values.items():
            rows.setdefault(f"{section}|{name}", []).append(float(v))

    def rounds(key: str) -> list[tuple[dict, ...]]:  # every rank's record, round by round
        return list(zip(*(r[key] for r in ranks), strict=True))[warmup:]

    for w in rounds("weights"):
        rec, s = w[0]["record"], max(w[i]["stream_s"] for i in DELIVERY)
        put("sync.stream", s=s, leader_s=rec["seconds"], MB=rec["bytes"] / MB,
            buckets=rec["buckets"], GBps=gbps(rec["bytes"], s),
            peak_MB=rec["peak_gathered_bytes"] / MB)  # fmt: skip
        base = max(w[i]["baseline_s"] for i in DELIVERY)
        put("sync.base", s=base, gather_s=w[0]["gather_s"], send_s=w[0]["send_s"],
            MB=w[0]["sent_bytes"] / MB, GBps=gbps(w[0]["sent_bytes"], base),
            held_MB=w[0]["held_bytes"] / MB,
            same_tensors=all(x["identical"] for x in w[GROUP:]))  # fmt: skip
    for s in rounds("state"):
        join, leave = [x["join"] for x in s], [x["leave"] for x in s]
        top = {k: max(x[k] for x in join) for k in ("regroup_s", "rebuild_s", "transfer_s")}
        pair = [(x["received_bytes"], x["transfer_s"]) for x in join[GROUP:]]
        wire = sum(x["sent_bytes"] for x in join)
        put("join", **top, state_s=max(x["state_transfer_s"] for x in join),
            switch_s=max(x["wall_s"] for x in join), pair_MB=min(b for b, _ in pair) / MB,
            pair_GBps=min(gbps(b, t) for b, t in pair), wire_MB=wire / MB,
            GBps=gbps(wire, top["transfer_s"]))  # fmt: skip
        if "broadcast" in s[0]:
            b = [x["broadcast"] for x in s]
            gather, cast = max(x["gather_s"] for x in b), max(x["broadcast_s"] for x in b)
            state = b[0]["state_bytes"]
            put("bcast", s=gather + cast, gather_s=gather, broadcast_s=cast, MB=state / MB,
                wire_MB=state * (WORLD - 1) / MB, GBps=gbps(state, cast),
                consistent=all(x["consistent"] for x in b[GROUP:]))  # fmt: skip
        if "dcp" in s[0]:
            d, save = [x["dcp"] for x in s], max(x["dcp_save_s"] for x in s)
            build, load = max(x["build_s"] for x in d), max(x["load_s"] for x in d)
            put("dcp", s=save + build + load, save_s=save, build_s=build, load_s=load,
                folder_MB=d[0]["folder_bytes"] / MB,
                same_state=all(x["same_state"] for x in d))  # fmt: skip
        put("leave", offload_s=max(x["offload_s"] for x in leave[GROUP:]),
            regroup_s=max(x["regroup_s"] for x in leave),
            on_layout_s=max(x["on_layout_s"] for x in leave),
            weights_s=max(x["weights_s"] for x in leave[GROUP:]),
            switch_s=max(x["wall_s"] + x.get("weights_s", 0.0) for x in leave))  # fmt: skip
    for o in rounds("offload"):
        t = o[:GROUP]
        copy, back = max(x["copy_s"] for x in t), max(x["restore_s"] for x in t)
        put("offload", deactivate_s=max(x["deactivate_s"] for x in t),
            activate_s=max(x["activate_s"] for x in t), copy_MB=t[0]["bytes"] / MB,
            copy_offload_s=copy, copy_offload_GBps=gbps(t[0]["bytes"], copy),
            copy_restore_s=back, copy_restore_GBps=gbps(t[0]["bytes"], back))  # fmt: skip
    return {
        k: {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}
        for k, v in rows.items()
    }


SECTIONS = {
    "sync.stream": "weight sync, streamed (new)",
    "sync.base": "weight sync, gather_weights + p2p.send_whole (baseline)",
    "join": "replica group joins, shard to shard in on_layout (new)",
    "bcast": "replica group joins, full-state gather + broadcast (baseline)",
    "dcp": "replica group joins, DCP save + rebuild + load (baseline)",
    "leave": "replica group leaves (deactivate, release, weights to ranks 2-3)",
    "offload": "a trainer rank's offload/restore",
}


def table(m: dict[str, dict[str, float]]) -> str:
    lines, section = ["| measure | median | min | max |", "|---|---|---|---|"], None
    for key, v in m.items():
        where, name = key.split("|")
        if where != section:
            section = where
            lines.append(f"| **{SECTIONS[where]}** | | | |")
        name = name.replace("GBps", "GB/s")
        lines.append(f"| {name} | {v['median']:.4g} | {v['min']:.4g} | {v['max']:.4g} |")
    return "\n".join(lines)


def ratios(m: dict[str, dict[str, float]]) -> dict[str, float]:
    med = {k: v["median"] for k, v in m.items()}
    out = {"weight sync s, streamed / whole": med["sync.stream|s"] / med["sync.base|s"]}
    out["weight sync peak bytes, streamed / whole"] = (
        med["sync.stream|peak_MB"] / med["sync.base|held_MB"]
    )
    if "bcast|s" in med:
        out["join transfer s / (gather + broadcast) s"] = med["join|transfer_s"] / med["bcast|s"]
    if "dcp|s" in med:
        out["join rebuild + transfer s / DCP save + rebuild + load s"] = (
            med["join|state_s"] / med["dcp|s"]
        )
    return out


# --- the demo run -------------------------------------------------------------------------


def cli(*args: str, runs: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "reflow_cli.main", *args]
    env = {**os.environ, "REFLOW_RUNS_DIR": str(runs), "COLUMNS": "200"}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


def demo_run(steps: int, runs: Path, timeout_s: float) -> dict:
    """The demo recipe on real engines, rebalanced 3:1 then 2:2 (``reflow rebalance``'s
    request, sent from here: a CLI process takes seconds to start, a demo step about one);
    the final status's switch records."""
    from jobs.control import ControlClient
    from jobs.errors import UserError
    from jobs.launch import TERMINAL, read_status, wait_until
    from runtime.store.run_dir import RunPaths
    from runtime.transport import protocol as p

    args = ["launch", "recipes/demo.yaml", "--local", "--name", "bench-switch"]
    for s in ("train.strategy=fsdp2", f"train.steps={steps}", "control.heartbeat_timeout_s=120"):
        args += ["--set", s]
    start = time.monotonic()
    done = cli(*args, runs=runs)  # run in the repository: the recipe's path is relative
    if done.returncode != 0:
        raise SystemExit(f"demo run did not start: {(done.stderr or done.stdout).strip()[-400:]}")
    paths = RunPaths(max(runs.glob("bench-switch*"), key=lambda d: d.stat().st_mtime))
    try:
        status = wait_until(paths, lambda s: s.get("step", 0) >= 3, timeout_s)
        for rollout, trainer in ((3, 1), (2, 2)):
            if status.get("state") in TERMINAL:
                break  # the run ended first: the table shows the switches applied
            reply = ControlClient(paths, timeout_s=60).command(
                p.RebalanceRequest(rollout=rollout, trainer=trainer)
            )
            if not reply.ok:
                raise SystemExit(f"rebalance {rollout}:{trainer}: {reply.text}")

            def taken_up(s: dict, n: int = rollout) -> bool:
                layout = s.get("layout", {})
                return layout.get("rollout_gpus") == n and not layout.get("switching")

            status = wait_until(paths, taken_up, timeout_s)
        final = wait_until(paths, lambda s: s.get("state") in TERMINAL, timeout_s)
    except UserError as err:
        raise SystemExit(f"demo run: {err}") from None
    finally:
        if read_status(paths).get("state") not in TERMINAL:
            cli("stop", paths.name, runs=runs, timeout=120)  # this run only, by its name
    if final.get("state") != "COMPLETED":
        raise SystemExit(f"demo run {final.get('state')}: {final.get('reason')} ({paths.root})")
    switches = [x for x in final.get("switches", []) if x.get("applied")]
    return {"command": "reflow " + " ".join(args), "run_dir": str(paths.root),
            "wall_s": time.monotonic() - start, "steps": final.get("step"),
            "switches": switches}  # fmt: skip


def demo_table(demo: dict) -> str:
    lines = ["| switch | duration s | slowest rank s | " + " | ".join(PHASES) + " |"]
    lines.append("|---|---|---|" + "---|" * len(PHASES))
    for x in demo["switches"]:
        phases = x.get("phases_max_s") or {}
        cells = [f"{phases[p]:.3f}" if p in phases else "-" for p in PHASES]
        cells = [x["ratio"], f"{x['duration_s']:.3f}", f"{x['max_rank_switch_s']:.3f}", *cells]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- main ---------------------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="measured rounds")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    ap.add_argument("--model", default="embedded:small-qwen3", help="HF folder or embedded:")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", help="model.dtype (rollout): default float32 on cpu, else bf16")
    ap.add_argument("--bucket-mb", type=float, default=32.0, help="engine.weight_bucket_mb")
    ap.add_argument("--baselines", default=",".join(BASELINES), help="of broadcast,dcp")
    ap.add_argument("--batch", type=int, default=8, help="samples of the one training step")
    ap.add_argument("--demo", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--demo-steps", type=int, default=14)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the measurements there")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for each part")
    ap.add_argument("--rank-spec", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rank_spec is not None:
        return args
    if args.repeats < 1 or args.warmup < 0 or args.batch < 1 or args.bucket_mb <= 0:
        ap.error("--repeats and --batch must be >= 1, --warmup >= 0, --bucket-mb > 0")
    if args.demo_steps < 8:
        ap.error("--demo-steps must be >= 8 (two switches happen from step 3 on)")
    args.baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
    if not set(args.baselines) <= set(BASELINES):
        ap.error(f"--baselines: a comma list of {', '.join(BASELINES)}")
    import torch

    if args.device == "cuda" and torch.cuda.device_count() < WORLD:
        n = torch.cuda.device_count()
        ap.error(f"--device cuda needs {WORLD} GPUs, one per rank; torch sees {n}")
    from runtime.embedded.resolve import BUILDERS

    if args.model in BUILDERS:
        module, _, attr = BUILDERS[args.model].partition(":")
        args.model_path = str(getattr(importlib.import_module(module), attr)())  # cached
    elif (Path(args.model) / "config.json").is_file():
        args.model_path = str(Path(args.model).resolve())
    else:
        ap.error(f"--model {args.model}: no config.json there, and not an embedded model")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    return args


def main() -> None:
    args = arguments()
    if args.rank_spec is not None:
        rank_entry(args.rank_spec, args.rank)
        return
    import torch

    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "torch": torch.__version__, "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "load_average_start": os.getloadavg(),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}  # fmt: skip
    load = " ".join(f"{x:.2f}" for x in info["load_average_start"])
    backend = "gloo" if args.device == "cpu" else "cpu:gloo,cuda:nccl"
    print(f"{args.model} ({args.model_path}); {WORLD} ranks, fsdp2 in replica groups of "
          f"{GROUP}, {args.device} ({backend}), one torch thread each; {args.warmup} warm-up "
          f"+ {args.repeats} measured rounds; {info['cpu_count']} CPUs, torch {info['torch']}, "
          f"{info['platform']}, {info['date']}; load average {load}", flush=True)  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="reflow-bench-switch-"))
    spec = {"dir": str(work / "ranks"), "model": args.model_path, "dtype": args.dtype,
            "device": args.device, "bucket_mb": args.bucket_mb, "baselines": args.baselines,
            "batch": args.batch, "seed": args.seed, "warmup": args.warmup,
            "repeats": args.repeats, "collective_timeout_s": min(args.timeout, 600)}  # fmt: skip
    start = time.monotonic()
    ranks = run_ranks(spec, args.timeout)
    spec["ranks_wall_s"] = time.monotonic() - start
    print(f"  ranks: done in {spec['ranks_wall_s']:.0f} s", flush=True)
    m, params = measures(ranks, args.warmup), ranks[0]["params"]
    print(f"\nModel parameters: {params:,}; rollout dtype {args.dtype}; {args.bucket_mb:g} MiB "
          "buckets.\n")  # fmt: skip
    print(table(m))
    r = ratios(m)
    print(
        "\nnew / baseline (medians, this run): " + "; ".join(f"{k} {v:.2f}x" for k, v in r.items())
    )
    print(NOTE, flush=True)
    demo: dict | None = None
    if args.demo:
        runs = Path(os.environ.get("REFLOW_RUNS_DIR") or work / "runs")
        try:
            demo = demo_run(args.demo_steps, runs, args.timeout)
        except SystemExit as err:  # the measurements above are written all the same
            demo = {"error": str(err)}
            print(f"\n{err}", file=sys.stderr)
    if demo is not None and "error" not in demo:
        print(f"\nDemo run ({demo['command']}): {demo['steps']} steps in {demo['wall_s']:.0f} s.")
        print(demo_table(demo))
        if len(demo["switches"]) < 2:
            print(f"Only {len(demo['switches'])} switch(es) applied before the run ended: "
                  "more --demo-steps.")  # fmt: skip
        print("vLLM's CPU build has no sleep mode: the rollout side's sleep and wake are state "
              "only; the trainer's offload on the CPU copies nothing.")  # fmt: skip
    info["load_average_end"] = os.getloadavg()
    print("load average at the end: " + " ".join(f"{x:.2f}" for x in info["load_average_end"]))
    if args.json is not None:
        settings = {**spec, "world": WORLD, "trainer_gpus_per_replica": GROUP}
        doc = {"benchmark": "switch", "machine": info, "model": args.model,
               "model_parameters": params, "settings": settings, "measures": m,
               "ratios_new_over_baseline": r, "demo": demo, "ranks": ranks}  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    runs_here = args.demo and not os.environ.get("REFLOW_RUNS_DIR")  # the demo run's folder
    shutil.rmtree(work / "ranks" if runs_here else work, ignore_errors=True)
    if demo is not None and "error" in demo:
        sys.exit(1)


if __name__ == "__main__":
    main()
