"""Prompt datasets from local files: JSON Lines, JSON (one list of records) or Parquet,
each optionally gzip-compressed (``.gz``, JSON formats only); or a folder, as people keep
datasets: one written by Hugging Face ``datasets``' ``save_to_disk`` (a split's folder),
or a folder of Parquet shards.

A recipe names records' fields by their role (``prompt``, ``answer``, ``tests``, ...);
``data.fields`` maps a role to the file's own column when they differ, e.g. GSM8K's
``{prompt: question}``. Every record is checked on load, and a problem is one line naming
the file, the record and the field: a 64-GPU job should not find a missing column after
its engines have started.
"""

from __future__ import annotations

import gzip
import json
import re
import string
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from runtime.config.workload_kinds import KINDS

# What each workload reads from a record (before the mapping).
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {name: k.fields for name, k in KINDS.items()}


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message is one line naming the problem."""


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise DatasetError(f"{path}:{lineno}: a record must be a JSON object")
            yield record


def _read_json(path: Path) -> Iterator[dict[str, Any]]:
    with _open_text(path) as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path}: expected a JSON list of records, got {type(data).__name__}")
    for i, record in enumerate(data):
        if not isinstance(record, dict):
            raise DatasetError(f"{path}: record {i} is not a JSON object")
        yield record


def _read_parquet(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow is a dependency
        raise DatasetError(f"{path}: reading Parquet needs pyarrow") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
    yield from table.to_pylist()


def _read_hf_disk(path: Path) -> Iterator[dict[str, Any]]:
    """A folder written by Hugging Face ``datasets``' ``save_to_disk`` (one split): its
    ``state.json`` lists Arrow stream files, read in order with pyarrow (no ``datasets``
    needed). A whole ``DatasetDict`` is refused with its splits named."""
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        try:
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        except (OSError, ValueError, KeyError, TypeError):
            splits = []
        names = ", ".join(map(str, splits)) or "none listed"
        first = splits[0] if splits else "train"
        raise DatasetError(
            f"{path}: a DatasetDict folder: name one split, e.g. {path / str(first)} "
            f"(splits: {names})"
        )
    try:
        files = [
            f["filename"] for f in json.loads((path / "state.json").read_text())["_data_files"]
        ]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DatasetError(
            f"{path}/state.json: not a datasets.save_to_disk state ({exc})"
        ) from None
    for name in files:
        try:
            with pa.memory_map(str(path / name)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except (OSError, pa.ArrowInvalid) as exc:
            raise DatasetError(f"{path / name}: not a readable Arrow file ({exc})") from None
        yield from table.to_pylist()


def _read_parquet_folder(path: Path) -> Iterator[dict[str, Any]]:
    """A folder of Parquet shards (as the Hub lays a dataset out, ``data/train-00000-of-
    00002.parquet``): every ``.parquet`` file below it, in name order."""
    shards = sorted(path.rglob("*.parquet"))
    if not shards:
        raise DatasetError(f"{path}: no .parquet files in this folder")
    for shard in shards:
        yield from _read_parquet(shard)


READERS: dict[str, Callable[[Path], Iterator[dict[str, Any]]]] = {
    "jsonl": _read_jsonl,
    "json": _read_json,
    "parquet": _read_parquet,
    "hf_disk": _read_hf_disk,
}


def detect_format(path: Path) -> str:
    if path.is_dir():
        if (path / "state.json").is_file() or (path / "dataset_dict.json").is_file():
            return "hf_disk"
        if any(path.rglob("*.parquet")):
            return "parquet"
        raise DatasetError(
            f"{path}: a folder, but neither one written by datasets' save_to_disk "
            "(state.json) nor one of Parquet shards"
        )
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
    ext = suffixes[-1] if suffixes else ""
    fmt = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}.get(ext)
    if fmt is None:
        raise DatasetError(
            f"{path}: cannot tell the format from the name; set data.format to one of: "
            f"{', '.join(READERS)}"
        )
    return fmt


def load_records(
    path: str | Path,
    fmt: str = "auto",
    fields: dict[str, str] | None = None,
    required: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """All records of ``path``, each with its roles under their role names (the original
    fields are kept too). Raises :class:`DatasetError`."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"{path}: no such dataset file or folder")
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt not in READERS:
        raise DatasetError(f"{path}: unknown format {fmt!r} (one of: {', '.join(READERS)})")
    if fmt == "parquet" and path.suffix == ".gz":
        raise DatasetError(f"{path}: Parquet files are compressed inside; do not gzip them")
    folder = path.is_dir()
    # folders: hf_disk or Parquet shards; files: everything but hf_disk
    if (fmt == "hf_disk") != folder and not (folder and fmt == "parquet"):
        raise DatasetError(
            f"{path}: data.format {fmt} does not read a {'folder' if folder else 'file'}"
        )
    reader = _read_parquet_folder if folder and fmt == "parquet" else READERS[fmt]
    mapping = dict(fields or {})
    roles = list(dict.fromkeys([*required, *mapping]))
    out = []
    for i, record in enumerate(reader(path)):
        own = sorted(record)  # the file's fields, before roles are added
        original = dict(record)  # roles read the file's fields, never another role
        for role in roles:
            source = mapping.get(role, role)
            found, value = _lookup(original, source)
            if not found:
                where = f" (data.fields.{role})" if role in mapping else ""
                raise DatasetError(
                    f"{path}: record {i} has no field {source!r}{where}; it has: "
                    f"{', '.join(own) or 'nothing'}"
                )
            record[role] = value
        out.append(record)
    if not out:
        raise DatasetError(f"{path}: no records")
    return out


