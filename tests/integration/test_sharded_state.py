"""Sharded trainer checkpoints (torch.distributed.checkpoint) over real gloo process groups.

FSDP2 (``fully_shard`` per decoder block, then the root) on the embedded tiny Qwen3: two
ranks train one AdamW step on different data and save; a fresh model on one rank and on
three ranks loads it and holds exactly the saved parameters and AdamW state. The
"replicate" strategy (a plain module on every rank) saves one copy. ``export_hf`` streams
the checkpoint into a safetensors file transformers loads, one tensor at a time. A file of
the checkpoint that would run code on load is refused without running it.

The ranks are forked from a forkserver that imported torch and transformers once: a
spawned rank would spend most of its time importing, on a two-core machine.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import shutil
import socket
import time
import weakref
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.engines.torch import sharded_state as ss
from runtime.store.checkpoint import EXTRA_FILE, CheckpointError

pytestmark = pytest.mark.integration

HIDDEN, LAYERS = 64, 2
TIMEOUT_S = 180  # for one whole multi-rank script; each takes seconds
_PRELOAD = [
    "torch",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "transformers",
    "transformers.models.qwen3.modeling_qwen3",
    "runtime.embedded.tiny_qwen3",
    "runtime.engines.torch.sharded_state",
    "tests.integration.test_sharded_state",
]


# --- running ranks -----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(fn, world: int, *args, timeout: float = TIMEOUT_S) -> None:
    """``fn(rank, world, port, *args)`` on ``world`` processes; a failure in any is raised
    here (the others are terminated), and so is one that does not end in ``timeout``."""
    multiprocessing.set_forkserver_preload(_PRELOAD)
    ctx = mp.start_processes(
        fn,
        args=(world, _free_port(), *args),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise TimeoutError(f"{fn.__name__} on {world} ranks: not done in {timeout}s")


def _join(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )


def _model(seed: int, mesh=None) -> torch.nn.Module:
    """The tiny Qwen3 (tied embeddings), ``fully_shard``'ed over ``mesh`` if given."""
    from torch.distributed.fsdp import fully_shard

    from runtime.embedded.tiny_qwen3 import build_model

    model = build_model(seed, hidden=HIDDEN, layers=LAYERS)
    if mesh is not None:
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model


def _train_step(model, opt, data_seed: int) -> None:
    g = torch.Generator().manual_seed(data_seed)
    ids = torch.randint(4, 26, (2, 12), generator=g)
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()


