"""Rank 0's state has one owner per fact (runtime/control/run.py and its parts): the
message handlers, the server and the simulator change it through the owners' methods,
never by writing a ``Run``'s attributes or its parts', nor by reaching through the data
plane to its dispatcher or buffer. The run's state changes in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.transport.states import RunState

REPO = Path(__file__).resolve().parents[2]
# Code that holds a Run (as ``c``, ``coord``, ``self.coord`` or ``self.coordinator``) and
# is not the Run itself.
HOLDERS = [
    *sorted((REPO / "runtime/control").glob("*.py")),
    *sorted((REPO / "runtime/sim").glob("*.py")),
    REPO / "runtime/rank/control_server.py",
]
OWNERS = {"run.py", "coordinator.py"}  # the Run and its subclass change their own state
RUN_NAMES = {"c", "coord"}
RUN_ATTRS = {"coord", "coordinator"}  # self.coord, self.coordinator
PARTS_BEHIND_THE_DATA_PLANE = {"dispatcher", "buffer"}


def _is_run(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in RUN_NAMES
    return (
        isinstance(node, ast.Attribute)
        and node.attr in RUN_ATTRS
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    )


def _rooted_at_run(node: ast.AST) -> bool:
    """``c.x``, ``c.x.y``, ``c.x[k]``...: an attribute or item of a Run or of its parts."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
        if _is_run(node):
            return True
    return False


def findings(source: str, rel: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            for leaf in t.elts if isinstance(t, ast.Tuple) else [t]:
                if _rooted_at_run(leaf):
                    out.append(f"{rel}:{node.lineno}: writes {ast.unparse(leaf)}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr in PARTS_BEHIND_THE_DATA_PLANE
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "data"
            and _is_run(node.value.value)
        ):
            out.append(f"{rel}:{node.lineno}: reaches through {ast.unparse(node)}")
    return out


def test_handlers_change_the_run_through_its_owners_methods() -> None:
    found = []
    for path in HOLDERS:
        if path.name in OWNERS and path.parent.name == "control":
            continue
        found += findings(path.read_text(), str(path.relative_to(REPO)))
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        "c.reason = 'x'",
        "c.ckpt.pending.then_stop = 'x'",
        "c.counters.consumed_total += 1",
        "self.coordinator.metrics_log = []",
        "lines, self.coord.samples = [], []",
        "c.data.dispatcher.blocked['x'] += 1",
        "n = len(coord.data.buffer.unused)",
    ],
)
def test_the_check_finds_writes_and_reach_throughs(code: str) -> None:
    assert findings(code, "x.py")


def test_the_check_leaves_reads_and_calls() -> None:
    code = "w = c.known(i, r)\nw.state = 1\nc.data.count_blocked('x')\nn = c.data.n_unused"
    assert findings(code, "x.py") == []


def test_the_state_changes_only_through_the_run() -> None:
    c = Coordinator(build_config({}), run="t")
    with pytest.raises(AttributeError):
        c.state = RunState.RUNNING  # type: ignore[misc]
    with pytest.raises(AttributeError):
        c.reason = "x"  # type: ignore[misc]
    c.finish(RunState.FAILED, "a bad recipe")  # before any step: no restart would help
    assert (c.state, c.reason, c.life.failed_while_training) == ("FAILED", "a bad recipe", False)
    assert c.life.ended_at is not None
    assert not hasattr(c.rebalance, "lost")  # membership owns the lost ranks, no alias
    c.members.lost.add(3)
    assert c.epoch_roles()[3] == "gone"


def test_a_run_holds_its_parts_not_their_facts() -> None:
    # Rank 0's Run had 40 attributes (issue "Weight sync as one component, rank 0's state
    # with one owner each"); its own course is one record now (runtime/control/run_life.py)
    c = Coordinator(build_config({}), run="t")
    # 22 since the eval rounds on the rollout engines (runtime/control/evals.py)
    assert len(vars(c)) <= 22, sorted(vars(c))
