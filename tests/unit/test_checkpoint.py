"""Checkpoints: the folder format (atomic, checksummed, last K kept), the data plane's and
the coordinator's state across a save/restore, and the checkpoint/stop protocol."""

import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import msgpack
import pytest
import torch

from runtime.config.layout import Role
from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.control.data_plane import DataPlane
from runtime.data.sample import Request
from runtime.engines.synthetic import SyntheticTrainer
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.sharded_state import load_sharded, save_sharded
from runtime.engines.torch.trainer import TorchTrainer
from runtime.store import checkpoint as ck
from runtime.store.checkpoint import folder_name
from runtime.transport import protocol as p
from runtime.transport.auth import create_run_keys
from runtime.transport.frames import sample_done
from tests.unit.test_coordinator import Clock, clock, ident, make, register_all
from tests.unit.test_data_plane import prompts, traj
from tests.unit.test_trainer import model_dir

__all__ = ["clock", "model_dir"]  # fixtures shared with test_coordinator and test_trainer

# --- the folder format -----------------------------------------------------------------


def new_run(parent: Path, name: str = "run") -> Path:
    """A run folder's checkpoints folder, with the run's keys next to it (as launched)."""
    run = parent / name
    run.mkdir()
    create_run_keys(run / "keys")
    return run / "checkpoints"


@pytest.fixture
def root(tmp_path):
    return new_run(tmp_path)


SHARD = f"{ck.TRAINER_DIR}/__0_0.distcp"
TRAINER_FILES = (
    f"{ck.TRAINER_DIR}/{ck.DCP_METADATA}",
    SHARD,
    f"{ck.TRAINER_DIR}/__1_0.distcp",
    f"{ck.TRAINER_DIR}/{ck.EXTRA_FILE}",
)


def write_trainer_part(staging: Path, payload: bytes = b"weights") -> None:
    """What two trainer ranks leave in trainer/ (bytes stand in for DCP's files)."""
    folder = ck.trainer_dir(staging)
    folder.mkdir()
    (folder / ck.DCP_METADATA).write_bytes(b"index" * 20)
    (folder / "__0_0.distcp").write_bytes(payload * 100)
    (folder / "__1_0.distcp").write_bytes(payload * 90)
    (folder / ck.EXTRA_FILE).write_bytes(b"extra" * 10)


def write(root, step, payload=b"weights"):
    staging = ck.start(root, step)
    write_trainer_part(staging, payload)
    save = ck.coordinator_writer(root, keep=3)
    return save(step, step, {"format": 1, "step": step})


def test_the_manifest_lists_every_file_by_its_path_in_the_folder(root):
    write(root, 2)
    manifest = json.loads((root / "step-00000002" / ck.MANIFEST).read_text())
    assert sorted(manifest["files"]) == sorted((*TRAINER_FILES, ck.COORDINATOR_FILE))
    shard = root / "step-00000002" / SHARD
    assert manifest["files"][SHARD] == {
        "sha256": hashlib.sha256(shard.read_bytes()).hexdigest(),
        "bytes": shard.stat().st_size,
    }


def test_a_sealed_checkpoint_verifies_and_the_newest_wins(root):
    for step in (2, 4, 6):
        write(root, step)
    info, rejected = ck.latest_valid(root)
    assert info is not None and info.step == 6 and rejected == []
    assert ck.read_coordinator_state(info) == {"format": 1, "step": 6}


def test_only_the_last_k_are_kept_and_a_staging_folder_is_ignored(root):
    for step in (2, 4, 6, 8):
        write(root, step)
    assert sorted(d.name for d in root.iterdir()) == [
        "step-00000004",
        "step-00000006",
        "step-00000008",
    ]
    ck.start(root, 10)  # a crash mid-write leaves this behind
    write_trainer_part(ck.staging_dir(root, 10), b"half")
    info, rejected = ck.latest_valid(root)
    assert info.step == 8 and rejected == []


