"""Checkpoint folders: written atomically, verified before use, the last K kept.

::

    checkpoints/
        step-00000010/
            trainer/              the trainer ranks' part (torch.distributed.checkpoint):
                .metadata         DCP's index of every tensor's shards
                __<r>_0.distcp    trainer rank r's shards of the model and AdamW state
                extra.pt          step, policy version, torch and Python RNG (group rank 0)
            coordinator.msgpack   rank 0's buffer, request queue, data cursor and counters
            manifest.json         step, policy version, sha256 and size of every file, HMAC
        .step-00000012.tmp/       being written; never read, replaced on the next attempt

A checkpoint is taken at a step boundary: the trainer ranks write ``trainer/`` into the
staging folder together (:mod:`runtime.engines.torch.sharded_state`), then rank 0 adds its
own file and the manifest and renames the folder, so a folder named ``step-*`` is
complete. A crash mid-write leaves only a ``.tmp`` folder; a truncated or altered file
fails its checksum and the previous checkpoint is used. The manifest lists every file of
the folder, ``trainer/`` included, by its path relative to the folder; a file that is not
listed is refused as well, so nothing can be slipped in next to sealed shards.

The manifest carries an HMAC-SHA256 under a key derived from the run's ``keys/``
(:func:`runtime.transport.auth.checkpoint_key`): ``checkpoints/`` is always
``<run>/checkpoints``, so sealing and verifying find the key themselves and no caller can
leave it out. A folder re-sealed by someone without the run's secret key, or copied from
another run, is refused like a corrupt one. ``extra.pt`` is read with
``torch.load(weights_only=True)`` as well (:func:`load_trainer_state`), and the DCP files
through allow-lists (:mod:`runtime.engines.torch.sharded_state`): a MAC says who sealed a
folder, not that it holds no code.

Folders of the format before sharded checkpoints (one ``trainer.pt`` by the trainer
leader) are refused with a line that says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import msgpack

from runtime.store.run_dir import RunPaths
from runtime.transport.auth import KeyFileError, checkpoint_key

MANIFEST = "manifest.json"
TRAINER_DIR = "trainer"  # the trainer ranks' DCP folder
DCP_METADATA = ".metadata"  # DCP's index file, in TRAINER_DIR
EXTRA_FILE = "extra.pt"  # step, version, RNG: in TRAINER_DIR
COORDINATOR_FILE = "coordinator.msgpack"
# Files a complete checkpoint has, as manifest keys (relative POSIX paths).
TRAINER_REQUIRED = (f"{TRAINER_DIR}/{DCP_METADATA}", f"{TRAINER_DIR}/{EXTRA_FILE}")
REQUIRED = (*TRAINER_REQUIRED, COORDINATOR_FILE)
# The trainer file of the format before sharded checkpoints: only recognised, to refuse.
LEGACY_TRAINER_FILE = "trainer.pt"
_NAME = re.compile(r"^step-(\d{8})$")
MAC_FIELD = "hmac"


class CheckpointError(ValueError):
    """A checkpoint folder that is incomplete, corrupt or unreadable."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    policy_version: int

    @property
    def name(self) -> str:
        return self.path.name


def folder_name(step: int) -> str:
    return f"step-{step:08d}"


def trainer_dir(folder: Path) -> Path:
    """The trainer ranks' DCP folder of a staging or checkpoint folder."""
    return folder / TRAINER_DIR


def staging_dir(root: Path, step: int) -> Path:
    """The folder the files of step ``step`` are written into before the rename."""
    return root / f".{folder_name(step)}.tmp"


def start(root: Path, step: int) -> Path:
    """A fresh, empty staging folder for ``step`` (a left-over one is discarded)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = staging_dir(root, step)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def run_key(root: Path) -> bytes:
    """The checkpoint key of the run whose checkpoints folder is ``root``."""
    keys = RunPaths(root.parent).keys
    try:
        return checkpoint_key(keys)
    except KeyFileError as exc:
        raise CheckpointError(
            f"{root}: no key to seal or verify checkpoints with ({exc})"
        ) from None


def _mac(key: bytes, manifest: dict[str, Any]) -> str:
    """The manifest's HMAC, over a canonical JSON of every field but the MAC itself (so a
    reader computes it from the parsed file, whatever the file's whitespace)."""
    body = {k: v for k, v in manifest.items() if k != MAC_FIELD}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hmac.new(key, canonical.encode(), hashlib.sha256).hexdigest()


def finish(root: Path, step: int, policy_version: int, keep: int) -> CheckpointInfo:
    """Checksum the staged files, write the signed manifest, rename into place, prune."""
    return _finish(root, step, policy_version, keep, run_key(root))


