"""Rank start-up decisions."""

import socket

from runtime.entry import control_endpoint


def test_control_endpoint_is_loopback_locally_and_reachable_on_slurm():
    assert control_endpoint({}) == ("127.0.0.1", "127.0.0.1")
    assert control_endpoint({"SLURM_JOB_ID": "1", "SUBMITIT_EXECUTOR": "local"})[0] == "127.0.0.1"
    assert control_endpoint({"SLURM_JOB_ID": "7"}) == ("0.0.0.0", socket.gethostname())
    assert control_endpoint({"REFLOW_BIND_HOST": "10.0.0.5"}) == ("10.0.0.5", "10.0.0.5")


def test_the_cli_does_not_import_torch():
    """`reflow status` & co. stay quick: torch loads only in ranks that need it."""
    import subprocess
    import sys

    code = "import sys, reflow_cli.main; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
