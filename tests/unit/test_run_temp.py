"""A rank's temporary files and its engines' IPC sockets go into its run folder."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from runtime.store.run_dir import SOCKET_PATH_MAX, RunPaths, keep_temp_files_in

pytestmark = pytest.mark.unit


def test_temp_files_and_sockets_go_into_the_run_folder(monkeypatch):
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # pytest's tmp_path is long
    try:
        env: dict[str, str] = {}
        monkeypatch.setattr(tempfile, "tempdir", None)
        sockets = keep_temp_files_in(RunPaths(short / "run"), 3, env)
        assert sockets == short / "run" / "tmp" / "rank3" and sockets.is_dir()
        assert env == {"TMPDIR": str(sockets), "VLLM_RPC_BASE_PATH": str(sockets)}
        assert oct(sockets.stat().st_mode & 0o777) == "0o700"
    finally:
        shutil.rmtree(short)


def test_a_run_folder_too_deep_for_a_socket_name_gets_a_relative_path(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 60) / ("e" * 40)
    deep.parent.mkdir(parents=True)
    monkeypatch.chdir(deep.parent)
    env: dict[str, str] = {}
    sockets = keep_temp_files_in(RunPaths(deep), 0, env)
    assert len(str(deep / "tmp" / "rank0")) + 37 > SOCKET_PATH_MAX  # too long as it is
    assert (
        not sockets.is_absolute()
        and (deep.parent / sockets).resolve() == (deep / "tmp" / "rank0").resolve()
    )
    assert env["TMPDIR"] == str(deep / "tmp" / "rank0")  # files can take the long path
    # the name vLLM makes fits a Unix socket
    assert len(f"{env['VLLM_RPC_BASE_PATH']}/{'0' * 36}") <= SOCKET_PATH_MAX


def test_with_no_short_path_the_sockets_get_a_private_temp_folder(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 80) / ("e" * 80)
    deep.mkdir(parents=True)
    monkeypatch.chdir("/")
    short = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # pytest's tmp_path is long
    monkeypatch.setattr(tempfile, "tempdir", str(short))  # where mkdtemp makes it
    sockets = keep_temp_files_in(RunPaths(deep), 1, {})
    try:
        assert sockets.is_absolute() and sockets.parent == short
        assert sockets.name.startswith("reflow-r1-") and os.access(sockets, os.W_OK)
        assert oct(sockets.stat().st_mode & 0o777) == "0o700"
    finally:
        shutil.rmtree(short)
    assert Path(deep / "tmp" / "rank1").is_dir()


def test_an_inherited_long_tmpdir_does_not_make_the_socket_fallback_too_long(tmp_path, monkeypatch):
    # A restarted run's ranks are started by a rank whose TMPDIR is its own tmp/rank<K>/
    # in a deep run folder: the fallback folder must not go under that (vLLM's sockets
    # there were too long: "ipc path ... is longer than 107 characters").
    deep = tmp_path / ("d" * 80) / ("e" * 80)
    deep.mkdir(parents=True)
    monkeypatch.chdir("/")
    monkeypatch.setattr(tempfile, "tempdir", str(deep / "tmp" / "rank0"))
    sockets = keep_temp_files_in(RunPaths(deep), 3, {})
    try:
        assert sockets.parent == Path("/tmp") and sockets.name.startswith("reflow-r3-")
        assert len(f"{sockets}/{'0' * 36}") <= SOCKET_PATH_MAX
    finally:
        sockets.rmdir()
