"""How ``reflow rejoin`` starts a lost rank of a Slurm run: one task, as a new step of the
run's job on the rank's node, with the environment that makes it that rank (jobs/rejoin.py)."""

from pathlib import Path

import pytest

from jobs.errors import UserError
from jobs.rejoin import rank_env, srun_command
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


def test_the_rank_env_names_its_rank_attempt_and_place_on_its_node():
    cfg = load_recipe(
        REPO / "recipes" / "apps_coding.yaml", ["resources.nodes=4", "resources.gpus_per_node=8"]
    )
    env = rank_env(cfg, 13, "4242.1")
    assert env == {
        "REFLOW_RANK": "13",
        "REFLOW_WORLD_SIZE": "32",
        "REFLOW_ATTEMPT": "4242",
        "SLURM_RESTART_COUNT": "1",
        "LOCAL_RANK": "5",  # a one-task step's SLURM_LOCALID is 0: rank 13 is GPU 5 of node 1
    }
    assert attempt_id(env) == "4242.1"  # the control file's attempt, which it must match


def test_only_a_local_rank_leads_its_own_process_group():
    assert guards_its_processes({"SUBMITIT_EXECUTOR": "local"})
    assert guards_its_processes({})  # a local rank `reflow rejoin` started
    assert not guards_its_processes({"SUBMITIT_EXECUTOR": "slurm"})
    assert not guards_its_processes({SLURM_STEP_ENV: "1", "SLURM_JOB_ID": "7"})
