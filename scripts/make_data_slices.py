"""Re-make the dataset slices shipped in ``recipes/data`` from the full public data.

The CPU recipes (``recipes/*_cpu.yaml``) and the tests read these slices, so a fresh clone
runs without ``../shared/data``. Each slice is the first N lines of the full file, byte for
byte (a whole file is copied as it is), so anyone with the full data gets the same bytes:

    .venv/bin/python scripts/make_data_slices.py            # write recipes/data
    .venv/bin/python scripts/make_data_slices.py --check    # compare, write nothing

It writes the data files and ``recipes/data/SHA256SUMS`` (``sha256sum -c`` reads it) and
prints the table of ``recipes/data/SOURCES.md``; provenance and licences are written by
hand there, and the LICENSE files beside the data are the upstream ones.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "data"
TARGET = REPO / "recipes" / "data"
SUMS = "SHA256SUMS"

# (file, under both roots; first N lines, or None for the whole file)
SLICES: list[tuple[str, int | None]] = [
    ("gsm8k/train.jsonl", 300),
    ("gsm8k/test.jsonl", 300),
    ("mbpp/mbpp.jsonl", 300),
    ("humaneval/HumanEval.jsonl.gz", None),
]
# Files taken from a public repository snapshot, not from ../shared/data (SOURCES.md says
# from which commit and how): this script does not make them, only lists their checksums.
FETCHED: list[str] = [
    "leetcode/LeetCodeDataset-v0.2.0-test.jsonl.gz",
    "leetcode/LeetCodeDataset-v0.1.0-train-nodes.jsonl.gz",
    "kodcode/KodCode-prefill-demo-first27.jsonl.gz",
]


def slice_bytes(source: Path, lines: int | None) -> bytes:
    """The first ``lines`` lines of ``source`` (each with its newline), or all of it."""
    data = source.read_bytes()
    if lines is None:
        return data
    kept = data.splitlines(keepends=True)[:lines]
    if len(kept) < lines:
        raise SystemExit(f"{source}: has {len(kept)} lines, the slice needs {lines}")
    return b"".join(kept)


def records(data: bytes, name: str) -> int:
    if name.endswith(".gz"):
        data = gzip.decompress(data)
    return sum(1 for line in data.splitlines() if line.strip())


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, default=SOURCE, help="the full data (%(default)s)")
    ap.add_argument("--target", type=Path, default=TARGET, help="where slices go (%(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with the target, write nothing")
    args = ap.parse_args(argv)
    if not args.source.is_dir():
        print(f"{args.source}: no such folder (the full public data)", file=sys.stderr)
        return 2
    made = {name: slice_bytes(args.source / name, lines) for name, lines in SLICES}
    fetched = {name: _read(args.target / name) or b"" for name in FETCHED}
    sums = "".join(f"{sha256(data)}  {name}\n" for name, data in {**made, **fetched}.items())
    if args.check:
        stale = [n for n, d in made.items() if _read(args.target / n) != d]
        if _read(args.target / SUMS) != sums.encode():
            stale.append(SUMS)
        for name in stale:
            print(f"{args.target / name}: differs from the slice made from {args.source}")
        return 1 if stale else 0
    for name, data in made.items():
        out = args.target / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
    (args.target / SUMS).write_text(sums)
    print("| file | records | bytes | sha256 |\n|---|---|---|---|")
    for name, data in {**made, **fetched}.items():
        print(f"| {name} | {records(data, name)} | {len(data)} | {sha256(data)} |")
    return 0


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


if __name__ == "__main__":
    sys.exit(main())
