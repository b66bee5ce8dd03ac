"""A run on a real Slurm: `make slurm-up` starts one on this machine (virtual nodes n1, n2);
without one the tests skip (tests/slurm/cluster.py)."""

import json
import subprocess
import time

from tests.helpers import reflow
from tests.helpers import wait_for_status as wait_for
from tests.slurm.cluster import RECIPE, require_cluster, slurm_diagnosis, squeue_state

require_cluster()


def test_two_nodes_train_report_slurm_state_and_stop_cleanly(tmp_path, runs_dir):
    recipe = tmp_path / "onslurm.yaml"
    recipe.write_text(RECIPE)
    out = reflow("launch", str(recipe), "--nodes", "2", check=True, timeout=120)
    assert "slurm job" in out.stdout
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name
    job = json.loads((run_dir / "job.json").read_text())
    assert job["backend"] == "slurm"

    s = wait_for(run, lambda s: s.get("step", 0) >= 3 or s["state"] in ("FAILED", "STOPPED"), 300)
    assert s["state"] == "RUNNING", s.get("reason")
    # 2 nodes x 2 tasks, each rank on the node Slurm gave it.
    assert sorted(w["node"] for w in s["workers"]) == ["n1", "n1", "n2", "n2"]
    assert s["slurm"]["job_id"] == job["job_id"]
    assert s["slurm"]["state"] == "RUNNING"
    assert s["slurm"]["nodes"] == "n[1-2]"
    text = reflow("status", run, check=True).stdout
    assert f"slurm job {job['job_id']}" in text and "RUNNING" in text

    stopped = reflow("stop", run, check=True, timeout=180)
    assert "STOPPED" in stopped.stdout
    deadline = time.monotonic() + 60
    while squeue_state(job["job_id"]) not in ("COMPLETED", "CANCELLED", ""):
        assert time.monotonic() < deadline, squeue_state(job["job_id"])
        time.sleep(1)
    sacct = subprocess.run(
        ["sacct", "-o", "JobID,State,NodeList", "--parsable2", "-j", job["job_id"]],
        capture_output=True,
        text=True,
    ).stdout
    assert f"{job['job_id']}|COMPLETED" in sacct or f"{job['job_id']}|CANCELLED" in sacct
    # No rank process outlives the job.
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout


def test_real_engines_train_across_two_nodes(runs_dir):
    """vLLM + torch on 2 nodes x 1 task: the gloo group spans the nodes (the trainer on n1,
    the weight broadcast from n1 to the rollout rank on n2). One task per node, not two:
    each task starts a vLLM engine, and four of them took 260 s of CI's 45 minutes; the
    replicas' data parallelism is tested on 4 local ranks (test_real_engines.py)."""
    from tests.helpers import REPO

    sets = [
        "resources.gpus_per_node=1",
        "resources.initial_ratio=1:1",
        "slurm.cpus_per_task=1",
        "train.steps=12",
        "control.heartbeat_timeout_s=120",
    ]
    args = ["launch", str(REPO / "recipes" / "demo.yaml"), "--nodes", "2", "--name", "two"]
    for s in sets:
        args += ["--set", s]
    reflow(*args, check=True, timeout=120)
    run_dir = next(runs_dir.iterdir())
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    final = wait_for(run_dir.name, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 600)
    assert final["state"] == "COMPLETED", final.get("reason")
    assert {w["node"] for w in final["workers"] if w["role"] == "trainer"} == {"n1"}
    assert {w["node"] for w in final["workers"] if w["role"] == "rollout"} == {"n2"}
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 12
    assert all(x["trainer_replicas"] == 1 for x in lines)
    assert {w["rank"]: w["node"] for w in final["workers"]} == {0: "n1", 1: "n2"}
    assert all(x["weight_sync_s"] > 0 for x in lines[1:])
    deadline = time.monotonic() + 60
    while squeue_state(job_id) not in ("COMPLETED", ""):
        assert time.monotonic() < deadline, squeue_state(job_id)
        time.sleep(1)


