"""Components that take their own section of the config (issue 50 item 4, as torchtitan's
components take their own ``Config``): they import no whole run ``Config``; the edge that
builds them does (``from_config`` in their settings module)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# folder -> the modules of it (paths below the folder) that may read the whole config:
# the edges that build the others (named, so that the list shrinks, never grows). Every
# runtime folder but the config layer itself is listed: a new module that takes the whole
# run config fails here.
OWN_SECTION = {
    "runtime/weights": {"settings.py"},
    "runtime/control": {"run.py"},  # the run builds rank 0's components
    "runtime/embedded": set(),  # the embedded models and where model.path points
    "runtime/store": set(),  # run folders, checkpoints, metrics sinks
    "runtime/transport": set(),
    "runtime/rank": {"worker.py"},  # the hybrid worker builds its two sides
    "runtime/data": {"settings.py"},  # the prompt stream's sections, bundled at the edge
    # agents' sections bundled at the edge; the trainer-side eval goes with issue 53
    "runtime/workloads": {"agents/settings.py", "eval_sets.py"},
    # The registry builds the role sides; a side is its role's edge on a rank (as the
    # hybrid worker is the rank's): it builds its engine, trainer, agents and weight path,
    # each from its own sections. The trainer-side eval goes with issue 53.
    "runtime/engines": {
        "registry.py",
        "synthetic.py",  # the synthetic sides
        "torch/settings.py",  # the trainer's sections, bundled at the edge
        "torch/trainer_eval.py",
        "torch/trainer_side.py",
        "vllm/settings.py",  # the engine's sections, bundled at the edge
        "vllm/rollout.py",
    },
    # the simulator runs a whole recipe: its run, cluster, search and fits are edges
    "runtime/sim": {"cluster.py", "fit.py", "run.py", "search.py"},
}


def whole_config_imports(source: str) -> list[str]:
    tree = ast.parse(source)
    return [
        f"line {node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module == "runtime.config.schema"
        and any(a.name == "Config" for a in node.names)
    ]


def test_components_with_a_section_of_their_own_import_no_whole_config():
    found = []
    for folder, edges in OWN_SECTION.items():
        files = sorted((REPO / folder).rglob("*.py"))
        assert files, folder
        for path in files:
            if path.relative_to(REPO / folder).as_posix() not in edges:
                found += [
                    f"{path.relative_to(REPO)} {w}" for w in whole_config_imports(path.read_text())
                ]
    assert not found, f"a component reads the whole run config: {found}"


def test_the_check_sees_an_import_of_the_whole_config():
    assert whole_config_imports("from runtime.config.schema import Config, LoraConfig\n")
    assert not whole_config_imports("from runtime.config.schema import LoraConfig\n")


def test_every_runtime_folder_but_the_config_layer_is_held_to_its_sections():
    folders = {p.relative_to(REPO).as_posix() for p in (REPO / "runtime").iterdir() if p.is_dir()}
    assert folders - {"runtime/config", "runtime/__pycache__"} <= set(OWN_SECTION)
    for folder, edges in OWN_SECTION.items():  # no stale exception: each still reads it
        for rel in edges:
            path = REPO / folder / rel
            assert whole_config_imports(path.read_text()), f"{folder}/{rel} no longer needs it"
