"""The trainer's part of a checkpoint, written and read with torch.distributed.checkpoint.

::

    <checkpoint>/trainer/
        .metadata          DCP's index: every tensor's global shape, dtype and where its
                           chunks are (file, offset, length)
        __<r>_0.distcp     trainer rank r's shards (model, AdamW state)
        extra.pt           step, policy version, RNG states: written by the group's rank 0

:func:`save_sharded` is a collective over the trainer ranks: each writes its own shards,
in parallel, and DCP writes a replicated tensor (a plain ``nn.Module`` on every rank, the
"replicate" dimension of an HSDP mesh) once, not once per rank. :func:`load_sharded`
reads into a model already built and sharded for the loading world, which may have
another number of ranks: DCP reads each rank's slice of the global tensors from whatever
chunks hold it. :func:`export_hf` needs no process group: it reads one full tensor at a
time and streams it into a single ``model.safetensors``.

Loading runs no code from the folder: DCP itself unpickles ``.metadata`` with plain
``pickle`` and its non-tensor entries (AdamW's ``param_groups``) with
``torch.load(weights_only=False)``; here the first goes through an allow-list of DCP's own
metadata types and the second through ``weights_only=True``, as ``extra.pt`` does
(:func:`runtime.store.checkpoint.load_trainer_state`). A checkpoint's HMAC says who sealed
it, not that it holds no code.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from runtime.store.checkpoint import (
    DCP_METADATA,
    EXTRA_FILE,
    CheckpointError,
    load_trainer_state,
)

# The wrapper keys of the state dict handed to DCP: FQNs in the checkpoint read
# "model.<module fqn>" and "optim.state.<fqn>.exp_avg", ...
MODEL_KEY = "model"
OPTIM_KEY = "optim"

# Module-path segments that wrappers add and Hugging Face names do not have. get_state_dict
# already strips them; a checkpoint written from a plain ``model.state_dict()`` of a wrapped
# model would still carry them.
_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")

# safetensors' dtype names (https://github.com/huggingface/safetensors, format spec).
SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def _where(folder: Path) -> str:
    """How errors name a trainer folder: ``step-00000010/trainer``."""
    return f"{folder.parent.name}/{folder.name}"


def _group_rank(process_group: dist.ProcessGroup | None) -> int:
    """This process's rank in ``process_group``; 0 where there is no process group at all
    (one process, e.g. a single trainer or the synthetic engine)."""
    if not (dist.is_available() and dist.is_initialized()):
        if process_group is not None:
            raise ValueError("a process_group was given but torch.distributed is not initialized")
        return 0
    rank = dist.get_rank(process_group)
    if rank < 0:
        raise ValueError("this rank is not a member of the trainer process group")
    return rank


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every call without a process group that it assumes one process: that
    is what is meant here (one trainer, the synthetic engine, export), once per tensor."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


# --- save ------------------------------------------------------------------------------


def save_sharded(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    process_group: dist.ProcessGroup | None = None,
) -> None:
    """Write ``model`` and ``optimizer`` into ``folder`` with DCP, each rank its own shards.

    A collective over ``process_group`` (None: the default group; no group at all when
    torch.distributed is not initialized): every trainer rank calls it. The group's rank 0
    also writes ``extra`` (plain values and tensors: step, version, RNG states) to
    ``extra.pt``. Every rank raises if any rank failed, so none is left waiting.

    The model may be ``fully_shard``'ed (DTensor parameters) or plain (the same whole
    module on every rank): DCP's save planner keeps one copy of a tensor that several
    ranks hold at the same offsets, so a replicated model is written once.
    """
    rank = _group_rank(process_group)
    folder.mkdir(parents=True, exist_ok=True)
    # One save per folder: a file left from another save (another world size writes other
    # shard names) would be checksummed into the manifest as if it belonged. No rank writes
    # before DCP's planning collective, so every rank sees the folder as it was.
    if any(folder.iterdir()):
        raise CheckpointError(f"{_where(folder)}: not empty; a sharded save needs a fresh folder")
    # Checked before any collective: a value torch.load(weights_only=True) would refuse
    # makes a checkpoint that cannot be resumed; better to fail now, on every rank alike.
    payload = _serialise_extra(extra, folder)

    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _quiet_single_process():
        dcp.save(
            {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd},
            checkpoint_id=folder,
            process_group=process_group,
            no_dist=not _distributed(),
        )
    # After DCP (which raises on every rank if any rank failed): rank 0's own write can
    # still fail, and the other ranks must hear of it rather than report success.
    error: str | None = None
    if rank == 0:
        try:
            tmp = folder / f".{EXTRA_FILE}.tmp"
            tmp.write_bytes(payload)
            os.replace(tmp, folder / EXTRA_FILE)
        except OSError as exc:
            error = f"{_where(folder)}/{EXTRA_FILE}: {type(exc).__name__}: {exc}"
    if _distributed():
        verdict = [error]
        dist.broadcast_object_list(verdict, group=process_group, group_src=0)
        error = verdict[0]
    if error is not None:
        raise CheckpointError(error)


def _serialise_extra(extra: dict[str, Any], folder: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(extra, buf)
    try:
        torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln), lines[0] if lines else "")
        raise CheckpointError(
            f"{_where(folder)}/{EXTRA_FILE}: extra holds more than plain tensors and values ({why})"
        ) from None
    return buf.getvalue()


# --- load ------------------------------------------------------------------------------


def load_sharded(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    process_group: dist.ProcessGroup | None = None,
) -> dict[str, Any]:
    """Load ``folder`` into ``model`` and ``optimizer`` (already built, and sharded for this
    world where sharded); return the saved ``extra``.

    A collective over ``process_group`` like :func:`save_sharded`; the saving world may
    have had another number of ranks, or the other strategy (sharded / replicated): DCP
    reads each rank's part of every global tensor from the chunks that hold it.
    """
    _group_rank(process_group)  # a rank outside the group fails here, not in a collective
    # Both read before any collective, by every rank, from the same files: a refusal is
    # raised on all ranks alike, and none waits for the others.
    extra = load_trainer_state(folder / EXTRA_FILE)
    metadata = read_metadata(folder)

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {MODEL_KEY: model_sd, OPTIM_KEY: optim_sd}
    try:
        with _quiet_single_process():
            dcp.load(
                state,
                storage_reader=SafeReader(folder, metadata),
                planner=_SafeLoadPlanner(),
                process_group=process_group,
                no_dist=not _distributed(),
            )
    except CheckpointException as exc:
        raise CheckpointError(
            f"{_where(folder)}: cannot be loaded ({_first_failure(exc)})"
        ) from None
    set_state_dict(
        model, optimizer, model_state_dict=state[MODEL_KEY], optim_state_dict=state[OPTIM_KEY]
    )
    return extra


def _first_failure(exc: CheckpointException) -> str:
    """One line from DCP's per-rank report (a paragraph with a traceback per rank)."""
    failures = getattr(exc, "failures", {}) or {}
    for _, failure in sorted(failures.items()):
        err = failure[0] if isinstance(failure, tuple) else failure
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        if isinstance(err, pickle.UnpicklingError):
            why = next((ln for ln in lines if "GLOBAL" in ln), lines[0] if lines else "")
            return f"refused, not plain tensors and values: {why}"
        return f"{type(err).__name__}: {lines[0] if lines else ''}"
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