PREEMPTIBLE = """
name: preempt
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 64}
algorithm: {group_size: 4}
train: {steps: 100000, batch_size: 16, lr: 0.001, sync_every: 2, checkpoint_every: 0}
reflow: {mode: reflow, sigma: 0.5, tau: 0.5, delta: 1}
resources: {nodes: 1, gpus_per_node: 2, initial_ratio: "2:2", device: cpu}
engine: {rollout: synthetic, trainer: synthetic, synthetic_token_s: 0.004}
control: {heartbeat_interval_s: 0.5, heartbeat_timeout_s: 30}
slurm: {cpus_per_task: 1, time_min: 15}
"""


def test_preemption_checkpoints_requeues_and_continues(tmp_path, runs_dir):
    """submitit's preemption signal (SIGTERM + USR2, as ``job._interrupt()`` sends): the
    coordinator checkpoints the step it is at, rank 0 hands over to submitit, which calls
    ``RankMain.checkpoint`` and requeues the job; the job runs again and continues from
    the saved step. There are no periodic checkpoints here: the one used is the signal's."""
    import submitit

    recipe = tmp_path / "preempt.yaml"
    recipe.write_text(PREEMPTIBLE)
    reflow("launch", str(recipe), "--nodes", "2", check=True, timeout=120)
    run_dir = next(runs_dir.iterdir())
    run = run_dir.name
    job_id = json.loads((run_dir / "job.json").read_text())["job_id"]
    s = wait_for(run, lambda s: s.get("step", 0) >= 4 or s["state"] in ("FAILED", "STOPPED"), 300)
    assert s["state"] == "RUNNING", s.get("reason")

    submitit.SlurmJob(run_dir / "submitit", job_id)._interrupt()

    # Slurm holds a requeued job for two minutes (BeginTime); once it is back in the queue,
    # make it eligible in 3 s (only the wait is shortened: the requeue is submitit's). Not
    # "now": slurmd revoked the job's credential at the requeue and refuses one created in
    # the same second (it compares whole seconds), which fails the job at once (CI saw
    # FAILED, elapsed 0:00, the run never at attempt 2).
    deadline = time.monotonic() + 120
    while True:
        info = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True)
        if "Restarts=1" in info.stdout and "JobState=PENDING" in info.stdout:
            subprocess.run(["scontrol", "update", f"jobid={job_id}", "StartTime=now+3"], check=True)
            break
        if "Restarts=1" in info.stdout and "JobState=RUNNING" in info.stdout:
            break  # already started again (it may pass through REQUEUED/COMPLETING first)
        assert time.monotonic() < deadline, info.stdout
        time.sleep(0.5)

    # The requeued job's rank 0 resumes: a new attempt, from the checkpoint of the signal.
    try:
        s = wait_for(
            run,
            lambda s: (
                (s.get("attempt") == 2 and s.get("step", 0) > (s["resumed"] or {}).get("step", 0))
                or s["state"] == "FAILED"
            ),
            600,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{slurm_diagnosis(job_id, run_dir)}") from None
    assert s["state"] == "RUNNING", s.get("reason")
    saved = s["resumed"]["step"]
    assert saved >= 4 and s["resumed"]["from"] == f"step-{saved:08d}"
    restarts = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True
    ).stdout
    assert "Restarts=1" in restarts, restarts
    rank0 = "".join(p.read_text() for p in (run_dir / "logs").glob("rank0.log"))
    assert "requeueing the job through submitit" in rank0 and "resuming from" in rank0
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    second = [x["step"] for x in lines if x.get("attempt") == 2]
    assert second[0] == saved + 1  # the step curve continues from the saved step

    reflow("stop", run, check=True, timeout=180)
    deadline = time.monotonic() + 60
    while squeue_state(job_id) not in ("COMPLETED", "CANCELLED", ""):
        assert time.monotonic() < deadline, squeue_state(job_id)
        time.sleep(1)
