"""How ``reflow rejoin`` starts a lost rank of a Slurm run: one task, as a new step of the
run's job on the rank's node, with the environment that makes it that rank (jobs/rejoin.py)."""

from pathlib import Path

import pytest

from jobs.errors import UserError
from jobs.rejoin import process_env, rank_env, srun_command, start_detached
from runtime.config.recipe import load_recipe
from runtime.entry import SLURM_STEP_ENV, attempt_id, guards_its_processes

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ARGV = ["python3", "-u", "-m", "jobs.rejoin", "/runs/R", "13"]


@pytest.fixture
def srun(monkeypatch) -> str:
    monkeypatch.setattr("jobs.rejoin.shutil.which", lambda name: f"/usr/bin/{name}")
    return "/usr/bin/srun"


def test_a_gpu_rank_is_a_step_on_its_node_sharing_the_allocation_with_its_gpus(srun):
    cfg = load_recipe(REPO / "recipes" / "apps_coding.yaml", ["resources.nodes=8"])
    cmd = srun_command(cfg, "4242", "gpu-n3", ARGV)
    assert cmd == [
        srun,
        "--jobid",
        "4242",
        "--overlap",
        "--nodes",
        "1",
        "--ntasks",
        "1",
        "--nodelist",
        "gpu-n3",
        "--cpus-per-task",
        str(cfg.slurm.cpus_per_task),
        "--export",
        "ALL",
        "--job-name",
        "reflow-rejoin",
        "--gpus-per-node",
        str(cfg.resources.gpus_per_node),
        *ARGV,
    ]


def test_a_cpu_rank_asks_for_no_gpu(srun):
    cfg = load_recipe(REPO / "recipes" / "demo.yaml")
    cmd = srun_command(cfg, "7", "n2", ARGV)
    assert "--gpus-per-node" not in cmd and cmd[-len(ARGV) :] == ARGV


def test_without_srun_here_it_says_where_to_type_it(monkeypatch):
    monkeypatch.setattr("jobs.rejoin.shutil.which", lambda name: None)
    cfg = load_recipe(REPO / "recipes" / "demo.yaml")
    with pytest.raises(UserError, match="srun, which is not on this machine's PATH"):
        srun_command(cfg, "7", "n2", ARGV)


def test_the_rank_env_names_its_rank_and_attempt():
    cfg = load_recipe(
        REPO / "recipes" / "apps_coding.yaml", ["resources.nodes=4", "resources.gpus_per_node=8"]
    )
    env = rank_env(cfg, 13, "4242.1")
    assert env == {
        "REFLOW_RANK": "13",
        "REFLOW_WORLD_SIZE": "32",
        "REFLOW_ATTEMPT": "4242",
        "SLURM_RESTART_COUNT": "1",
    }
    assert attempt_id(env) == "4242.1"  # the control file's attempt, which it must match


def test_only_a_local_rank_leads_its_own_process_group():
    assert guards_its_processes({"SUBMITIT_EXECUTOR": "local"})
    assert guards_its_processes({})  # a local rank `reflow rejoin` started
    assert not guards_its_processes({"SUBMITIT_EXECUTOR": "slurm"})
    assert not guards_its_processes({SLURM_STEP_ENV: "1", "SLURM_JOB_ID": "7"})


SALLOC_SHELL = {
    "PATH": "/usr/bin",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SLURM_JOB_ID": "999",
    "SLURM_NTASKS": "8",
    "SLURM_LOCALID": "5",
    "SBATCH_PARTITION": "big",
    "SRUN_CPUS_PER_TASK": "16",
    "PMI_RANK": "2",
    "PMIX_RANK": "2",
    "SUBMITIT_EXECUTOR": "slurm",
}


def test_a_local_rank_takes_nothing_of_the_shell_its_command_was_typed_in():
    # typed in an salloc shell: the local rank must not take itself for task 5 of job 999
    cfg = load_recipe(REPO / "recipes" / "demo.yaml")
    env = process_env(SALLOC_SHELL, cfg, 3, "77.0", slurm_step=False)
    assert env == {
        "PATH": "/usr/bin",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        **rank_env(cfg, 3, "77.0"),
    }
    assert attempt_id(env) == "77.0" and guards_its_processes(env)


def test_a_slurm_steps_rank_gets_its_node_local_index_and_no_enclosing_job():
    cfg = load_recipe(
        REPO / "recipes" / "apps_coding.yaml", ["resources.nodes=4", "resources.gpus_per_node=8"]
    )
    env = process_env(SALLOC_SHELL, cfg, 13, "4242.1", slurm_step=True)
    # a one-task step's SLURM_LOCALID is 0: rank 13 is GPU 5 of node 1
    assert not any(k.startswith(("SBATCH_", "SRUN_", "PMI")) for k in env)
    assert "SLURM_JOB_ID" not in env and "SLURM_NTASKS" not in env
    assert "SLURM_LOCALID" not in env
    assert env["LOCAL_RANK"] == "5" and not guards_its_processes(env)


def test_a_process_that_exits_at_once_is_a_one_line_error_quoting_it(tmp_path):
    log = tmp_path / "rank3.rejoin.log"
    fails = ["sh", "-c", "echo 'srun: error: Unable to create step: Invalid node name' >&2; exit 1"]
    with pytest.raises(UserError, match=r"sh exited at once \(exit 1\): srun: error: Unable"):
        start_detached(fails, {"PATH": "/usr/bin:/bin"}, tmp_path, log, 10.0)
    runs = start_detached(["sleep", "30"], {"PATH": "/usr/bin:/bin"}, tmp_path, log, 0.5)
    try:
        assert runs.poll() is None
    finally:
        runs.kill()
        runs.wait()
