"""The execution modes as policies (runtime/config/modes.py): each mode's declared
properties, and no mode-name comparison left in the code that would bypass them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from runtime.config import modes
from runtime.config.modes import BARRIER_CAUSES, BASELINES, MODES, POLICIES, ModePolicy, policy
from runtime.config.recipe import load_recipe
from runtime.config.schema import MODES as SCHEMA_MODES
from runtime.control import idle

REPO = Path(__file__).resolve().parents[2]

# mode -> (baseline, colocated, barrier, intervals_ahead, replay, default_sigma,
#          rollout_stops_while_training, barrier_cause)
EXPECTED = {
    "colocated_sync": (True, True, True, 1, False, 0.0, True, "colocated_sync_barrier"),
    "disaggregated_sync": (True, False, True, 1, False, 0.0, False, "disaggregated_sync_barrier"),
    "one_step_off": (True, False, True, 2, False, 0.0, False, "one_step_off_barrier"),
    "async": (True, False, False, 0, False, 0.0, False, None),
    "reflow": (False, False, False, 0, True, 0.5, False, None),
}


def test_mode_names_and_order() -> None:
    # the order is the one recipes' reference, reports and reflow tune list them in
    assert MODES == tuple(EXPECTED) == SCHEMA_MODES
    assert MODES[:-1] == BASELINES
    assert modes.DEFAULT_MODE == modes.REFLOW == "reflow"


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_policy_properties(mode: str) -> None:
    p = policy(mode)
    assert p is POLICIES[mode] and p.name == mode
    got = (
        p.baseline,
        p.colocated,
        p.barrier,
        p.intervals_ahead,
        p.replay,
        p.default_sigma,
        p.rollout_stops_while_training,
        p.barrier_cause,
    )
    assert got == EXPECTED[mode]


def test_unknown_mode_is_one_line() -> None:
    with pytest.raises(ValueError, match="unknown mode 'sync' \\(one of colocated_sync, "):
        policy("sync")


def test_inconsistent_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="barrier"):
        ModePolicy("x", False, False, True, 1, False, 0.0, False)  # a barrier without a cause
    with pytest.raises(ValueError, match="sigma"):
        ModePolicy("x", False, False, False, 0, False, 0.5, False)


def test_batches_ahead() -> None:
    # 4 steps per sync, 20 steps: the rest of this interval (and one more for one_step_off),
    # never past the last step
    sync = policy("disaggregated_sync")
    off = policy("one_step_off")
    assert [sync.batches_ahead(s, 4, 20) for s in (0, 1, 3, 4, 17, 19)] == [4, 3, 1, 4, 3, 1]
    assert [off.batches_ahead(s, 4, 20) for s in (0, 1, 3, 4, 14, 17)] == [8, 7, 5, 8, 6, 3]
    assert policy("colocated_sync").batches_ahead(2, 4, 20) == 2
    with pytest.raises(ValueError, match="streams"):
        policy("async").batches_ahead(0, 4, 20)


def test_idle_causes_come_from_the_policies() -> None:
    assert BARRIER_CAUSES == (
        "colocated_sync_barrier",
        "disaggregated_sync_barrier",
        "one_step_off_barrier",
    )
    for cause in BARRIER_CAUSES:
        assert cause in idle.ROLLOUT_CAUSES and cause in idle.THROTTLES
        assert cause in idle.HELD_BACK


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_config_asks_its_policy(mode: str) -> None:
    sets = [f"reflow.mode={mode}", "train.steps=4"]
    cfg = load_recipe(REPO / "recipes" / "demo.yaml", sets, on_note=lambda _: None)
    assert cfg.reflow.policy is policy(mode)
    assert cfg.reflow.sigma == (0.5 if mode == "reflow" else 0.0)  # the demo leaves it unset


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_recipe_sets_run_a_reflow_recipe_as_the_mode(mode: str) -> None:
    # the demo sets a replay share and a 2:2 split: each mode refuses what it does not
    # have, unless its recipe_sets take it off (benchmarks/modes.py, benchmarks/learning.py)
    demo = REPO / "recipes" / "demo.yaml"
    sets = [*policy(mode).recipe_sets(), "train.steps=4"]
    cfg = load_recipe(demo, sets, on_note=lambda _: None)
    assert cfg.reflow.policy is policy(mode)
    assert cfg.reflow.sigma == (0.5 if policy(mode).replay else 0.0)
    assert (cfg.resources.initial_ratio == "2:2") != policy(mode).colocated  # the demo's split


# --- no mode-name comparison outside the config layer ------------------------------------

SCANNED = ("runtime", "reflow_cli", "jobs")
# Where mode names may be compared: the policies themselves, and the config validation
# (its messages and checks of what a recipe may set).
ALLOWED = {"runtime/config/modes.py", "runtime/config/recipe.py", "runtime/config/schema.py"}
# Names that stand for a mode (or a set of them) by name: comparing reflow.mode with one of
# them is a string check under another name. (``m in MODES`` is not: it asks whether a
# name is a mode at all, what validating --modes does.)
MODE_CONSTANTS = {"COLOCATED", "BARRIER_MODES", "BASELINES", "REFLOW", "DEFAULT_MODE"}


def _strings(node: ast.AST) -> list[str]:
    """The string constants ``node`` compares with: itself, or a literal tuple/list/set's."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for e in node.elts for s in _strings(e)]
    return []


