"""Checkpoint folders: written atomically, verified before use, the last K kept.

::

    checkpoints/
        step-00000010/
            trainer.pt            the trainer leader's model, optimizer, RNG, step, version
            coordinator.msgpack   rank 0's buffer, request queue, data cursor and counters
            manifest.json         step, policy version, sha256 and size of every file
        .step-00000012.tmp/       being written; never read, replaced on the next attempt

A checkpoint is taken at a step boundary: the trainer leader writes its file into the
staging folder, then rank 0 adds its own and the manifest and renames the folder, so a
folder named ``step-*`` is complete. A crash mid-write leaves only a ``.tmp`` folder; a
truncated or altered file fails its checksum and the previous checkpoint is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

MANIFEST = "manifest.json"
TRAINER_FILE = "trainer.pt"
COORDINATOR_FILE = "coordinator.msgpack"
REQUIRED = (TRAINER_FILE, COORDINATOR_FILE)
_NAME = re.compile(r"^step-(\d{8})$")


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


def finish(root: Path, step: int, policy_version: int, keep: int) -> CheckpointInfo:
    """Checksum the staged files, write the manifest, rename into place, prune old ones."""
    staging = staging_dir(root, step)
    missing = [name for name in REQUIRED if not (staging / name).is_file()]
    if missing:
        raise CheckpointError(f"{staging}: missing {', '.join(missing)}")
    files = {}
    for f in sorted(staging.iterdir()):
        if f.name == MANIFEST:
            continue
        _fsync(f)
        files[f.name] = {"sha256": _sha256(f), "bytes": f.stat().st_size}
    manifest = {
        "step": step,
        "policy_version": policy_version,
        "created_at": time.time(),
        "files": files,
    }
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _fsync(staging / MANIFEST)
    final = root / folder_name(step)
    if final.exists():  # the same step reached again after a resume: the new one wins
        shutil.rmtree(final)
    os.rename(staging, final)
    _fsync(root)
    prune(root, keep)
    return CheckpointInfo(final, step, policy_version)


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
    """The checkpoint in ``path`` if every file is there with its recorded checksum."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        files = manifest["files"]
        step, version = int(manifest["step"]), int(manifest["policy_version"])
    except FileNotFoundError:
        raise CheckpointError(f"{path.name}: no {MANIFEST}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path.name}/{MANIFEST}: unreadable ({exc})") from None
    for name in REQUIRED:
        if name not in files:
            raise CheckpointError(f"{path.name}: {MANIFEST} does not list {name}")
    for name, meta in files.items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"{path.name}/{name}: missing")
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise CheckpointError(
                f"{path.name}/{name}: {size} bytes, the manifest says {meta['bytes']} (truncated?)"
            )
        if _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{path.name}/{name}: checksum mismatch (corrupt)")
    return CheckpointInfo(path, step, version)


def latest_valid(root: Path) -> tuple[CheckpointInfo | None, list[str]]:
    """The newest checkpoint that verifies, and one line per newer one that did not."""
    rejected: list[str] = []
    for _, path in sorted(_folders(root), key=lambda x: -x[0]):
        try:
            return verify(path), rejected
        except CheckpointError as exc:
            rejected.append(str(exc))
    return None, rejected


def find(root: Path, name: str) -> CheckpointInfo:
    """A named checkpoint folder (as published in control.json), verified."""
    if not _NAME.match(name):
        raise CheckpointError(f"{name!r} is not a checkpoint folder name")
    return verify(root / name)


def coordinator_writer(root: Path, keep: int):
    """The coordinator's ``save_checkpoint``: its state next to the trainer's, then seal."""

    def save(step: int, policy_version: int, state: dict[str, Any]) -> str:
        staging = staging_dir(root, step)
        if not (staging / TRAINER_FILE).is_file():
            raise CheckpointError(f"{staging}: the trainer's {TRAINER_FILE} is missing")
        (staging / COORDINATOR_FILE).write_bytes(msgpack.packb(state, use_bin_type=True))
        return str(finish(root, step, policy_version, keep).path)

    return save


def read_coordinator_state(info: CheckpointInfo) -> dict[str, Any]:
    try:
        return msgpack.unpackb((info.path / COORDINATOR_FILE).read_bytes(), raw=False)
    except Exception as exc:  # verified by checksum, so only a format change gets here
        raise CheckpointError(f"{info.name}/{COORDINATOR_FILE}: unreadable ({exc})") from None
