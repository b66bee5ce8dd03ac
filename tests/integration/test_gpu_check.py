"""scripts/gpu-check.sh as a session runs it: its arguments, and a dry run on the CPU
whose JSON has every part the device run fills (the full --dry-run, both tiny models,
is ``bash scripts/gpu-check.sh --dry-run``; this runs the smaller one)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "gpu-check.sh"


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--bogus"], "gpu-check: unknown argument '--bogus' (--help lists them)"),
        (["--total-s", "5"], "gpu-check: --total-s: a whole number of seconds, at least 60"),
        (["--models", "4b;rm"], "gpu-check: --models: a comma-separated list of names"),
        (["--out"], "gpu-check: --out: needs a folder"),
    ],
)
def test_bad_arguments_get_one_line_and_exit_2(args, says):
    r = run(*args, timeout=30)
    assert r.returncode == 2
    assert r.stderr.strip() == says


def test_help_lists_every_option():
    r = run("--help", timeout=30)
    assert r.returncode == 0
    for option in ("--fetch", "--dry-run", "--out", "--models", "--total-s"):
        assert option in r.stdout


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="a GPU runs the gpu tests for real: the counts asserted here are a CPU's",
)
def test_a_dry_run_writes_every_part(tmp_path):
    r = run("--dry-run", "--models", "tiny", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads((tmp_path / "gpu-check.json").read_text())
    assert data["meta"]["dry_run"] is True and data["errors"] == []
    assert data["env"]["device"] == "cpu"
    tests = data["tests"]  # every gpu test collected, each skipped without a GPU
    assert tests["failed"] == 0 and tests["passed"] == 0 and tests["skipped"] >= 10
    tiny = data["models"]["tiny"]
    assert tiny["tokens_per_s"] > 0 and len(tiny["step_s"]) == 3
    assert tiny["plan"]["peak_bytes"] > tiny["plan"]["state_bytes"] > 0
    for switch in (tiny["switch"]["first"], tiny["switch"]["again"]):
        assert switch["regroup_s"] >= 0 and "offload_bytes" in switch
    page = (tmp_path / "summary.txt").read_text()
    assert "tiny (" in page and "gpu tests: 0 passed, 0 failed" in page
    assert page.splitlines()[0] in r.stdout
