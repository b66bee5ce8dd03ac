"""Options that ``reflow simulate`` and ``reflow tune`` share: one declaration each, so
that the two commands read the model, workload and profiles the same way."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

ModelOption = Annotated[
    Optional[str],  # noqa: UP045  (typer reads the annotation)
    typer.Option(help="model profile, e.g. qwen3-8b (default: from model.path)"),
]
WorkloadOption = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(help="workload profile: math, apps_agent, retool (default: workload.kind)"),
]
ProfilesOption = Annotated[
    Optional[Path],  # noqa: UP045
    typer.Option(help="profile YAML (default runtime/sim/profiles.yaml)"),
]
SetOption = Annotated[
    Optional[list[str]],  # noqa: UP045
    typer.Option("--set", help="override a recipe field, e.g. --set reflow.delta=2"),
]