def _lookup(record: dict[str, Any], source: str) -> tuple[bool, Any]:
    """A field, or a nested one by dotted path (verl's ``reward_model.ground_truth``)."""
    if source in record:
        return True, record[source]
    value: Any = record
    for part in source.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def prompt_text(record: dict[str, Any], template: str) -> str:
    """The first user message: ``template`` filled from the record. A prompt given as chat
    messages (verl's parquet: ``[{"role": "user", "content": ...}]``) counts as its user
    content."""
    prompt = record.get("prompt")
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        record = {
            **record,
            "prompt": "\n".join(
                str(m.get("content", "")) for m in prompt if m.get("role", "user") == "user"
            ),
        }
    return template.format_map(record)


def check_template(template: str, record: dict[str, Any], path: str | Path) -> None:
    """``data.prompt_template`` fills from ``record``, or one line says why not."""
    try:
        names = [
            re.split(r"[.\[]", f, maxsplit=1)[0]  # {tests[0]} needs a field named tests
            for _, f, _, _ in string.Formatter().parse(template)
            if f
        ]
        missing = [n for n in names if n not in record]
        if not missing:
            prompt_text(record, template)
    except (IndexError, KeyError, ValueError, AttributeError, TypeError) as exc:
        raise DatasetError(f"{path}: data.prompt_template cannot be filled ({exc})") from None
    if missing:
        raise DatasetError(
            f"{path}: data.prompt_template uses {{{missing[0]}}}, which records lack"
        )


def check_dataset(
    cfg: Any, check_records: Callable[[list[dict[str, Any]], str], None] | None = None
) -> int | None:
    """Validate ``data.train`` (and ``data.eval``) of a config before a launch; returns the
    number of training records, None for an embedded source. ``check_records``: what the
    workload checks of every file's records besides (the code kinds: that each record's
    tests parse into a form the grader grades, runtime/workloads/rewards/code/spec.py
    ``check_code_tests``); it raises :class:`DatasetError`."""
    d = cfg.data
    required = REQUIRED_FIELDS.get(cfg.workload.kind, ())
    count = None
    files = d.files()
    sources = [("train" if len(files) == 1 else f"train[{i}]", f.path) for i, f in enumerate(files)]
    sources += [(f"eval.{k}", v) for k, v in d.eval.items()]
    for name, source in sources:
        if source.startswith("embedded:"):
            raise DatasetError(f"data.{name}: {source}: an eval set is a file or folder")
        records = load_records(source, d.format, d.fields, required)
        check_template(d.prompt_template, records[0], source)
        if check_records is not None:
            check_records(records, source)
        if name.startswith("train"):
            count = (count or 0) + len(records)
    return count
