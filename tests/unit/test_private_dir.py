"""The rollout ranks' weights folder in /dev/shm has a predictable name
(reflow-<run>-rank<k>): it is made fresh, 0700, by us, or the rank fails."""

from __future__ import annotations

import os
import stat

import pytest

from runtime.store.run_dir import UnsafeDirError, fresh_private_dir

pytestmark = pytest.mark.unit


def test_a_new_folder_is_private_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        path = fresh_private_dir(tmp_path / "reflow-run-rank1")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


def test_our_own_leftover_is_replaced_by_an_empty_folder(tmp_path):
    path = tmp_path / "reflow-run-rank1"
    path.mkdir(mode=0o755)
    (path / "v3").mkdir()
    (path / "v3" / "model.safetensors").write_bytes(b"old")
    fresh_private_dir(path)
    assert list(path.iterdir()) == [] and stat.S_IMODE(path.stat().st_mode) == 0o700


def test_a_link_planted_at_the_name_is_refused_and_its_target_untouched(tmp_path):
    target = tmp_path / "victim"
    target.mkdir()
    (target / "keep").write_text("x")
    path = tmp_path / "reflow-run-rank1"
    path.symlink_to(target)
    with pytest.raises(UnsafeDirError, match="not a folder of ours"):
        fresh_private_dir(path)
    assert (target / "keep").read_text() == "x" and path.is_symlink()


def test_a_file_at_the_name_is_refused(tmp_path):
    path = tmp_path / "reflow-run-rank1"
    path.write_text("x")
    with pytest.raises(UnsafeDirError):
        fresh_private_dir(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder of another user's")
def test_another_users_folder_is_refused(tmp_path):
    path = tmp_path / "reflow-run-rank1"
    path.mkdir()
    os.chown(path, 65534, 65534)
    with pytest.raises(UnsafeDirError):
        fresh_private_dir(path)
    assert path.is_dir()