def _finish(root: Path, step: int, policy_version: int, keep: int, key: bytes) -> CheckpointInfo:
    staging = staging_dir(root, step)
    missing = [name for name in REQUIRED if not (staging / name).is_file()]
    if missing:
        raise CheckpointError(f"{staging}: missing {', '.join(missing)}")
    files = {}
    for name in _listing(staging):
        if name == MANIFEST:
            continue
        f = staging / name
        _fsync(f)
        files[name] = {"sha256": _sha256(f), "bytes": f.stat().st_size}
    for d in sorted({(staging / n).parent for n in files} - {staging}):
        _fsync(d)  # the entries of trainer/ must be durable before the rename publishes them
    manifest = {
        "step": step,
        "policy_version": policy_version,
        "created_at": time.time(),
        "files": files,
    }
    manifest[MAC_FIELD] = _mac(key, manifest)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(staging / MANIFEST)
    final = root / folder_name(step)
    if final.exists():  # the same step reached again after a resume: the new one wins
        shutil.rmtree(final)
    os.rename(staging, final)
    _fsync(root)
    prune(root, keep)
    return CheckpointInfo(final, step, policy_version)


def _listing(folder: Path) -> list[str]:
    """Every file under ``folder`` as a relative POSIX path, sorted. Anything that is not a
    plain file or folder (a symlink: it could point anywhere) is an error, not skipped."""
    out = []
    for p in sorted(folder.rglob("*")):
        if p.is_symlink() or not (p.is_file() or p.is_dir()):
            raise CheckpointError(
                f"{folder.name}/{p.relative_to(folder).as_posix()}: not a plain file"
            )
        if p.is_file():
            out.append(p.relative_to(folder).as_posix())
    return out


def _safe_name(name: Any) -> bool:
    """A manifest key that names a file inside the folder: relative, normalised, no
    ``..``. The manifest is checked only after its MAC, but it is also the list of paths
    opened here, so it is held to the shape _finish writes."""
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return False
    path = PurePosixPath(name)
    return (
        not path.is_absolute()
        and path.as_posix() == name
        and all(part not in ("", ".", "..") for part in path.parts)
    )


def _refuse_legacy(path: Path) -> None:
    if (path / LEGACY_TRAINER_FILE).is_file() and not (path / TRAINER_DIR).is_dir():
        raise CheckpointError(
            f"{path.name}: from an older ReFlow (one {LEGACY_TRAINER_FILE}, the format before "
            f"sharded checkpoints); this version reads only {TRAINER_DIR}/ folders"
        )


def prune(root: Path, keep: int) -> None:
    """Keep the newest ``keep`` complete checkpoints (by step)."""
    done = sorted(_folders(root), key=lambda x: x[0])
    for _, path in done[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)


def _folders(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    out = []
    for d in root.iterdir():
        m = _NAME.match(d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d))
    return out


def verify(path: Path) -> CheckpointInfo:
    """The checkpoint in ``path`` if its manifest is signed with the run's key and every
    file is there with its recorded checksum."""
    return _verify(path, run_key(path.parent))