class _RefusedGlobal(pickle.UnpicklingError):
    """A global outside the metadata allow-list (not a corrupt file: a refused one)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``: its own dataclasses, torch sizes/dtypes/layouts and
    paths, nothing else (plain ``pickle.load``, which DCP uses, calls any global)."""

    _MODULE_CLASSES = (
        "torch.distributed.checkpoint.metadata",
        "torch.distributed.checkpoint.filesystem",
    )
    _NAMES = {
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # a str -> torch.layout lookup
        ("pathlib", "PosixPath"),
        ("pathlib", "PurePosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib", "PureWindowsPath"),
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if module in self._MODULE_CLASSES:
            found = getattr(sys.modules.get(module), name, None)
            if isinstance(found, type):
                return found
        elif module == "torch" and isinstance(
            getattr(torch, name, None), torch.dtype | torch.memory_format
        ):
            return getattr(torch, name)
        elif (module, name) in self._NAMES:
            return super().find_class(module, name)
        raise _RefusedGlobal(f"GLOBAL {module}.{name} is not a DCP metadata type")


def read_metadata(folder: Path) -> Metadata:
    """DCP's index of ``folder``, unpickled through an allow-list, with every storage
    location checked to be a file of the folder itself."""
    where = f"{_where(folder)}/{DCP_METADATA}"
    import torch.distributed.checkpoint.filesystem  # noqa: F401  (the allow-list's module)

    try:
        with (folder / DCP_METADATA).open("rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
    except FileNotFoundError:
        raise CheckpointError(f"{where}: missing") from None
    except _RefusedGlobal as exc:
        raise CheckpointError(f"{where}: refused ({exc})") from None
    except Exception as exc:  # truncated or foreign
        first = str(exc).strip().splitlines()[:1]
        raise CheckpointError(
            f"{where}: unreadable ({type(exc).__name__}: {''.join(first)})"
        ) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.storage_data, dict):
        raise CheckpointError(f"{where}: not DCP metadata ({type(metadata).__name__})")
    for info in metadata.storage_data.values():
        rel = getattr(info, "relative_path", None)
        # the reader joins this onto the folder: a path out of it would be read as a shard
        if not isinstance(rel, str) or PurePosixPath(rel).name != rel or rel in ("", ".", ".."):
            raise CheckpointError(f"{where}: a shard outside the folder ({rel!r})")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read once, through :func:`read_metadata`."""

    def __init__(self, folder: Path, metadata: Metadata) -> None:
        super().__init__(folder)
        self._metadata = metadata

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:  # rank-local metadata: a format this never writes
            raise CheckpointError(f"{self.path}: rank-local DCP metadata is not supported")
        # what FileSystemReader.read_metadata does to the object it returns
        if getattr(self._metadata, "storage_meta", None) is not None:
            self._metadata.storage_meta.load_id = self.load_id
        return self._metadata


class _SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, with non-tensor entries read ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        # Hand the parent a pickle of the value just checked, which it may load unrestricted
        # (it holds only allow-listed types); placing the value is the parent's business.
        again = io.BytesIO()
        torch.save(obj, again)
        again.seek(0)
        super().load_bytes(read_item, again)


# --- export ----------------------------------------------------------------------------


def hf_name(fqn: str, planner_path: tuple[Any, ...] | None = None) -> str | None:
    """The Hugging Face name of checkpoint entry ``fqn`` if it is a model tensor (else None).

    DCP records the path of every flattened key in the saved state dict (``planner_data``:
    ``("model", "model.layers.0.mlp.up_proj.weight")``), so the wrapper key is stripped
    from that, not guessed from the dots; a checkpoint without it falls back to the prefix.
    """
    if planner_path:
        if len(planner_path) != 2 or planner_path[0] != MODEL_KEY:
            return None
        name = str(planner_path[1])
    elif fqn.startswith(MODEL_KEY + "."):
        name = fqn[len(MODEL_KEY) + 1 :]
    else:
        return None
    return ".".join(part for part in name.split(".") if part not in _WRAPPER_SEGMENTS)


def load_tensor(reader: FileSystemReader, fqn: str, meta: TensorStorageMetadata) -> torch.Tensor:
    """One full tensor of the checkpoint, gathered from its chunks (the only place export
    materialises a tensor: the test counts the calls and the live results)."""
    out = torch.empty(meta.size, dtype=meta.properties.dtype)
    with _quiet_single_process():
        dcp.load({fqn: out}, storage_reader=reader, planner=_SafeLoadPlanner(), no_dist=True)
    return out


def export_hf(folder: Path, out_file: Path, *, tied_lm_head: bool) -> list[str]:
    """Write the model tensors of the DCP checkpoint ``folder`` as one safetensors file.

    No process group: the file is laid out from DCP's metadata alone (header first, with
    every tensor's dtype, shape and byte range), then each tensor is loaded whole, written
    and dropped before the next, so at most one full tensor (plus the chunk being copied
    into it) is in memory. Names are Hugging Face's; ``lm_head.weight`` is left out when
    ``tied_lm_head``, as transformers saves tied embeddings. Returns the names written.
    """
    metadata = read_metadata(folder)
    planner_data = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
    entries: dict[str, tuple[str, TensorStorageMetadata]] = {}
    for fqn, meta in metadata.state_dict_metadata.items():
        name = hf_name(fqn, planner_data.get(fqn))
        if name is None or isinstance(meta, BytesStorageMetadata):
            continue  # optimizer state, or a non-tensor entry of the model
        if tied_lm_head and name == "lm_head.weight":
            continue
        if meta.properties.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{_where(folder)}: {name}: no safetensors dtype for {meta.properties.dtype}"
            )
        if name in entries:
            raise CheckpointError(f"{_where(folder)}: two entries are named {name}")
        entries[name] = (fqn, meta)
    if not entries:
        raise CheckpointError(f"{_where(folder)}: no model tensors (not a trainer checkpoint?)")

    reader = SafeReader(folder, metadata)
    layout = [(name, meta.properties.dtype, list(meta.size)) for name, (_, meta) in entries.items()]
    return stream_safetensors(out_file, layout, lambda name: load_tensor(reader, *entries[name]))


def stream_safetensors(
    out_file: Path,
    layout: list[tuple[str, torch.dtype, list[int]]],
    load: Callable[[str], torch.Tensor],
) -> list[str]:
    """One safetensors file laid out from ``layout`` (name, dtype, shape): the header
    first, then each tensor made by ``load``, checked against its entry, written and
    dropped before the next; atomic (written beside, renamed). Returns the names in file
    order."""
    if sys.byteorder != "little":  # safetensors is little-endian; bytes are written as held
        raise RuntimeError("safetensors are written as native bytes: a little-endian machine")
    # safetensors' own order: larger elements first (keeps every tensor aligned to its
    # element size), then by name.
    order = sorted(layout, key=lambda e: (-e[1].itemsize, e[0]))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in order:
        size = dtype.itemsize * _numel(shape)
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as safetensors pads

    out_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_file.with_name(f".{out_file.name}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(len(blob).to_bytes(8, "little"))
            fh.write(blob)
            for name, dtype, shape in order:
                tensor = load(name)
                if tensor.dtype != dtype or list(tensor.shape) != list(shape):
                    raise RuntimeError(
                        f"{name}: {tensor.dtype} {tuple(tensor.shape)}, "
                        f"laid out as {dtype} {tuple(shape)}"
                    )
                write_tensor(fh, tensor, header[name])
                del tensor
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out_file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return [name for name, _, _ in order]


def write_tensor(fh: io.BufferedWriter, tensor: torch.Tensor, entry: dict[str, Any]) -> None:
    """Its bytes, without a copy (a uint8 view of the contiguous tensor); checked against
    the header's byte range, which was computed from the metadata."""
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy()
    begin, end = entry["data_offsets"]
    if data.nbytes != end - begin:
        raise CheckpointError(f"a tensor is {data.nbytes} bytes, the metadata says {end - begin}")
    fh.write(memoryview(data))


def _numel(size: Any) -> int:
    n = 1
    for d in size:
        n *= int(d)
    return n