def _zero(f):
    """Same size, other bytes: only the checksum can tell."""
    f.write_bytes(b"\x00" * f.stat().st_size)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda d: (d / SHARD).write_bytes(b"weights" * 50), "trainer/__0_0.distcp: 350 bytes"),
        (lambda d: _zero(d / SHARD), "trainer/__0_0.distcp: checksum mismatch"),
        (lambda d: _zero(d / ck.COORDINATOR_FILE), "checksum mismatch"),
        (lambda d: (d / ck.MANIFEST).unlink(), "no manifest.json"),
        (lambda d: (d / ck.MANIFEST).write_text("{"), "unreadable"),
        (lambda d: (d / SHARD).unlink(), "trainer/__0_0.distcp: missing"),
        (lambda d: shutil.rmtree(d / ck.TRAINER_DIR), "missing"),
        (lambda d: (d / ck.TRAINER_DIR / "__2_0.distcp").write_bytes(b"x"), "added after sealing"),
        (lambda d: (d / "notes.txt").write_text("x"), "notes.txt: not in manifest.json"),
        (lambda d: (d / ck.TRAINER_DIR / "x").symlink_to("/etc/passwd"), "not a plain file"),
    ],
)
def test_a_damaged_checkpoint_is_rejected_and_the_previous_one_used(root, damage, message):
    write(root, 2)
    newest = write(root, 4)
    damage(root / "step-00000004")
    info, rejected = ck.latest_valid(root)
    assert info is not None and info.step == 2
    assert len(rejected) == 1 and message in rejected[0] and "step-00000004" in rejected[0]
    assert newest.endswith("step-00000004")
    with pytest.raises(ck.CheckpointError):
        ck.find(root, "step-00000004")


def test_a_flipped_byte_is_caught(root):
    write(root, 2)
    write(root, 4)
    f = root / "step-00000004" / SHARD
    data = bytearray(f.read_bytes())
    data[100] ^= 0x01
    f.write_bytes(bytes(data))
    info, rejected = ck.latest_valid(root)
    assert info.step == 2 and "checksum mismatch" in rejected[0]


def test_names_from_the_control_file_cannot_escape_the_folder(root):
    with pytest.raises(ck.CheckpointError, match="not a checkpoint folder name"):
        ck.find(root, "../../etc")


