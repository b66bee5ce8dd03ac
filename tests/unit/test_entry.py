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


LOCAL_JOB = {
    "SUBMITIT_EXECUTOR": "local",
    "SUBMITIT_LOCAL_JOB_ID": "4242",
    "SUBMITIT_LOCAL_NTASKS": "2",
    "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
    "SUBMITIT_LOCAL_NODEID": "0",
    "SUBMITIT_LOCAL_GLOBALID": "0",
    "SUBMITIT_LOCAL_LOCALID": "0",
}


def test_a_local_run_takes_a_free_store_port_unless_master_port_is_set(monkeypatch):
    """A port derived from the job id may be another socket's on a busy host (a resumed
    run failed to start on one in CI): a local run's rank 0 binds a free one and publishes
    it in dist.json instead."""
    from runtime.entry import torch_endpoint

    for key, value in LOCAL_JOB.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert torch_endpoint(dict(LOCAL_JOB), "127.0.0.1") is None

    monkeypatch.setenv("MASTER_PORT", "23456")
    assert torch_endpoint({**LOCAL_JOB, "MASTER_PORT": "23456"}, "127.0.0.1") == (
        "127.0.0.1",
        23456,
    )
    assert torch_endpoint({}, "127.0.0.1") is None  # outside submitit


def test_a_slurm_run_derives_its_store_port_from_the_job_id(monkeypatch):
    """Ranks on other nodes compute the same address without reading the run directory."""
    from runtime.entry import torch_endpoint

    slurm = {
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "777",
        "SLURM_NTASKS": "2",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_JOB_NODELIST": "node7",
    }
    monkeypatch.delenv("MASTER_PORT", raising=False)
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    first = torch_endpoint(slurm, "ignored")
    assert first is not None and first[0] == "node7" and 20000 <= first[1] <= 60000
    assert torch_endpoint(slurm, "ignored") == first
