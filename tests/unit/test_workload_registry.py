"""The workload kinds (runtime/config/workload_kinds.py): one record per ``workload.kind``, and
every per-kind table elsewhere read from it."""

import dataclasses
import inspect
import subprocess
import sys

import pytest

from runtime.config.recipe import RecipeError, load_recipe
from runtime.config.schema import WorkloadConfig
from runtime.config.workload_kinds import KIND_NAMES, KINDS, WorkloadKind, workload_kind
from tests.helpers import REPO


def kind_field() -> dataclasses.Field:
    return next(f for f in dataclasses.fields(WorkloadConfig) if f.name == "kind")


def test_the_schema_offers_exactly_the_kinds_with_a_record():
    f = kind_field()
    assert tuple(f.metadata["choices"]) == KIND_NAMES == tuple(KINDS)
    assert f.default in KINDS
    for name, k in KINDS.items():
        assert isinstance(k, WorkloadKind) and k.name == name
        assert workload_kind(name) is k


def test_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        KINDS["math"].needs_sandbox = True  # type: ignore[misc]


def test_every_agent_loop_resolves_to_a_class_with_an_async_run():
    from runtime.workloads.agents.registry import AGENTS, agent

    assert set(AGENTS) == set(KINDS)
    for name, k in KINDS.items():
        cls = k.agent_class()
        assert isinstance(cls, type) and inspect.iscoroutinefunction(cls.run), name
        assert AGENTS[name] is cls
        assert type(agent(name)) is cls


def test_the_old_tables_agree_with_the_records():
    from runtime.data.datasets import REQUIRED_FIELDS
    from runtime.sim.run import WORKLOAD_OF_KIND
    from runtime.workloads.agents.registry import NEEDS_STOP_STRINGS
    from runtime.workloads.sandbox.configured import NEEDS_SANDBOX

    assert {n for n, k in KINDS.items() if k.stop_strings} == NEEDS_STOP_STRINGS
    assert {n for n, k in KINDS.items() if k.needs_sandbox} == NEEDS_SANDBOX
    assert {n: k.fields for n, k in KINDS.items()} == REQUIRED_FIELDS
    assert {n: k.sim_workload for n, k in KINDS.items() if k.sim_workload} == WORKLOAD_OF_KIND
    # the values as they were before the records (issue 18 changes no behaviour)
    assert sorted(NEEDS_STOP_STRINGS) == ["tool_reasoning"]
    assert sorted(NEEDS_SANDBOX) == ["code_agent", "tool_reasoning"]
    assert REQUIRED_FIELDS == {
        "arith": (),
        "math": ("prompt", "answer"),
        "tool_reasoning": ("prompt", "answer"),
        "code_agent": ("prompt", "tests"),
        "custom": ("prompt",),
    }
    assert WORKLOAD_OF_KIND == {
        "math": "math",
        "arith": "math",
        "code_agent": "apps_agent",
        "tool_reasoning": "retool",
    }
    assert {n for n, k in KINDS.items() if k.trainer_eval} == {"arith"}


def test_every_simulator_profile_named_exists():
    from runtime.sim.parameters import load_profiles

    profiles = load_profiles()
    for k in KINDS.values():
        if k.sim_workload is not None:
            profiles.workload(k.sim_workload)  # raises ProfileError for an unknown one


def test_a_kind_without_a_record_is_refused_in_one_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("workload: {kind: chess}\n")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(info.value) == (
        f"{path}: workload.kind: 'chess' is not one of: "
        "arith, math, code_agent, custom, tool_reasoning"
    )
    with pytest.raises(KeyError) as key:
        workload_kind("chess")
    assert "\n" not in str(key.value) and "workload.kind: 'chess'" in str(key.value)


def test_the_sandbox_check_reads_the_records(tmp_path):
    from runtime.workloads.sandbox import check_sandbox

    # a kind that runs no model-written code sets up no sandbox (nothing to install)
    cfg = load_recipe(REPO / "recipes" / "demo.yaml")
    assert not workload_kind(cfg.workload.kind).needs_sandbox
    assert check_sandbox(cfg) == []


def test_validating_a_recipe_stays_light():
    # The schema takes its choices from the records: importing it (and the recipe loader)
    # must not import an agent loop, the sandbox, torch or vLLM.
    code = (
        "import sys, runtime.config.recipe, runtime.config.schema\n"
        "heavy = ('torch', 'vllm', 'runtime.workloads.sandbox', 'runtime.workloads.agents',"
        " 'runtime.workloads.rewards')\n"
        "print([m for m in sys.modules if m.startswith(heavy)])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
