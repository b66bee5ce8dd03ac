"""The `reflow` entry point exits with the code a command ends with."""

from __future__ import annotations

import pytest
import typer

from reflow_cli import main as cli

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("code", [0, 1, 3])
def test_a_command_ending_in_typer_exit_exits_with_its_code(monkeypatch, code):
    """`launch --wait` ends with typer.Exit(1) when the run failed: outside click's
    standalone mode that code is returned, not raised, and must not become 0."""
    app = typer.Typer()

    @app.command()
    def run() -> None:
        raise typer.Exit(code)

    @app.command()
    def other() -> None:  # two commands: typer then dispatches by name as reflow's app does
        pass

    monkeypatch.setattr(cli, "app", app)
    monkeypatch.setattr("sys.argv", ["reflow", "run"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
        raise SystemExit(0)  # main returned: exit status 0
    assert exited.value.code == code
