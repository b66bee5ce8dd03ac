"""The README's promises that a test can hold it to."""

import dataclasses
import typing
from pathlib import Path

from runtime.config.schema import Config

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_readme_shows_the_two_setup_commands():
    assert "make demo" in README and "make test" in README


def test_recipe_reference_lists_every_field():
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        if dataclasses.is_dataclass(hints[f.name]):
            for g in dataclasses.fields(hints[f.name]):
                assert f"`{f.name}.{g.name}`" in README, f"{f.name}.{g.name} undocumented"
