"""scripts/check_layout.py holds the layering: an import of a higher layer fails the check,
lazy ones included, in a copy of the tree with one planted; the real tree has none."""

import shutil

import pytest

from tests.helpers import REPO, load_script

pytestmark = pytest.mark.unit

PLANT = (
    "\n\ndef _planted():\n    from runtime.engines.registry import build_sides\n\n"
    "    return build_sides\n"
)


@pytest.fixture
def layout():
    return load_script("check_layout")


@pytest.fixture
def tree(tmp_path):
    for pkg in ("runtime", "jobs", "reflow_cli"):
        shutil.copytree(REPO / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def upward(layout, root):
    _, files, sites = layout.graph(root)
    return layout.upward(sites, files, root)


def test_the_tree_imports_no_higher_layer(layout):
    assert upward(layout, REPO) == []


def test_a_planted_lazy_upward_import_fails_the_check(layout, tree, capsys):
    target = tree / "runtime" / "config" / "layout.py"
    before = len(target.read_text().splitlines())
    target.write_text(target.read_text() + PLANT)
    line = before + 4  # the import's line in the planted function
    assert upward(layout, tree) == [
        f"runtime/config/layout.py:{line} -> runtime.engines.registry (lazy)"
    ]
    assert layout.main(["--root", str(tree)]) == 1
    assert f"runtime/config/layout.py:{line} -> runtime.engines.registry (lazy)" in (
        capsys.readouterr().out
    )


def test_an_import_for_annotations_only_is_no_arrow(layout, tree):
    target = tree / "runtime" / "config" / "layout.py"
    target.write_text(
        target.read_text()
        + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from runtime.engines.registry import build_sides\n"
    )
    assert upward(layout, tree) == []


def test_a_declared_edge_passes_and_a_stale_one_fails(layout, tree, monkeypatch):
    target = tree / "runtime" / "config" / "layout.py"
    target.write_text(target.read_text() + PLANT)
    edge = ("runtime.config.layout", "runtime.engines.registry")
    monkeypatch.setitem(layout.EDGES, edge, "a test")
    assert upward(layout, tree) == []
    stale = ("runtime.config.schema", "runtime.engines.registry")
    monkeypatch.setitem(layout.EDGES, stale, "a test")
    assert upward(layout, tree) == [f"EDGES {stale[0]} -> {stale[1]}: no such import any more"]


def test_a_new_folder_must_be_placed_in_a_layer(layout, tree):
    (tree / "runtime" / "newthing").mkdir()
    (tree / "runtime" / "newthing" / "__init__.py").write_text('"""A new package."""\n')
    assert upward(layout, tree) == [
        "runtime/newthing/__init__.py: runtime.newthing is in no layer (LAYERS)"
    ]


def test_layers_are_the_longest_prefix(layout):
    assert layout.layer_of("runtime.config.workload_kinds") == layout.layer_of("runtime.config")
    assert layout.layer_of("runtime.workloads.eval_sets") > layout.layer_of(
        "runtime.workloads.agents.base"
    )
    assert layout.layer_of("runtime.weights.p2p") < layout.layer_of("runtime.engines.vllm.engine")
    assert layout.layer_of("runtimes.x") is None