def _full(model, opt, everywhere: bool = False) -> dict:
    """Gathered model and AdamW state (all ranks call; global rank 0 holds them, or every
    rank with ``everywhere``: cpu_offload keeps them on global rank 0 only)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    return {
        "model": get_model_state_dict(model, options=options),
        "optim": get_optimizer_state_dict(model, opt, options=options),
    }


def _extra(rank: int) -> dict:
    torch.manual_seed(40 + rank)
    random.seed(50 + rank)
    return {
        "step": 7,
        "version": 3,
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "saved_by": rank,
    }


# --- the rank scripts --------------------------------------------------------------------


def _save_fsdp(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    _join(rank, world, port)
    try:
        model = _model(0, init_device_mesh("cpu", (world,)))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train_step(model, opt, data_seed=100 + rank)  # different data per rank
        extra = _extra(rank)
        ss.save_sharded(Path(out) / "trainer", model, opt, extra)
        full = _full(model, opt)
        if rank == 0:
            torch.save({**full, "extra": extra}, Path(out) / "reference.pt")
    finally:
        dist.destroy_process_group()


def _save_hsdp(rank: int, world: int, port: int, out: str) -> None:
    """4 ranks, mesh ("replicate", "shard") = (2, 2): each replica group of 2 shards the
    model; the two groups hold the same shards."""
    from torch.distributed.device_mesh import init_device_mesh

    _join(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
        model = _model(0, mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train_step(model, opt, data_seed=100 + rank)
        ss.save_sharded(Path(out) / "trainer", model, opt, _extra(rank))
        full = _full(model, opt)
        if rank == 0:
            torch.save(full, Path(out) / "reference.pt")
    finally:
        dist.destroy_process_group()


def _load(rank: int, world: int, port: int, folder: str, out: str, strategy: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    _join(rank, world, port)
    try:
        mesh = init_device_mesh("cpu", (world,)) if strategy == "fsdp" else None
        model = _model(1, mesh)  # another seed: nothing equal by chance
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        extra = ss.load_sharded(Path(folder), model, opt)
        full = _full(model, opt)
        if rank == 0:
            torch.save({**full, "extra": extra}, Path(out))
    finally:
        dist.destroy_process_group()


def _replicate(rank: int, world: int, port: int, out: str) -> None:
    """Plain modules, the same on every rank (the same data, as a replicated trainer's
    all-reduced gradients keep them): save, then load into fresh ones in place."""
    _join(rank, world, port)
    try:
        model = _model(0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        _train_step(model, opt, data_seed=100)
        extra = _extra(rank)
        ss.save_sharded(Path(out) / "trainer", model, opt, extra)
        if rank == 0:
            torch.save({**_full(model, opt), "extra": extra}, Path(out) / "reference.pt")
        fresh = _model(1)
        fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
        loaded = ss.load_sharded(Path(out) / "trainer", fresh, fresh_opt)
        assert loaded["saved_by"] == 0 and loaded["step"] == 7
        for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
            assert torch.equal(a, b), k
        for p, q in zip(model.parameters(), fresh.parameters(), strict=True):
            for name, t in opt.state[p].items():
                assert torch.equal(fresh_opt.state[q][name], t), name
    finally:
        dist.destroy_process_group()


def _save_on_a_subgroup(rank: int, world: int, port: int, out: str) -> None:
    """World of 3 (a rollout rank among the trainers): trainer group {1, 2} saves, so the
    group's rank 0, global rank 1, writes extra.pt; then group {0, 2} loads it."""
    from torch.distributed.device_mesh import DeviceMesh

    _join(rank, world, port)
    try:
        savers, loaders = dist.new_group([1, 2]), dist.new_group([0, 2])
        if rank in (1, 2):
            model = _model(0, DeviceMesh.from_group(savers, "cpu"))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            _train_step(model, opt, data_seed=100 + rank)
            ss.save_sharded(Path(out) / "trainer", model, opt, _extra(rank), savers)
            full = _full(model, opt, everywhere=True)
            if rank == 1:
                torch.save(full, Path(out) / "reference.pt")
        dist.barrier()
        if rank in (0, 2):
            model = _model(1, DeviceMesh.from_group(loaders, "cpu"))
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            extra = ss.load_sharded(Path(out) / "trainer", model, opt, loaders)
            full = _full(model, opt)
            if rank == 0:
                torch.save({**full, "extra": extra}, Path(out) / "loaded.pt")
    finally:
        dist.destroy_process_group()


# --- checks ------------------------------------------------------------------------------


def assert_same_state(got: dict, want: dict) -> None:
    assert got["model"].keys() == want["model"].keys()
    for k, v in want["model"].items():
        assert torch.equal(got["model"][k], v), k
    assert got["optim"]["state"].keys() == want["optim"]["state"].keys()
    for fqn, moments in want["optim"]["state"].items():
        assert set(moments) == {"step", "exp_avg", "exp_avg_sq"}, fqn
        for name, t in moments.items():
            assert torch.equal(got["optim"]["state"][fqn][name], t), (fqn, name)
    assert got["optim"]["param_groups"][0]["lr"] == want["optim"]["param_groups"][0]["lr"]