def _barrier_fstring(node: ast.AST) -> bool:
    """``f"{mode}_barrier"``: a barrier cause spelt from the mode's name."""
    return (
        isinstance(node, ast.JoinedStr)
        and any(isinstance(v, ast.FormattedValue) for v in node.values)
        and isinstance(node.values[-1], ast.Constant)
        and str(node.values[-1].value).endswith("_barrier")
    )


def _constant_name(node: ast.AST) -> str | None:
    """``X`` or ``module.X`` where X names a mode or a set of them."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", None)
    return name if name in MODE_CONSTANTS else None


def _is_mode(node: ast.AST) -> bool:
    """``mode`` or ``<anything>.mode`` (cfg.reflow.mode, self.mode)."""
    return (isinstance(node, ast.Name) and node.id == "mode") or (
        isinstance(node, ast.Attribute) and node.attr == "mode"
    )


def mode_name_checks(source: str, rel: str) -> list[str]:
    """``rel:line: what`` for each comparison of a mode name in ``source``: ``==``/``in``
    with a mode name or a constant standing for modes, a ``case`` on one, a string method
    or concatenation on a mode, and an f-string barrier cause (how ``mode == X`` hid
    before)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        at = f"{rel}:{getattr(node, 'lineno', 0)}"
        if _barrier_fstring(node):
            found.append(f"{at}: a barrier cause spelt from the mode's name")
        if isinstance(node, ast.MatchValue) and any(s in MODES for s in _strings(node.value)):
            found.append(f"{at}: a case on a mode name")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and _is_mode(node.func.value)
            and node.func.attr in ("startswith", "endswith", "split", "partition")
        ):
            found.append(f"{at}: a string method on the mode")
        if isinstance(node, ast.BinOp) and (_is_mode(node.left) or _is_mode(node.right)):
            found.append(f"{at}: a name built from the mode")
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            for s in _strings(side):
                if s in MODES:
                    found.append(f"{at}: compares with the mode name {s!r}")
            named = _constant_name(side)
            if named:
                found.append(f"{at}: compares with {named}")
    return found


def test_no_mode_name_comparisons() -> None:
    found = []
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel not in ALLOWED:
                found += mode_name_checks(path.read_text(), rel)
    assert not found, "ask cfg.reflow.policy (runtime/config/modes.py):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        'if self.mode == "one_step_off":\n    pass',
        'x = rf.mode != "colocated_sync"',
        'x = mode in ("async", "reflow")',
        'x = "reflow" not in by',
        'blocked[f"{self.mode}_barrier"] += 1',
        "x = cfg.reflow.mode == COLOCATED",
        "x = self.cfg.reflow.mode in BASELINES",
        "x = cfg.reflow.mode == REFLOW",
        "x = cfg.reflow.mode != modes.DEFAULT_MODE",
        "x = mode in modes.BASELINES",
        'x = mode in {"async", "reflow"}',
        'match cfg.reflow.mode:\n    case "reflow":\n        pass',
        'x = cfg.reflow.mode.startswith("one_step")',
        'x = cfg.reflow.mode + "_barrier"',
    ],
)
def test_the_check_finds_the_old_spellings(code: str) -> None:
    assert mode_name_checks(code, "x.py")


def test_the_check_leaves_the_rest() -> None:
    code = 'x = cfg.reflow.policy.colocated\ny = mode == other\nz = kind == "sync"\nlog("reflow")'
    assert mode_name_checks(code, "x.py") == []
