"""Recipe files (YAML) -> a validated :class:`runtime.config.schema.Config`.

Every problem becomes one :class:`RecipeError` line naming the file (or the ``--set``
override), the dotted field and what is allowed, e.g.::

    recipes/x.yaml: resources.rollout_gpus_per_replica: 3 does not divide gpus_per_node=8
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from runtime.config.feasibility import FieldError as _FieldError
from runtime.config.feasibility import check_feasible, sandbox_sizes
from runtime.config.modes import DEFAULT_MODE
from runtime.config.schema import Config


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads ``24:8`` as the base-60 integer 1448; in a recipe it is a ratio."""


_Loader.yaml_implicit_resolvers = {
    ch: [("tag:yaml.org,2002:str", re.compile(r"^[0-9]+:[0-9]+$")), *rules]
    if ch in "0123456789"
    else list(rules)
    for ch, rules in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass


class RecipeError(ValueError):
    """A recipe that cannot run; ``str()`` is the one-line message for the user."""


def _print_note(line: str) -> None:
    # stderr: `simulate --json` and `tune --json` keep stdout for their JSON
    print(line, file=sys.stderr)


def load_recipe(
    path: str | Path,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    on_note: Callable[[str], None] = _print_note,
) -> Config:
    """Read, override (``section.key=value``), type-check and feasibility-check a recipe.
    ``on_note`` gets the one line saying which recipe fields a ``--set reflow.mode``
    left out (:func:`build_config`); by default it is printed on stderr."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise RecipeError(f"{source}: no such recipe file") from None
    except OSError as exc:
        raise RecipeError(f"{source}: cannot read: {exc.strerror}") from None
    try:
        raw = _yaml(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise RecipeError(f"{source}: not valid YAML{where}: {problem}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{source}: the top level must be a mapping of sections")
    return build_config(raw, source=source, overrides=overrides, on_note=on_note)


def build_config(
    raw: dict[str, Any],
    *,
    source: str = "<recipe>",
    overrides: typing.Iterable[str] = (),
    on_note: Callable[[str], None] = _print_note,
) -> Config:
    """``raw`` with ``overrides`` applied, type-checked and feasibility-checked.

    A ``--set reflow.mode=M`` wins over what the recipe file set for another mode: a
    file field that only M refuses (``resources.initial_ratio`` under colocated_sync,
    ``reflow.sigma`` > 0 or ``scheduler.auto_rebalance`` under a baseline) is left out,
    so that comparing a recipe with a baseline is one ``--set``, and ``on_note`` gets one
    line naming what was left out. The same contradiction within the file, or within the
    ``--set`` items, is still refused: only the command line outranks the file.
    """
    file_mode = _lookup(raw, "reflow.mode")
    overridden: dict[str, str] = {}
    for item in overrides:
        key, _value = _apply_override(raw, item)
        overridden[key] = item
    mode_set = _given_by(overridden, "reflow.mode")
    switched = mode_set is not None and _lookup(raw, "reflow.mode") != (file_mode or DEFAULT_MODE)
    left_out: list[tuple[str, Any, str]] = []
    while True:
        try:
            cfg = _build(Config, raw, "")
            check_feasible(cfg)
            break
        except _FieldError as err:
            if (
                switched
                and err.not_in_mode is not None
                and _given_by(overridden, err.path) is None
                and _lookup(raw, err.path) is not None
            ):
                # from the file (not a --set), refused only by the --set mode: drop it and
                # check again, as the other refused fields (at most a few) come one by one
                left_out.append((err.path, _pop(raw, err.path), err.not_in_mode))
                continue
            given = _given_by(overridden, err.path)
            origin = source if given is None else f"{source} (--set {given})"
            raise RecipeError(f"{origin}: {err}") from None
    if left_out:
        fields = ", ".join(f"{path} {_shown(value)} ({why})" for path, value, why in left_out)
        verb = "does" if len(left_out) == 1 else "do"
        on_note(
            f"note: --set {mode_set}: {fields} from {source} {verb} not apply to this mode; "
            "left out"
        )
    return cfg


def _given_by(overridden: dict[str, str], dotted: str) -> str | None:
    """The last ``--set`` item that gives ``dotted`` (itself or a section above it)."""
    given = None
    for key, item in overridden.items():
        if dotted == key or dotted.startswith(key + "."):
            given = item
    return given


def _lookup(raw: dict[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` in a raw recipe mapping, or None where there is none."""
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _pop(raw: dict[str, Any], dotted: str) -> Any:
    """Remove ``dotted`` from a raw recipe mapping (the schema default applies again)."""
    *sections, name = dotted.split(".")
    node = raw
    for part in sections:
        node = node[part]
    return node.pop(name)


def _shown(value: Any) -> str:
    """A value as a recipe writes it: true, 0.5, 24:8."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def rebuild(cfg: Config, changes: dict[str, Any], *, source: str) -> Config:
    """``cfg`` with dotted fields changed in code (the simulator's ``--mode`` and
    ``--gpus``), built again through the same checks as a recipe file: a value no recipe
    may hold is a :class:`RecipeError` naming ``source`` and the field, e.g.
    ``--mode bogus: reflow.mode: 'bogus' is not one of: sync, ...``."""
    raw = config_to_dict(cfg)
    for key, value in changes.items():
        *sections, name = key.split(".")
        node = raw
        for part in sections:
            node = node[part]
        if name not in node:
            raise KeyError(f"{key}: no such config field")  # a caller's bug, not the user's
        node[name] = value
    if "reflow.B_max" in changes:  # a B_max given outright replaces a per-GPU one
        raw["reflow"]["B_max_per_gpu"] = None
    elif raw["reflow"].get("B_max_per_gpu") is not None:
        raw["reflow"]["B_max"] = None  # derived again for the new size
    # The sandbox's sizes, where they hold what the old config derives, are derived again
    # (a --gpus that resizes rollout replicas changes a node's engines); given ones stay.
    derived = sandbox_sizes(cfg, cfg.sandbox.concurrency)
    for name, value in zip(("concurrency", "uid_slots"), derived, strict=True):
        if f"sandbox.{name}" not in changes and getattr(cfg.sandbox, name) == value:
            raw["sandbox"][name] = None
    return build_config(raw, source=source)


def _apply_override(raw: dict[str, Any], item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise RecipeError(f"--set {item}: expected KEY=VALUE, e.g. reflow.sigma=0.3")
    key, text = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise RecipeError(f"--set {item}: {key!r} is not a dotted field name")
    try:
        value = _yaml(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise RecipeError(f"--set {item}: {part} is not a section")
        node = child
    node[parts[-1]] = value
    return key, value


def _check_value(tp: Any, value: Any, path: str, meta: typing.Mapping[str, Any]) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        # the form that fits the value's kind (data.train: a file or a list of them;
        # data.eval: sets or one file), else the first
        return _check_value(_union_arm(args, value), value, path, meta)
    if origin is list:
        if not isinstance(value, list) or not value:
            raise _FieldError(path, f"expected a non-empty list, got {value!r}")
        (et,) = typing.get_args(tp)
        return [_check_value(et, v, f"{path}[{i}]", {}) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, f"{path}.")
    if origin is dict:
        if not isinstance(value, dict):
            raise _FieldError(path, f"expected a mapping, got {value!r}")
        _, vt = typing.get_args(tp)
        return {str(k): _check_value(vt, v, f"{path}.{k}", {}) for k, v in value.items()}
    choices = meta.get("choices")
    if tp is bool:
        if not isinstance(value, bool):
            raise _FieldError(path, f"expected true or false, got {value!r}")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _FieldError(path, f"expected an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, str):
            # YAML 1.1 reads 3e-5 (no dot) as a string; accept what float() accepts.
            try:
                value = float(value)
            except ValueError:
                raise _FieldError(path, f"expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _FieldError(path, f"expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise _FieldError(path, f"expected a finite number, got {value!r}")
    elif tp is str and not isinstance(value, str):
        if isinstance(value, bool) and choices is not None:
            # YAML 1.1 reads off/on/no/yes unquoted as a boolean
            raise _FieldError(
                path,
                f"expected a string, got {str(value).lower()} (YAML reads an unquoted "
                f"off/on/no/yes as true or false): one of {', '.join(map(str, choices))}",
            )
        raise _FieldError(path, f"expected a string, got {value!r}")
    renamed = meta.get("renamed", {})
    if choices is not None and value in renamed:
        raise _FieldError(path, f"{value!r} was renamed: use {renamed[value]}")
    if choices is not None and value not in choices:
        raise _FieldError(path, f"{value!r} is not one of: {', '.join(map(str, choices))}")
    _check_bounds(value, path, meta)
    return value


def _union_arm(args: list[Any], value: Any) -> Any:
    """The arm of a union a value is checked against: the one of its kind, else the first."""
    for arm in args:
        origin = typing.get_origin(arm) or arm
        if isinstance(value, list) and origin is list:
            return arm
        if isinstance(value, dict) and (origin is dict or dataclasses.is_dataclass(arm)):
            return arm
        if isinstance(value, str) and arm is str:
            return arm
    return args[0]


def _check_bounds(value: Any, path: str, meta: typing.Mapping[str, Any]) -> None:
    name = path.rsplit(".", 1)[-1]
    lower = [(meta[k], op) for k, op in (("ge", "<="), ("gt", "<")) if k in meta]
    upper = [(meta[k], op) for k, op in (("le", "<="), ("lt", "<")) if k in meta]
    if not lower and not upper:
        return
    ok = all(value >= b if op == "<=" else value > b for b, op in lower)
    ok = ok and all(value <= b if op == "<=" else value < b for b, op in upper)
    if not ok:
        allowed = " ".join(
            [f"{b} {op}" for b, op in lower] + [name] + [f"{op} {b}" for b, op in upper]
        )
        raise _FieldError(path, f"{value!r} is out of range (allowed: {allowed})")


def _build(cls: type, raw: Any, prefix: str) -> Any:
    where = prefix.rstrip(".") or "top level"
    if not isinstance(raw, dict):
        raise _FieldError(where, f"expected a mapping of keys, got {raw!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in raw:
        if key not in fields:
            allowed = ", ".join(sorted(fields))
            raise _FieldError(f"{prefix}{key}", f"unknown key (allowed here: {allowed})")
    kwargs = {}
    for name, f in fields.items():
        if name in raw:
            kwargs[name] = _check_value(hints[name], raw[name], f"{prefix}{name}", f.metadata)
    for name in fields:
        # A section absent from the recipe still goes through _build so its own defaults
        # are the ones declared in runtime.config.schema.
        if name not in kwargs and dataclasses.is_dataclass(hints[name]):
            kwargs[name] = _build(hints[name], {}, f"{prefix}{name}.")
    return cls(**kwargs)


def config_to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config as YAML; it loads back to an equal :class:`Config`."""
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