def _verify(path: Path, key: bytes) -> CheckpointInfo:
    _refuse_legacy(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        mac = manifest.get(MAC_FIELD)
        files = manifest["files"]
        step, version = int(manifest["step"]), int(manifest["policy_version"])
        expected = _mac(key, manifest)
    except FileNotFoundError:
        raise CheckpointError(f"{path.name}: no {MANIFEST}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{path.name}/{MANIFEST}: unreadable ({exc})") from None
    # Before anything else is believed: the checksums below only say the files match the
    # manifest, which anyone who can write the folder can recompute.
    if not isinstance(mac, str) or not hmac.compare_digest(mac.encode(), expected.encode()):
        why = "no HMAC" if mac is None else "HMAC mismatch"
        raise CheckpointError(
            f"{path.name}/{MANIFEST}: not sealed with this run's key ({why}: re-sealed, "
            "from another run, or written before checkpoints were signed)"
        )
    m = _NAME.match(path.name)
    if m is None or int(m.group(1)) != step:
        # a signed folder renamed to pass for another step (e.g. a newer one)
        raise CheckpointError(f"{path.name}: the manifest is for step {step}")
    if not isinstance(files, dict):
        raise CheckpointError(f"{path.name}/{MANIFEST}: unreadable (files is not an object)")
    for name in files:
        if not _safe_name(name) or name == MANIFEST:
            raise CheckpointError(
                f"{path.name}/{MANIFEST}: lists {name!r}, not a file of the folder"
            )
    for name in REQUIRED:
        if name not in files:
            raise CheckpointError(f"{path.name}: {MANIFEST} does not list {name}")
    for name, meta in files.items():
        f = path / name
        if not f.is_file() or f.is_symlink():
            raise CheckpointError(f"{path.name}/{name}: missing")
        try:
            recorded_size, recorded_sha = int(meta["bytes"]), str(meta["sha256"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path.name}/{MANIFEST}: unreadable entry for {name}") from None
        size = f.stat().st_size
        if size != recorded_size:
            raise CheckpointError(
                f"{path.name}/{name}: {size} bytes, the manifest says {recorded_size} (truncated?)"
            )
        if _sha256(f) != recorded_sha:
            raise CheckpointError(f"{path.name}/{name}: checksum mismatch (corrupt)")
    # Last: a file the sealer never saw (e.g. a shard added to trainer/, which DCP would
    # not read but a later tool might) means the folder is not what was sealed.
    extra = sorted(set(_listing(path)) - set(files) - {MANIFEST})
    if extra:
        raise CheckpointError(f"{path.name}/{extra[0]}: not in {MANIFEST} (added after sealing)")
    return CheckpointInfo(path, step, version)


def latest_valid(root: Path) -> tuple[CheckpointInfo | None, list[str]]:
    """The newest checkpoint that verifies, and one line per newer one that did not."""
    folders = sorted(_folders(root), key=lambda x: -x[0])
    if not folders:
        return None, []
    try:
        key = run_key(root)
    except CheckpointError as exc:  # none can be verified: all refused, for this one reason
        return None, [str(exc)]
    rejected: list[str] = []
    for _, path in folders:
        try:
            return _verify(path, key), rejected
        except CheckpointError as exc:
            rejected.append(str(exc))
    return None, rejected


def find(root: Path, name: str) -> CheckpointInfo:
    """A named checkpoint folder (as published in control.json), verified."""
    if not _NAME.match(name):
        raise CheckpointError(f"{name!r} is not a checkpoint folder name")
    return verify(root / name)


def coordinator_writer(root: Path, keep: int) -> Callable[[int, int, dict[str, Any]], str]:
    """The coordinator's ``save_checkpoint``: its state next to the trainer's, then seal.
    The run's key is read now, so a run without one fails at start, not at its first save."""
    key = run_key(root)

    def save(step: int, policy_version: int, state: dict[str, Any]) -> str:
        staging = staging_dir(root, step)
        for name in TRAINER_REQUIRED:
            if not (staging / name).is_file():
                raise CheckpointError(f"{staging}: the trainer's {name} is missing")
        (staging / COORDINATOR_FILE).write_bytes(msgpack.packb(state, use_bin_type=True))
        return str(_finish(root, step, policy_version, keep, key).path)

    return save


def read_coordinator_state(info: CheckpointInfo) -> dict[str, Any]:
    try:
        return msgpack.unpackb((info.path / COORDINATOR_FILE).read_bytes(), raw=False)
    except Exception as exc:  # verified by checksum, so only a format change gets here
        raise CheckpointError(f"{info.name}/{COORDINATOR_FILE}: unreadable ({exc})") from None


def load_trainer_state(path: Path) -> dict[str, Any]:
    """A trainer's ``trainer/extra.pt`` (or any such file): tensors and plain Python values
    only.

    ``weights_only=True`` refuses any pickled global outside torch's allow-list (tensors,
    containers, numbers, strings) instead of calling it, so a file that would run code on
    load is an error here whoever sealed its folder. Everything the trainers save (state
    dicts, AdamW state, ``torch.get_rng_state()``, ``random.getstate()``) is of those types.
    """
    import pickle

    import torch  # here, not at the top: the CLI imports this module and must stay light

    where = f"{path.parent.name}/{path.name}"
    if path.parent.name == TRAINER_DIR:  # name the checkpoint too: step-00000010/trainer/...
        where = f"{path.parent.parent.name}/{where}"
    try:
        state = torch.load(path, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message is a paragraph; the line naming the refused global is the news
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln), lines[0] if lines else "")
        raise CheckpointError(f"{where}: refused, not plain tensors and values ({why})") from None
    except Exception as exc:  # a truncated or foreign file: same kind of answer
        first = str(exc).strip().splitlines()[:1]
        raise CheckpointError(
            f"{where}: unreadable ({type(exc).__name__}: {''.join(first)})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: refused, not a trainer state ({type(state).__name__})")
    return state
