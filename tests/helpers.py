"""What tests share: the repository's paths, the real CLI in a subprocess, status polling.

Fixtures and the tier markers stay in ``conftest.py``; everything a test imports by name
lives here.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Small slices of public datasets, shipped in the repository (recipes/data/SOURCES.md):
# the CPU recipes and most data tests read these, so a fresh clone needs nothing else.
DATA_SLICES = REPO / "recipes" / "data"
# The full public datasets live next to the repository, never in it; tests that need a
# dataset that is not sliced, or every record of a full file, skip without them.
SHARED_DATA = REPO.parent / "shared" / "data"


def needs_full_data(what: str) -> pytest.MarkDecorator:
    """Skip unless ../shared/data is there, saying what the test needs from it."""
    return pytest.mark.skipif(
        not SHARED_DATA.is_dir(),
        reason=f"{SHARED_DATA} is absent and this test needs {what}; recipes/data ships "
        "only the slices listed in recipes/data/SOURCES.md",
    )


def reflow(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess (the environment, REFLOW_RUNS_DIR included, passes)."""
    done = subprocess.run(
        [sys.executable, "-m", "reflow_cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"reflow {' '.join(args)} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
        )
    return done


def launch_demo(name: str, settings: Iterable[str], runs_dir: Path) -> tuple[Path, str]:
    """``reflow launch`` the demo recipe locally as ``name`` with ``--set`` ``settings``
    (returns once the ranks are up); the run's folder and name."""
    args = ["launch", str(REPO / "recipes" / "demo.yaml"), "--local", "--name", name]
    for s in settings:
        args += ["--set", s]
    reflow(*args, check=True, timeout=900)
    run_dir = next(runs_dir.iterdir())
    return run_dir, run_dir.name


def launch_recipe_text(tmp_path: Path, text: str, runs_dir: Path) -> tuple[Path, str]:
    """Write a recipe, ``reflow launch`` it locally (returns once the ranks are up); the
    run's folder and name."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    reflow("launch", str(recipe), "--local", check=True)
    run_dir = next(runs_dir.iterdir())
    return run_dir, run_dir.name


def status_json(run: str) -> dict:
    return json.loads(reflow("status", run, "--json", check=True).stdout)


def wait_for_status(run: str, predicate, timeout: float = 120) -> dict:
    """Poll ``reflow status --json`` until ``predicate`` holds (generous: VMs are slow)."""
    deadline = time.monotonic() + timeout
    while True:
        s = status_json(run)
        if predicate(s):
            return s
        assert time.monotonic() < deadline, f"timed out; last status {s}"
        time.sleep(0.25)


def running(s: dict) -> dict:
    """``s`` (a status) of a run still RUNNING; else the test fails saying where it was."""
    assert s["state"] == "RUNNING", (
        f"the run is {s['state']} at step {s.get('step')} before the test's next action "
        f"({s.get('reason') or 'no reason given'})"
    )
    return s


def reached(step: int):
    """A status predicate: the run is RUNNING at ``step`` or later, or it has ended (which
    :func:`running` then reports). A restart's STARTING (its ranks registering) is on the
    way, not an end."""
    return lambda s: (
        (s["state"] == "RUNNING" and s["step"] >= step)
        or s["state"]
        in (
            "COMPLETED",
            "FAILED",
            "STOPPED",
        )
    )


def switched_to(rollout_gpus: int):
    """A status predicate: the switch to ``rollout_gpus`` rollout GPUs is done (or the run
    is no longer RUNNING, which :func:`running` then reports)."""
    return lambda s: (
        s["state"] != "RUNNING"
        or (s["layout"]["rollout_gpus"] == rollout_gpus and not s["layout"]["switching"])
    )


def load_script(name: str):
    """A file of scripts/ as a module (scripts are run by path, not imported by package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def descendants(pid: int) -> list[int]:
    """The processes ``pid`` started, their children, and so on (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def join_all(procs: list, timeout_s: float) -> list[int | None]:
    """Wait up to ``timeout_s`` for each process (multiprocessing), kill those still
    running, and return their exit codes in order (None: it was still running)."""
    for proc in procs:
        proc.join(timeout_s)
    codes = [proc.exitcode for proc in procs]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    return codes


def save_tiny_model(path: Path) -> str:
    """The embedded tiny Qwen3 (seed 5) saved at ``path``, as the trainer tests load it."""
    from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained

    return str(save_pretrained(build_model(seed=5), build_tokenizer(), path))


def lower_priority(pid: int) -> None:
    """Nice 19 for every thread of ``pid`` and of its child processes (nice is per thread).
    At nice 10 a restarted trainer rank still took 7 min to import vLLM beside the run's
    ten busy engine and trainer threads (2026-12-03): weight 110 each against its 1024."""
    for p in (pid, *descendants(pid)):
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):  # the thread ended meanwhile
                os.setpriority(os.PRIO_PROCESS, int(task.name), 19)
