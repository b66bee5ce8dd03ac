"""A dry run refuses everything a launch refuses, with the same line: both run
reflow_cli/preflight.py. Each launch-time check has a case here, and a check added to
``LAUNCH_CHECKS`` without one fails the last test."""

from pathlib import Path

import pytest

from reflow_cli.preflight import LAUNCH_CHECKS
from tests.helpers import reflow

pytestmark = pytest.mark.integration

WHOLE_PASS = ["train.activation_checkpointing=false", "train.micro_batch_tokens=null"]


def cases(tmp: Path) -> list[tuple[str, str, list[str], str]]:
    """(the check that refuses, recipe, --set overrides, what the line says)."""
    rewards = tmp / "rewards.py"
    rewards.write_text(
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"
    )
    no_field = tmp / "no_field.jsonl"
    no_field.write_text('{"question": "1+1?"}\n')
    return [
        (
            "check_memory",
            "recipes/dapo_math.yaml",
            WHOLE_PASS,
            "recipes/dapo_math.yaml: trainer role needs ",
        ),
        ("check_data", "recipes/dapo_math.yaml", [], "/data/dapo-math-17k/train.parquet"),
        (
            "check_data",
            "recipes/apps_coding_cpu.yaml",
            [f"data.train={no_field}"],
            str(no_field),
        ),
        (
            "check_data",
            "recipes/apps_coding_cpu.yaml",
            [f"data.eval={{held: {tmp / 'absent.jsonl'}}}"],
            str(tmp / "absent.jsonl"),
        ),
        (
            "check_isolation",
            "recipes/retool_cpu.yaml",
            ["sandbox.python=/usr/bin/nope"],
            "sandbox.python: '/usr/bin/nope' is not an executable file",
        ),
        (
            "check_reward",
            "recipes/demo.yaml",
            [f"workload.reward_fn={rewards}:no_such"],
            "workload.reward_fn: ",
        ),
        (
            "check_reward",
            "recipes/demo.yaml",
            ["workload.reward_fn=/nonexistent/r.py:f"],
            "/nonexistent/r.py: no such file",
        ),
        (
            "check_environment",
            "recipes/demo.yaml",
            ["workload.kind=custom"],
            "workload.agent: an environment class goes with",
        ),
        (
            "check_plugins",
            "recipes/demo.yaml",
            ["reflow.sampler=uniform"],
            "reflow.sampler: 'uniform' is not one of random, medium_reward nor a dotted path",
        ),
        (
            "check_lending",
            "recipes/demo.yaml",
            ["scheduler.lend_trainer=true", "resources.rollout_gpus_per_replica=2"],
            "scheduler.lend_trainer: a lent trainer rank drives a one-GPU engine",
        ),
    ]


@pytest.mark.parametrize("index", range(10))
def test_a_dry_run_refuses_what_the_launch_refuses_with_the_same_line(index, tmp_path, runs_dir):
    _, recipe, sets, says = cases(tmp_path)[index]
    args = [x for s in sets for x in ("--set", s)]
    launch = reflow("launch", recipe, "--local", *args)
    dry = reflow("launch", recipe, "--local", "--dry-run", *args)
    for done in (launch, dry):
        assert done.returncode == 2, done.stdout + done.stderr
        line = done.stderr.strip()
        assert says in line and "\n" not in line and "Traceback" not in line, line
    assert launch.stderr == dry.stderr
    assert "sbatch script" in dry.stdout  # the plan is shown, then the refusal
    assert not runs_dir.exists(), "a refused launch must start nothing"


def test_every_launch_check_has_a_refusal_case(tmp_path):
    covered = {check for check, *_ in cases(tmp_path)}
    assert covered == {check.__name__ for check in LAUNCH_CHECKS}


def test_a_dry_run_that_passes_every_check_says_so(runs_dir):
    done = reflow("launch", "recipes/demo.yaml", "--local", "--dry-run", check=True)
    assert "checks: the launch would start" in done.stdout
    assert not runs_dir.exists()