def test_a_truncated_shard_fails_its_check(root):
    write(root, 2)
    write(root, 4)
    f = root / "step-00000004" / SHARD
    with f.open("r+b") as fh:  # as a crash or a full disk leaves it
        fh.truncate(f.stat().st_size // 2)
    info, rejected = ck.latest_valid(root)
    assert info.step == 2 and "step-00000004/trainer/__0_0.distcp" in rejected[0]
    assert "truncated" in rejected[0]


def test_sealing_without_the_trainer_part_fails(root):
    staging = ck.start(root, 3)
    with pytest.raises(ck.CheckpointError, match=r"trainer/\.metadata is missing"):
        ck.coordinator_writer(root, 3)(3, 3, {})
    ck.trainer_dir(staging).mkdir()
    (ck.trainer_dir(staging) / ck.DCP_METADATA).write_bytes(b"index")
    with pytest.raises(ck.CheckpointError, match=r"trainer/extra\.pt is missing"):
        ck.coordinator_writer(root, 3)(3, 3, {})


def seal_by_hand(root: Path, step: int, files: dict) -> Path:
    """A folder whose manifest the run's key really signs, listing ``files`` as given: what
    verify must still refuse when the sealer itself was fooled or is old."""
    folder = root / folder_name(step)
    manifest = {"step": step, "policy_version": step, "created_at": 0.0, "files": files}
    manifest["hmac"] = ck._mac(ck.run_key(root), manifest)
    (folder / ck.MANIFEST).write_text(json.dumps(manifest))
    return folder


def entry(f: Path) -> dict:
    return {"sha256": hashlib.sha256(f.read_bytes()).hexdigest(), "bytes": f.stat().st_size}


@pytest.mark.parametrize(
    "name",
    [
        "../keys/secret",
        "/etc/passwd",
        "trainer/../coordinator.msgpack",
        "./coordinator.msgpack",
        "trainer//extra.pt",
        "trainer\\extra.pt",
        "manifest.json",
        "",
    ],
)
def test_a_manifest_naming_a_path_outside_the_folder_is_refused(root, name):
    write(root, 2)
    folder = root / "step-00000002"
    files = json.loads((folder / ck.MANIFEST).read_text())["files"]
    files[name] = entry(folder / ck.COORDINATOR_FILE)
    seal_by_hand(root, 2, files)
    with pytest.raises(ck.CheckpointError, match="not a file of the folder"):
        ck.find(root, "step-00000002")


def test_a_folder_of_the_format_before_sharded_checkpoints_is_refused(root):
    """One trainer.pt by the trainer leader, sealed by the run (as older ReFlow wrote it)."""
    folder = root / folder_name(6)
    folder.mkdir(parents=True)
    (folder / ck.LEGACY_TRAINER_FILE).write_bytes(b"weights" * 100)
    (folder / ck.COORDINATOR_FILE).write_bytes(msgpack.packb({"format": 1}))
    seal_by_hand(root, 6, {n: entry(folder / n) for n in ("trainer.pt", ck.COORDINATOR_FILE)})
    info, rejected = ck.latest_valid(root)
    assert info is None and len(rejected) == 1
    message = rejected[0]
    assert "\n" not in message and message.startswith("step-00000006: from an older ReFlow")
    assert "before sharded checkpoints" in message
    with pytest.raises(ck.CheckpointError, match="from an older ReFlow"):
        ck.find(root, "step-00000006")


# --- who sealed it: the run's key --------------------------------------------------------


def reseal(folder: Path, keep_mac: bool) -> None:
    """What anyone who can write the folder can do: fresh sha256 and sizes for every file,
    the manifest rewritten (with the old MAC left in, or without one)."""
    manifest = json.loads((folder / ck.MANIFEST).read_text())
    for name in manifest["files"]:
        data = (folder / name).read_bytes()
        manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    if not keep_mac:
        manifest.pop("hmac", None)
    (folder / ck.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.parametrize("keep_mac", [False, True])
def test_a_folder_re_sealed_without_the_run_key_is_refused(root, keep_mac):
    write(root, 2)
    write(root, 4)
    newest = root / "step-00000004"
    (newest / SHARD).write_bytes(b"replaced" * 100)
    reseal(newest, keep_mac)
    info, rejected = ck.latest_valid(root)
    assert info is not None and info.step == 2
    assert len(rejected) == 1 and "step-00000004" in rejected[0]
    assert ("HMAC mismatch" if keep_mac else "no HMAC") in rejected[0]
    with pytest.raises(ck.CheckpointError, match="not sealed with this run's key"):
        ck.find(root, "step-00000004")


def test_a_folder_sealed_with_another_runs_key_is_refused(tmp_path):
    ours, theirs = new_run(tmp_path, "ours"), new_run(tmp_path, "theirs")
    write(ours, 2)
    write(theirs, 6)  # sealed properly, by another run
    shutil.copytree(theirs / "step-00000006", ours / "step-00000006")
    info, rejected = ck.latest_valid(ours)
    assert info is not None and info.step == 2
    assert len(rejected) == 1 and "step-00000006" in rejected[0] and "HMAC mismatch" in rejected[0]
    assert ck.latest_valid(theirs)[0].step == 6  # in its own run it verifies


def test_a_signed_folder_renamed_to_a_newer_step_is_refused(root):
    write(root, 2)
    shutil.copytree(root / "step-00000002", root / "step-00000008")
    info, rejected = ck.latest_valid(root)
    assert info.step == 2 and "the manifest is for step 2" in rejected[0]


def test_without_the_run_keys_nothing_is_sealed_or_trusted(root):
    write(root, 2)
    shutil.rmtree(root.parent / "keys")
    info, rejected = ck.latest_valid(root)
    assert info is None and len(rejected) == 1 and "no key" in rejected[0]
    with pytest.raises(ck.CheckpointError, match="no key"):
        ck.find(root, "step-00000002")
    with pytest.raises(ck.CheckpointError, match="no key"):
        ck.coordinator_writer(root, 3)


# --- what it holds: extra.pt is tensors and plain values, never code ---------------------


class RunsCode:
    """Unpickling this calls os.mkdir(marker): stands for any code in a pickle."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


def tiny() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def sealed_with_code(root: Path, step: int, marker: Path) -> Path:
    """A checkpoint sealed by the run itself (so the MAC is right) whose trainer/extra.pt
    holds a pickle that runs code: the MAC alone must not be what keeps code from running."""
    staging = ck.start(root, step)
    model, opt = tiny()
    save_sharded(ck.trainer_dir(staging), model, opt, {"step": step})  # one process: no group
    extra = ck.trainer_dir(staging) / ck.EXTRA_FILE
    torch.save({"step": step, "version": step, "x": RunsCode(marker)}, extra)
    ck.coordinator_writer(root, keep=3)(step, step, {"format": 1})
    info = ck.find(root, folder_name(step))  # the folder itself verifies
    return info.path


def refused_without_running(load, marker: Path) -> str:
    error: Exception | None = None
    try:
        load()
    except Exception as exc:
        error = exc
    assert not marker.exists(), "loading the checkpoint ran code from its pickle"
    assert isinstance(error, ck.CheckpointError), repr(error)
    return str(error)


def test_loading_a_sharded_trainer_state_that_runs_code_is_refused(root, tmp_path):
    marker = tmp_path / "ran"
    folder = sealed_with_code(root, 4, marker)
    model, opt = tiny()
    message = refused_without_running(
        lambda: load_sharded(ck.trainer_dir(folder), model, opt), marker
    )
    assert "\n" not in message and "step-00000004/trainer/extra.pt: refused" in message
    assert "posix.mkdir" in message  # says what it refused
    message = refused_without_running(
        lambda: ck.load_trainer_state(ck.trainer_dir(folder) / ck.EXTRA_FILE), marker
    )
    assert "step-00000004/trainer/extra.pt: refused" in message


def test_the_torch_trainer_refuses_a_trainer_state_that_runs_code(root, tmp_path, model_dir):
    marker = tmp_path / "ran"
    folder = sealed_with_code(root, 4, marker)
    trainer = TorchTrainer(
        TorchTrainerConfig.from_config(build_config({"model": {"path": "x"}})), str(model_dir)
    )
    extra = ck.trainer_dir(folder) / ck.EXTRA_FILE
    message = refused_without_running(lambda: trainer.load_state(extra), marker)
    assert "\n" not in message and "step-00000004/trainer/extra.pt" in message


def test_a_trainer_state_round_trips_through_a_sealed_sharded_checkpoint(root):
    """The synthetic trainer's model, AdamW moments and step, torch and Python RNG, step
    and version: saved with DCP in one process, sealed, verified, loaded back exactly."""
    a = SyntheticTrainer(CFG, 0)
    loss = a._model(torch.tensor([1, 2, 3])).square().mean()
    loss.backward()
    a._opt.step()  # AdamW state now holds tensors (exp_avg, exp_avg_sq, step)
    torch.manual_seed(11)
    random.seed(12)
    extra = {"step": 4, "version": 3, "torch_rng": torch.get_rng_state()}
    extra["python_rng"] = random.getstate()
    staging = ck.start(root, 4)
    save_sharded(ck.trainer_dir(staging), a._model, a._opt, extra)
    ck.coordinator_writer(root, keep=3)(4, 3, {"format": 1})
    b = SyntheticTrainer(CFG, 0)
    got = load_sharded(ck.trainer_dir(ck.find(root, "step-00000004").path), b._model, b._opt)
    assert (got["step"], got["version"]) == (4, 3)
    assert torch.equal(got["torch_rng"], extra["torch_rng"])
    assert got["python_rng"] == extra["python_rng"]
    fresh = SyntheticTrainer(CFG, 0)
    restored = b._model.state_dict()
    for k, v in a._model.state_dict().items():
        assert torch.equal(restored[k], v) and not torch.equal(fresh._model.state_dict()[k], v), k
    moments = b._opt.state_dict()["state"]
    for i, s in a._opt.state_dict()["state"].items():
        assert all(torch.equal(moments[i][name], t) for name, t in s.items())


# --- the data plane across a save/restore ----------------------------------------------


CFG = build_config(
    {
        "train": {"batch_size": 8, "seed": 7},
        "algorithm": {"group_size": 4},
        "reflow": {"mode": "reflow", "sigma": 0.5, "delta": 2, "B_max": 12},
        "resources": {"gpus_per_node": 4, "initial_ratio": "2:2"},
    }
)


def drive(dp: DataPlane, rng: random.Random, steps: int, *, drain: bool) -> list[list[int]]:
    """Scripted rollout workers and trainer; the sample ids of every batch trained.
    ``drain``: finish all outstanding work before returning (a quiescent point)."""
    batches = []
    held: list = []
    while len(batches) < steps:
        worker = rng.choice((2, 3))
        held += [(r, worker) for r in dp.request_work(worker, rng.randint(1, 4))]
        rng.shuffle(held)
        for _ in range(rng.randint(0, len(held))):
            req, w = held.pop()
            dp.deliver(traj(req, dp.policy_version, worker=w))
        batch = dp.next_batch()
        if batch is not None:
            batches.append(sorted(t.sample_id for t in batch.samples))
            dp.finish_step(batch.batch_id, dp.step + 1, dp.policy_version + 1)
    if drain:
        for req, w in held:
            dp.deliver(traj(req, dp.policy_version, worker=w))
    return batches


def roundtrip(state):
    return msgpack.unpackb(msgpack.packb(state, use_bin_type=True), raw=False)


@pytest.mark.parametrize("seed", range(6))
def test_a_restored_data_plane_makes_the_same_batches_and_requests(seed):
    clock = Clock()
    original = DataPlane(CFG.reflow, CFG.train, CFG.algorithm.group_size, prompts(), clock)
    drive(original, random.Random(seed), 5, drain=True)
    state = roundtrip(original.state_dict())
    restored = DataPlane(
        CFG.reflow, CFG.train, CFG.algorithm.group_size, prompts(), clock
    )  # a fresh prompt stream, as after a crash
    restored.load_state_dict(state)
    assert restored.ledger() == original.ledger()
    # Same seed for the drivers from here: the sampler's RNG, the pools' order and the data
    # cursor must make the uninterrupted and the resumed run identical.
    a = drive(original, random.Random(1000 + seed), 6, drain=False)
    b = drive(restored, random.Random(1000 + seed), 6, drain=False)
    assert a == b
    assert [r.prompt for r in original.dispatcher.pending] == [
        r.prompt for r in restored.dispatcher.pending
    ]
    assert original.dispatcher._next_prompt == restored.dispatcher._next_prompt
    assert restored.ledger()["lost"] == 0 and restored.ledger()["duplicated"] == 0


def test_work_out_at_rollout_when_saved_comes_back_first_and_nothing_is_lost():
    clock = Clock()
    dp = DataPlane(CFG.reflow, CFG.train, CFG.algorithm.group_size, prompts(), clock)
    out = dp.request_work(2, 6)
    dp.deliver(traj(out[0], 0, worker=2))
    restored = DataPlane(CFG.reflow, CFG.train, CFG.algorithm.group_size, prompts(), clock)
    restored.load_state_dict(roundtrip(dp.state_dict()))
    assert [r.sample_id for r in list(restored.dispatcher.pending)[:5]] == [
        r.sample_id for r in out[1:]
    ]
    again = restored.request_work(3, 5)
    assert [r.sample_id for r in again] == [r.sample_id for r in out[1:]]
    for r in again:
        assert restored.deliver(traj(r, 0, worker=3))
    ledger = restored.ledger()
    assert ledger["delivered"] == 6 and ledger["lost"] == 0 and ledger["duplicated"] == 0
    # the one delivered before the save is not taken twice
    assert not restored.deliver(traj(out[0], 0, worker=2))


def test_a_batch_in_training_cannot_be_saved():
    clock = Clock()
    dp = DataPlane(CFG.reflow, CFG.train, CFG.algorithm.group_size, prompts(), clock)
    for r in dp.request_work(2, 8):
        dp.deliver(traj(r, 0, worker=2))
    assert dp.next_batch() is not None
    with pytest.raises(ValueError, match="step boundary"):
        dp.state_dict()


# --- the coordinator's checkpoint protocol ---------------------------------------------


class Saves:
    def __init__(self) -> None:
        self.calls: list = []
        self.fail = False

    def __call__(self, step, version, state):
        if self.fail:
            raise OSError("disk full")
        self.calls.append((step, version, roundtrip(state)))
        return f"ckpt/step-{step:08d}"


def coordinator(clock, saves, **train):
    c = make(
        clock,
        prompts=prompts(),
        train={"steps": 20, "batch_size": 4, "sync_every": 2, "checkpoint_every": 2, **train},
        algorithm={"group_size": 2},
    )
    c.ckpt.save = saves
    return c


def one_step(c, clock) -> list:
    """Deliver enough samples, hand the leader a batch and report the step."""
    for _ in range(10):
        work = c.handle(ident(2), p.WorkRequest(rank=2, slots=4))
        for req in work[0][1].requests:
            r = Request(req["sample_id"], req["group_id"], req["prompt_id"], req["prompt"])
            t = traj(r, c.policy_version, worker=2)
            c.handle(ident(2), sample_done(t, 2))
        out = c.handle(ident(0), p.BatchRequest(rank=0))
        if isinstance(out[0][1], p.Batch):
            batch = out[0][1]
            clock.t += 1
            return c.handle(
                ident(0),
                p.StepDone(
                    rank=0,
                    step=c.step + 1,
                    policy_version=c.cfg.train.version_at(c.step + 1),
                    batch_id=batch.batch_id,
                    metrics={"loss": 0.5},
                ),
            )
    raise AssertionError("no batch")


def test_checkpoints_are_taken_every_n_steps_and_hold_batches_meanwhile(clock):
    saves = Saves()
    c = coordinator(clock, saves)
    register_all(c)
    assert not [m for _, m in one_step(c, clock) if isinstance(m, p.Checkpoint)]
    out = one_step(c, clock)
    asks = [(i, m) for i, m in out if isinstance(m, p.Checkpoint)]
    # every trainer rank writes its own shards: all of them are asked
    trainers = c.layout.ranks(Role.TRAINER)
    assert [i for i, _ in asks] == [ident(r) for r in trainers] and len(trainers) > 1
    assert all(ask.step == 2 for _, ask in asks)
    ((_, wait),) = c.handle(ident(0), p.BatchRequest(rank=0))
    assert isinstance(wait, p.BatchWait) and "checkpoint" in wait.reason
    assert c.handle(ident(1), p.CheckpointSaved(rank=1, step=2, ok=True, error="")) == []
    assert c.messages.rejected["unexpected_checkpoint"] == 1  # only the leader's answer counts
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=2, ok=True, error=""))
    ((step, version, state),) = saves.calls
    # a sync every 2 steps: version 1 after step 2
    assert (step, version, state["step"], state["policy_version"]) == (2, 1, 2, 1)
    assert c.status()["checkpoint"]["last"]["step"] == 2
    assert isinstance(c.handle(ident(0), p.BatchRequest(rank=0))[0][1], (p.Batch, p.BatchWait))
    assert c.checkpoint_pending is None


def test_a_failed_checkpoint_is_recorded_and_the_run_goes_on(clock):
    saves = Saves()
    c = coordinator(clock, saves)
    register_all(c)
    one_step(c, clock)
    one_step(c, clock)
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=2, ok=False, error="OSError: disk full"))
    saves.fail = True
    one_step(c, clock)
    one_step(c, clock)
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=4, ok=True, error=""))
    one_step(c, clock)
    out = one_step(c, clock)  # step 6: the leader never answers
    assert any(isinstance(m, p.Checkpoint) for _, m in out)
    clock.t += c.cfg.control.checkpoint_timeout_s + 1
    for w in c.workers.values():  # the ranks are alive, only the answer is missing
        w.last_seen = clock.t
    c.tick()
    errors = [x.get("error", "") for x in c.checkpoints]
    assert [x["ok"] for x in c.checkpoints] == [False, False, False]
    assert "trainer: OSError: disk full" in errors[0] and "disk full" in errors[1]
    assert "no answer" in errors[2]
    assert c.state == "RUNNING" and c.checkpoint_pending is None


def test_a_stop_waits_for_the_batch_in_training_then_checkpoints_then_stops(clock):
    saves = Saves()
    c = coordinator(clock, saves, checkpoint_every=0)
    register_all(c)
    one_step(c, clock)
    # a batch goes out, then the stop arrives
    for _ in range(10):
        out = c.handle(ident(0), p.BatchRequest(rank=0))
        if isinstance(out[0][1], p.Batch):
            break
        for req in c.handle(ident(2), p.WorkRequest(rank=2, slots=4))[0][1].requests:
            r = Request(req["sample_id"], req["group_id"], req["prompt_id"], req["prompt"])
            c.handle(ident(2), sample_done(traj(r, c.policy_version, worker=2), 2))
    batch = out[0][1]
    assert c.request_stop("reflow stop") == []  # not yet: the batch is in training
    assert c.state == "RUNNING" and "after a checkpoint" in c.reason
    out = c.handle(
        ident(0),
        p.StepDone(rank=0, step=2, policy_version=1, batch_id=batch.batch_id, metrics={}),
    )
    trainers = c.layout.ranks(Role.TRAINER)
    assert [m.step for _, m in out if isinstance(m, p.Checkpoint)] == [2] * len(trainers)
    assert not any(isinstance(m, p.Stop) for _, m in out)
    # the rollout drivers are told to cut off what they run, for the checkpoint
    assert sorted(to for to, m in out if isinstance(m, p.Park)) == [ident(2), ident(3)]
    out = c.handle(ident(0), p.CheckpointSaved(rank=0, step=2, ok=True, error=""))
    assert out == [] and saves.calls == []  # the parked rollouts are not in yet
    assert c.handle(ident(2), p.Parked(rank=2, rollouts=[])) == []
    out = c.handle(ident(3), p.Parked(rank=3, rollouts=[]))
    assert c.state == "STOPPING" and len([m for _, m in out if isinstance(m, p.Stop)]) == 4
    assert saves.calls[0][0] == 2


def test_a_stop_before_training_started_does_not_checkpoint(clock):
    saves = Saves()
    c = coordinator(clock, saves)
    register_all(c)
    out = c.request_stop("SIGTERM")
    assert c.state == "STOPPING" and saves.calls == []
    assert all(isinstance(m, p.Stop) for _, m in out)


def saved_after_two_steps(clock) -> tuple[Coordinator, dict]:
    """A coordinator two steps in, and the state its checkpoint at step 2 saved."""
    saves = Saves()
    c = coordinator(clock, saves)
    register_all(c)
    for _ in range(2):
        one_step(c, clock)
    c.handle(ident(0), p.CheckpointSaved(rank=0, step=2, ok=True, error=""))
    return c, saves.calls[-1][2]


def test_a_restored_coordinator_continues_the_run(clock):
    c, state = saved_after_two_steps(clock)
    digest = c.buffer_digest()

    fresh = coordinator(Clock(), Saves())
    fresh.load_state_dict(state, source="step-00000002")
    assert (fresh.step, fresh.policy_version, fresh.life.attempt) == (2, 1, 2)
    assert fresh.buffer_digest() == digest
    assert fresh.life.resumed["from"] == "step-00000002"
    # When every rank is back, the restored weights go to the rollout ranks first.
    out = []
    for r in range(4):
        ((_, welcome),) = fresh.handle(ident(r), p.Hello(rank=r, world_size=4, node="n", pid=9))
        out = fresh.handle(ident(r), p.Ready(rank=r, role=welcome.role, layout_epoch=0))
    assert fresh.state == "RUNNING"
    syncs = {to for to, m in out if isinstance(m, p.WeightSync) and m.policy_version == 1}
    assert syncs == {ident(0), ident(2), ident(3)}
    one_step(fresh, clock)
    line = fresh.reports.new_lines[-1]
    assert line["step"] == 3 and line["attempt"] == 2


def test_a_foreign_state_format_is_refused(clock):
    c = coordinator(clock, Saves())
    for old in (1, 2, 99):  # 1: samples with an ``extra`` dict; 2: versions per step
        with pytest.raises(ValueError, match="format"):
            c.load_state_dict({"format": old})


def test_step_version_and_the_batch_in_training_have_one_owner(clock):
    # the data plane keeps them; the run reads them and cannot set them apart from it
    c = coordinator(clock, Saves())
    register_all(c)
    with pytest.raises(AttributeError):
        c.step = 5  # type: ignore[misc]
    with pytest.raises(AttributeError):
        c.batch_in_flight = 3  # type: ignore[misc]
    from tests.unit.test_coordinator import take_batch

    batch = take_batch(c)
    assert c.batch_in_flight == batch.batch_id == c.data.batch_in_flight
    assert list(c.data.batches) == [batch.batch_id]
    done = p.StepDone(rank=0, step=1, policy_version=0, batch_id=batch.batch_id, metrics={})
    c.handle(ident(0), done)
    assert (c.step, c.policy_version, c.batch_in_flight) == (1, 0, None)
    assert (c.data.step, c.data.policy_version, c.data.batches) == (1, 0, {})


def test_a_state_whose_step_disagrees_with_its_data_is_refused(clock):
    _, saved = saved_after_two_steps(clock)
    state = dict(saved, step=5)
    with pytest.raises(ValueError, match="disagrees"):
        coordinator(Clock(), Saves()).load_state_dict(state, source="step-00000002")
