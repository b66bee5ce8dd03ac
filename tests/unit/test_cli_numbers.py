"""The CLI's numeric options take ASCII digits within range and refuse the rest in one
line (click's INT and FLOAT took full-width digits, 23-digit counts, nan and inf)."""

import typing

import pytest
import typer

from reflow_cli import numbers
from reflow_cli.main import app

pytestmark = pytest.mark.unit


def _commands(typer_app: typer.Typer, path: str = "reflow"):
    for command in typer_app.registered_commands:
        yield f"{path} {command.name or command.callback.__name__}", command.callback
    for group in typer_app.registered_groups:
        yield from _commands(group.typer_instance, f"{path} {group.name}")


def _loose_numbers(where: str, callback) -> list[str]:
    """The int and float parameters of a command that have no parser of their own."""
    out = []
    for name, hint in typing.get_type_hints(callback, include_extras=True).items():
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        base, *meta = typing.get_args(hint)
        kinds = {a for a in typing.get_args(base) if a is not type(None)} or {base}
        info = next((m for m in meta if hasattr(m, "parser")), None)
        if kinds & {int, float} and (info is None or info.parser is None):
            out.append(f"{where} --{name}")
    return out


def test_no_option_of_the_cli_parses_numbers_with_clicks_own_types():
    commands = list(_commands(app))
    assert len(commands) > 10  # the walk reaches every command, the reward group's too
    found = [x for where, callback in commands for x in _loose_numbers(where, callback)]
    assert not found, f"numeric options without a reflow_cli.numbers parser: {found}"


def test_the_walk_finds_a_loose_number():
    def command(
        n: typing.Annotated[typing.Optional[int], typer.Option()] = None,  # noqa: UP045
        x: typing.Annotated[float, typer.Option(parser=numbers.GIB)] = 1.0,
        flag: typing.Annotated[bool, typer.Option()] = False,
    ) -> None: ...

    assert _loose_numbers("c", command) == ["c --n"]


@pytest.mark.parametrize(
    "text",
    [
        "\uff18",  # full-width 8
        "\u00b2",  # superscript 2
        "\u0668",  # Arabic-Indic 8
        "1" * 23,
        "-1",
        "+3",
        "0",  # below NODES' 1
        "100001",
        "8.0",
        "1e3",
        "",
        " ",
        "8 8",
    ],
)
def test_a_count_is_ascii_digits_in_range(text):
    with pytest.raises(typer.BadParameter, match="is not a whole number from 1 to 100000") as got:
        numbers.NODES(text)
    assert "\n" not in str(got.value) and len(str(got.value)) < 120


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "1e9", "\uff18\uff10", "0.5", "1" * 30])
def test_a_decimal_is_ascii_digits_in_range(text):
    with pytest.raises(typer.BadParameter, match="is not a number from 1 to 100000"):
        numbers.GIB(text)


def test_good_values_and_defaults_pass():
    assert numbers.NODES("8") == 8 and numbers.NODES(" 16 ") == 16
    assert numbers.NODES(4) == 4  # a default
    assert numbers.GIB("141") == 141.0 and numbers.GIB("79.5") == 79.5
    assert numbers.SECONDS(60.0) == 60.0
    assert numbers.SEED("4294967295") == 2**32 - 1
    with pytest.raises(typer.BadParameter):
        numbers.SEED("4294967296")
    with pytest.raises(typer.BadParameter):
        numbers.NODES(True)  # a bool is not a count
