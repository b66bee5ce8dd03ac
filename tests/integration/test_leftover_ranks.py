"""The runs_dir fixture's clean-up (tests/conftest.py): a process that names a folder
under a test's runs folder is killed when the test ends; others are left alone."""

import subprocess
import sys

from tests.conftest import kill_leftover_ranks


def test_leftover_ranks_of_a_runs_folder_are_killed_and_nothing_else(tmp_path):
    runs = tmp_path / "runs"
    sleeper = "import time; time.sleep(300)"
    inside = subprocess.Popen([sys.executable, "-c", sleeper, str(runs / "r-1" / "submitit")])
    beside = subprocess.Popen([sys.executable, "-c", sleeper, str(tmp_path / "runs-other" / "x")])
    try:
        killed = kill_leftover_ranks(runs)
        assert killed == [inside.pid]
        assert inside.wait(timeout=30) == -9
        assert beside.poll() is None
    finally:
        inside.kill()
        beside.kill()
        inside.wait(timeout=30)
        beside.wait(timeout=30)
