"""What ``reflow launch --dry-run`` prints before its checks: the ranks per node and their
initial roles, the memory plan, the sbatch parameters and the exact sbatch script."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from jobs.allocation import plan_ranks
from jobs.errors import UserError
from jobs.runs import runs_dir
from jobs.slurm import render_sbatch, slurm_parameters
from reflow_cli import plan as memory
from reflow_cli.view import plan_view
from runtime.config.layout import initial_layout
from runtime.config.schema import Config


def show_dry_run(out: Console, cfg: Config, backend: str, gpu_memory_gib: float | None) -> None:
    layout = initial_layout(cfg)
    out.print(
        f"[bold]{cfg.name}[/]: {cfg.resources.nodes} node(s) x {cfg.resources.gpus_per_node} "
        f"ranks = {cfg.world_size} ranks, {layout.n_rollout_ranks} rollout "
        f"(groups of {layout.rollout_group_size}) : {layout.n_trainer_ranks} trainer "
        f"(groups of {layout.trainer_group_size}); mode {cfg.reflow.mode}; backend {backend}"
    )
    out.print(plan_view(plan_ranks(cfg)))
    out.print("r = rollout, t = trainer, number = replica group")
    typer.echo()
    _print_memory_plan(cfg, backend, gpu_memory_gib)
    out.print("\n[bold]sbatch parameters[/] (submitit, used on Slurm):")
    for key, value in slurm_parameters(cfg, cfg.name).items():
        out.print(f"  {key} = {value}")
    out.print("\n[bold]sbatch script[/] (what submitit submits on Slurm):")
    folder = runs_dir(cfg).resolve() / f"{cfg.name}-<time>" / "submitit"
    # Plain stdout, never wrapped: this is a script to read or copy exactly.
    typer.echo(render_sbatch(cfg, cfg.name, folder, sys.executable))


def _print_memory_plan(cfg, backend: str, gpu_memory_gib: float | None) -> None:
    """The dry run's memory plan; a model whose shape is unknown gets a line saying so."""
    gpu = memory.runs_on_gpus(cfg, backend)
    gpu_bytes, source = memory.gpu_memory(gpu_memory_gib) if gpu else (None, None)
    try:
        plan = memory.make_plan(cfg, gpu_bytes)
    except UserError as exc:
        typer.echo(f"memory plan: none ({exc})")
        return
    for line in memory.plan_lines(cfg, plan, source):
        typer.echo(line)
