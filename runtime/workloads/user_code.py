"""A recipe's reference to code of the user's own (``workload.reward_fn``,
``workload.agent``): ``PATH.py:NAME`` (a file, imported by its path) or ``module:NAME``.

One loader for both, so a reference means the same thing wherever a recipe may give one:
the same syntax, the same path resolution (from the launch folder, stored absolute for
ranks started elsewhere) and the same one-line errors naming the field."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


class UserCodeError(ValueError):
    """A reference that cannot be used; ``str()`` is one line naming the field."""


def split_ref(ref: str, field: str, what: str = "NAME") -> tuple[str, str]:
    """``("PATH.py" or "module", "NAME")`` of a reference."""
    target, sep, name = ref.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise UserCodeError(f"{field}: {ref!r} is not PATH.py:{what} or module:{what}")
    return target, name


def resolve(ref: str, field: str, base: Path | None = None) -> str:
    """``ref`` with a file's path made absolute (from ``base``, default the working
    folder), so that ranks started elsewhere find the same file."""
    target, name = split_ref(ref, field)
    if not target.endswith(".py"):
        return ref
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    return f"{path.resolve()}:{name}"


def load_object(ref: str, field: str, what: str = "NAME") -> tuple[str, str, Any]:
    """``(target, name, the object)``; raises :class:`UserCodeError` for a missing file or
    module, an import that fails in the user's code, or a missing name."""
    target, name = split_ref(ref, field, what)
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise UserCodeError(f"{field}: {target}: no such file")
        # a module name of its own per file, so two files named alike do not collide
        module_name = "reflow_user_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UserCodeError(f"{field}: {target}: not a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses and pickling look modules up
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # the user's module failed to import: say where
            sys.modules.pop(module_name, None)
            raise UserCodeError(f"{field}: {target}: {one_line(exc)}") from None
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:
            raise UserCodeError(f"{field}: module {target}: {one_line(exc)}") from None
    if not hasattr(module, name):
        raise UserCodeError(f"{field}: {target} has no {name}")
    return target, name, getattr(module, name)


def one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300]
