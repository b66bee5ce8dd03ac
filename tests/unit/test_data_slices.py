"""The dataset slices shipped in recipes/data: their bytes match SHA256SUMS and SOURCES.md,
the CPU recipes read them, and (with ../shared/data) they are the first lines of the full
files, as scripts/make_data_slices.py makes them."""

from __future__ import annotations

import gzip
import hashlib
import re

import pytest

from runtime.config.recipe import load_recipe
from runtime.data.datasets import check_dataset
from tests.helpers import DATA_SLICES, REPO, SHARED_DATA, load_script, needs_full_data

NOT_DATA = {"SOURCES.md", "SHA256SUMS", "LICENSE"}


def make_slices():
    return load_script("make_data_slices")


def sums() -> dict[str, str]:
    out = {}
    for line in (DATA_SLICES / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        out[name] = digest
    return out


def records(path) -> int:
    data = path.read_bytes()
    if path.suffix == ".gz":
        data = gzip.decompress(data)
    return sum(1 for line in data.splitlines() if line.strip())


def test_every_shipped_file_matches_its_sha256_and_nothing_is_unlisted():
    listed = sums()
    on_disk = {
        str(p.relative_to(DATA_SLICES))
        for p in DATA_SLICES.rglob("*")
        if p.is_file() and p.name not in NOT_DATA
    }
    assert on_disk == set(listed)
    script = make_slices()
    assert set(listed) == {name for name, _ in script.SLICES} | set(script.FETCHED)
    for name, digest in listed.items():
        assert hashlib.sha256((DATA_SLICES / name).read_bytes()).hexdigest() == digest, name


def test_sources_md_gives_records_bytes_and_sha256_of_each_file():
    text = (DATA_SLICES / "SOURCES.md").read_text()
    rows = {
        m["file"]: (int(m["records"]), int(m["bytes"]), m["sha"])
        for m in re.finditer(
            r"^\| (?P<file>\S+) \| (?P<records>\d+) \| (?P<bytes>\d+) \| (?P<sha>[0-9a-f]{64}) \|$",
            text,
            re.M,
        )
    }
    listed = sums()
    assert set(rows) == set(listed)
    for name, (count, size, digest) in rows.items():
        path = DATA_SLICES / name
        assert (count, size, digest) == (records(path), path.stat().st_size, listed[name]), name
    total = sum(p.stat().st_size for p in DATA_SLICES.rglob("*") if p.is_file())
    assert total < 1_000_000  # small slices, not the datasets


def test_each_sliced_dataset_ships_its_licence_notice():
    text = (DATA_SLICES / "SOURCES.md").read_text()
    for mit in ("gsm8k", "humaneval", "leetcode"):  # MIT asks for its notice in every copy
        assert (
            (DATA_SLICES / mit / "LICENSE")
            .read_text()
            .lstrip()
            .startswith(("MIT License", "The MIT License"))
        )
    assert "CC BY 4.0" in text and "creativecommons.org/licenses/by/4.0" in text  # MBPP


@pytest.mark.parametrize(
    ("name", "train", "count"),
    [
        ("dapo_math_cpu", "recipes/data/gsm8k/train.jsonl", 300),
        ("retool_cpu", "recipes/data/gsm8k/train.jsonl", 300),
        ("apps_coding_cpu", "recipes/data/mbpp/mbpp.jsonl", 300),
    ],
)
def test_cpu_recipes_read_the_shipped_slices_from_the_repository_root(
    monkeypatch, name, train, count
):
    cfg = load_recipe(REPO / "recipes" / f"{name}.yaml")
    assert cfg.data.train == train  # relative: reflow runs from the repository root
    monkeypatch.chdir(REPO)
    assert check_dataset(cfg) == count


@needs_full_data("the full files the slices are cut from")
def test_the_slices_are_the_first_lines_of_the_full_files():
    assert make_slices().main(["--source", str(SHARED_DATA), "--check"]) == 0
