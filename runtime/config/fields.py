"""How a config field is declared: its default, its doc line and what it allows.

Field metadata keys, read by the recipe loader (runtime/config/recipe.py) and the recipe
reference's generator (scripts/gen_recipe_docs.py):

- ``choices``: the allowed values (``renamed``: old values and what to use instead);
- ``ge``/``gt``/``le``/``lt``: numeric bounds;
- ``doc``: one line shown in the recipe reference (docs/recipes.md, made by ``make docs``).
"""

from __future__ import annotations

from dataclasses import field
from typing import Any


def opt(default: Any, doc: str, **checks: Any) -> Any:
    """A dataclass field with a default, a doc line and validation metadata."""
    meta = {"doc": doc, **checks}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