def assert_same_extra(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    assert torch.equal(got["torch_rng"], want["torch_rng"])
    assert got["python_rng"] == want["python_rng"]
    assert (got["step"], got["version"], got["saved_by"]) == (7, 3, 0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A 2-rank FSDP2 checkpoint after one step: ``<out>/trainer`` and the gathered state
    the ranks held (``reference.pt``)."""
    out = tmp_path_factory.mktemp("fsdp")
    run_ranks(_save_fsdp, 2, str(out))
    return out


def reference(out: Path) -> dict:
    return torch.load(out / "reference.pt", weights_only=True)


def test_two_ranks_write_their_own_shards_and_rank_0_the_extra(saved):
    names = sorted(f.name for f in (saved / "trainer").iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", EXTRA_FILE]
    fresh = _model(0).state_dict()
    trained = reference(saved)["model"]
    assert len(trained) == 25  # lm_head.weight included: the state dict, not HF's file
    assert any(not torch.equal(fresh[k], v) for k, v in trained.items())  # a step was taken


@pytest.mark.parametrize("world", [1, 3])
def test_a_sharded_checkpoint_loads_onto_another_number_of_ranks(saved, tmp_path, world):
    out = tmp_path / "loaded.pt"
    run_ranks(_load, world, str(saved / "trainer"), str(out), "fsdp")
    got, want = torch.load(out, weights_only=True), reference(saved)
    assert_same_state(got, want)
    assert_same_extra(got["extra"], want["extra"])


def assert_one_copy(folder: Path) -> None:
    """The shard files hold every tensor once: DCP's save planner dedups a chunk several
    ranks hold at the same offsets (each entry adds ~1 KiB of torch.save framing)."""
    metadata = ss.read_metadata(folder)
    payload = sum(
        m.properties.dtype.itemsize * m.size.numel()
        for m in metadata.state_dict_metadata.values()
        if hasattr(m, "size")
    )
    written = sum(f.stat().st_size for f in folder.glob("*.distcp"))
    assert payload < written < 1.3 * payload


def test_the_replicate_strategy_saves_one_copy_and_loads(tmp_path):
    run_ranks(_replicate, 2, str(tmp_path))
    folder = tmp_path / "trainer"
    assert_one_copy(folder)
    # and a sharded model loads what a replicated one saved (a change of strategy)
    run_ranks(_load, 2, str(folder), str(tmp_path / "as_fsdp.pt"), "fsdp")
    got, want = torch.load(tmp_path / "as_fsdp.pt", weights_only=True), reference(tmp_path)
    assert_same_state(got, want)


def test_an_hsdp_checkpoint_holds_one_replica_and_loads_on_one_rank(tmp_path):
    run_ranks(_save_hsdp, 4, str(tmp_path))
    assert len(list((tmp_path / "trainer").glob("*.distcp"))) == 4
    assert_one_copy(tmp_path / "trainer")
    run_ranks(_load, 1, str(tmp_path / "trainer"), str(tmp_path / "loaded.pt"), "fsdp")
    got = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert_same_state(got, reference(tmp_path))


def test_a_trainer_subgroup_saves_and_another_loads(tmp_path):
    run_ranks(_save_on_a_subgroup, 3, str(tmp_path))
    got = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert_same_state(got, reference(tmp_path))
    assert got["extra"]["saved_by"] == 1  # the saving group's rank 0, not global rank 0


# --- export ------------------------------------------------------------------------------


def test_export_writes_hf_safetensors_that_transformers_loads(saved, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    names = ss.export_hf(saved / "trainer", out / "model.safetensors", tied_lm_head=True)
    want = reference(saved)["model"]
    assert sorted(names) == sorted(k for k in want if k != "lm_head.weight")
    assert "model.layers.0.self_attn.q_proj.weight" in names
    written = load_file(out / "model.safetensors")
    assert sorted(written) == sorted(names)
    for k, v in written.items():
        assert torch.equal(v, want[k]), k

    trained = _model(0)
    trained.load_state_dict(want)
    trained.config.architectures = [type(trained).__name__]
    trained.config.save_pretrained(out)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[1, 7, 14, 9, 17, 5, 11]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, trained(ids).logits, atol=1e-6, rtol=0)

    untied = ss.export_hf(saved / "trainer", tmp_path / "untied.safetensors", tied_lm_head=False)
    assert "lm_head.weight" in untied and len(untied) == len(names) + 1
    assert torch.equal(
        load_file(tmp_path / "untied.safetensors")["lm_head.weight"], want["lm_head.weight"]
    )


def test_export_holds_one_full_tensor_at_a_time(saved, tmp_path, monkeypatch):
    """Every tensor is loaded by ss.load_tensor, once, and the one before it is gone
    (freed, not only unreferenced by the caller) when the next is loaded."""
    real = ss.load_tensor
    live: list[weakref.ref] = []
    alive_at_load: list[int] = []

    def tracked(reader, fqn, meta):
        alive_at_load.append(sum(ref() is not None for ref in live))
        tensor = real(reader, fqn, meta)
        live.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(ss, "load_tensor", tracked)
    names = ss.export_hf(saved / "trainer", tmp_path / "model.safetensors", tied_lm_head=True)
    assert len(alive_at_load) == len(names) == 24
    assert max(alive_at_load) == 0
    assert all(ref() is None for ref in live)


# --- what loading refuses ---------------------------------------------------------------


class RunsCode:
    """Unpickling this calls os.system(...): stands for any code in a pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def plain_copy(saved: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "step-00000007" / "trainer"
    shutil.copytree(saved / "trainer", folder)
    return folder


def refused(call, marker: Path) -> str:
    with pytest.raises(CheckpointError) as caught:
        call()
    assert not marker.exists(), "loading the checkpoint ran code from its pickle"
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_an_extra_pt_that_runs_code_is_refused(saved, tmp_path):
    folder, marker = plain_copy(saved, tmp_path), tmp_path / "ran"
    torch.save({"step": 7, "version": 3, "x": RunsCode(marker)}, folder / EXTRA_FILE)
    model = _model(1)
    message = refused(
        lambda: ss.load_sharded(folder, model, torch.optim.AdamW(model.parameters())), marker
    )
    assert "step-00000007/trainer/extra.pt: refused" in message and "posix.system" in message


def test_dcp_metadata_that_runs_code_is_refused(saved, tmp_path):
    folder, marker = plain_copy(saved, tmp_path), tmp_path / "ran"
    (folder / ".metadata").write_bytes(pickle.dumps(RunsCode(marker)))
    model = _model(1)
    message = refused(
        lambda: ss.load_sharded(folder, model, torch.optim.AdamW(model.parameters())), marker
    )
    assert "trainer/.metadata: refused" in message and "posix.system" in message
    message = refused(
        lambda: ss.export_hf(folder, tmp_path / "x.safetensors", tied_lm_head=True), marker
    )
    assert not (tmp_path / "x.safetensors").exists()


def test_a_non_tensor_entry_that_runs_code_is_refused(tmp_path):
    """DCP saves non-tensor state (AdamW's param_groups) as pickles and itself loads them
    unrestricted; here they go through weights_only=True."""
    marker = tmp_path / "ran"
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    opt.param_groups[0]["hook"] = RunsCode(marker)
    folder = tmp_path / "step-00000001" / "trainer"
    ss.save_sharded(folder, model, opt, {"step": 1})
    fresh = torch.nn.Linear(3, 2)
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    fresh_opt.param_groups[0]["hook"] = None
    message = refused(lambda: ss.load_sharded(folder, fresh, fresh_opt), marker)
    assert "step-00000001/trainer: cannot be loaded (refused" in message
    assert "posix.system" in message


def test_a_save_into_a_used_folder_is_refused(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    folder = tmp_path / "step-00000001" / "trainer"
    ss.save_sharded(folder, model, opt, {"step": 1})
    with pytest.raises(CheckpointError, match="not empty"):
        ss.save_sharded(folder, model, opt, {"step": 1})
    with pytest.raises(CheckpointError, match="more than plain tensors"):
        ss.save_sharded(tmp_path / "other", model, opt, {"x": RunsCode(tmp_path / "m")})


# --- reflow export from a checkpoint -----------------------------------------------------


def test_reflow_export_writes_a_sealed_checkpoint_as_an_hf_folder(saved, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from jobs.errors import UserError
    from jobs.export import export
    from runtime.config.recipe import build_config, dump_config
    from runtime.embedded.tiny_qwen3 import build_tokenizer, save_pretrained
    from runtime.store import checkpoint as ck
    from runtime.store.run_dir import RunPaths
    from runtime.transport.auth import create_run_keys

    base = save_pretrained(_model(0), build_tokenizer(), tmp_path / "base")
    paths = RunPaths(tmp_path / "runs" / "sharded-1")
    paths.root.mkdir(parents=True)
    create_run_keys(paths.keys)
    dump_config(build_config({"model": {"path": str(base)}}), paths.config)
    staging = ck.start(paths.checkpoints, 7)
    shutil.copytree(saved / "trainer", ck.trainer_dir(staging))
    ck.coordinator_writer(paths.checkpoints, keep=3)(7, 3, {"format": 1})

    out = export(paths, tmp_path / "hf", checkpoint="step-00000007")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {f.name for f in out.iterdir()}
    assert json.loads((out / "reflow_export.json").read_text()) == {
        "run": "sharded-1",
        "checkpoint": "step-00000007",
        "step": 7,
        "policy_version": 3,
        "base_model": str(base),
    }
    trained = _model(0)
    trained.load_state_dict(reference(saved)["model"])
    ids = torch.tensor([[1, 7, 14, 9, 17, 5, 11]])
    with torch.no_grad():
        exported = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
        assert torch.allclose(exported, trained(ids).logits, atol=1e-6, rtol=0)
    assert AutoTokenizer.from_pretrained(out)("S3+4=").input_ids[0] == 21

    with pytest.raises(UserError, match="give one"):
        export(paths, tmp_path / "o1", version=3, checkpoint="step-00000007")
    shard = paths.checkpoints / "step-00000007" / "trainer" / "__1_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    with pytest.raises(UserError, match=r"step-00000007/trainer/__1_0\.distcp: checksum mismatch"):
        export(paths, tmp_path / "o2", checkpoint="step-00000007")
    with pytest.raises(UserError, match="not a checkpoint folder name"):
        export(paths, tmp_path / "o3", checkpoint="../../x")
    assert not any((tmp_path / o).exists() for o in ("o1", "o2", "o3"))
