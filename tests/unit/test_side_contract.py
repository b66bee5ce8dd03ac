"""The role sides' contract (runtime/rank/sides.py ``RoleSide``): the worker calls every
capability without probing, so each engine's sides must override the capabilities they
have under their declared names. A misspelt override would leave the default silently
in place (no checkpoint, no resume, no colocated weights): these tests catch it."""

from __future__ import annotations

import difflib
import importlib
import inspect
import re

import pytest

from runtime.engines.registry import ROLLOUT_ENGINES, TRAINER_ENGINES
from runtime.rank import sides
from runtime.rank.sides import RoleSide
from tests.helpers import REPO

pytestmark = pytest.mark.unit

CAPABILITIES = {
    name
    for name, value in vars(RoleSide).items()
    if not name.startswith("_") and (callable(value) or isinstance(value, property))
}

# What each engine's side has, by its registry name (the rest keep RoleSide's defaults).
CLAIMS = {
    ("trainer", "torch"): {"save_checkpoint", "restore", "engine_weights", "leader"},
    ("trainer", "synthetic"): {"save_checkpoint", "restore", "leader", "waiting_on"},
    ("rollout", "vllm"): {"engine_stats", "load_in_place"},
}


def side_class(kind: str, name: str) -> type:
    module, _, attr = (ROLLOUT_ENGINES if kind == "rollout" else TRAINER_ENGINES)[name].partition(
        ":"
    )
    try:
        target = getattr(importlib.import_module(module), attr)
    except ImportError as exc:  # vLLM is not everywhere (a GPU box without it)
        pytest.skip(f"{module}: {exc}")
    if inspect.isclass(target):
        return target
    return inspect.get_annotations(target, eval_str=True)["return"]  # a factory's class


@pytest.mark.parametrize(("kind", "name"), sorted(CLAIMS))
def test_each_engine_side_overrides_what_it_has(kind, name):
    cls = side_class(kind, name)
    assert issubclass(cls, RoleSide)
    overridden = {c for c in CAPABILITIES if getattr(cls, c) is not getattr(RoleSide, c)}
    assert CLAIMS[(kind, name)] <= overridden, CLAIMS[(kind, name)] - overridden


@pytest.mark.parametrize(
    ("kind", "name"),
    sorted(
        (k, n) for k, r in (("rollout", ROLLOUT_ENGINES), ("trainer", TRAINER_ENGINES)) for n in r
    ),
)
def test_no_side_has_a_near_miss_of_a_capability_name(kind, name):
    cls = side_class(kind, name)
    assert issubclass(cls, RoleSide) and not inspect.isabstract(cls)
    declared = set(dir(RoleSide))
    for attr in dir(cls):
        if attr.startswith("_") or attr in declared:
            continue
        close = difflib.get_close_matches(attr, sorted(CAPABILITIES), n=1, cutoff=0.85)
        assert not close, f"{cls.__name__}.{attr} looks like RoleSide.{close[0]} misspelt"


def test_the_worker_does_not_probe_its_sides():
    text = (REPO / "runtime/rank/worker.py").read_text()
    assert not re.search(r"\b(getattr|hasattr)\(", text)
    assert issubclass(sides.PlaceholderSide, RoleSide) and issubclass(sides.LinkedSide, RoleSide)
