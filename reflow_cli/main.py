"""``reflow``: launch, watch, rebalance and stop runs.

Commands are thin: they parse, call :mod:`jobs`, and print. Errors are one line on stderr
(exit code 2 for a user error); ``REFLOW_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.live import Live

from jobs import launch as launching
from jobs import rejoin as rejoining
from jobs.control import ControlClient
from jobs.errors import UserError
from jobs.runs import find_run
from jobs.slurm import slurm_available
from reflow_cli import numbers
from reflow_cli import plan as memory
from reflow_cli.dry_run import show_dry_run
from reflow_cli.preflight import Where, preflight
from reflow_cli.reward import reward_app
from reflow_cli.sim_options import ModelOption, ProfilesOption, SetOption, WorkloadOption
from reflow_cli.tune import tune
from reflow_cli.view import eval_lines, sim_eval_line, status_view
from runtime.config.layout import LayoutError, parse_ratio
from runtime.config.recipe import RecipeError, load_recipe
from runtime.sim.cluster import SimStalled
from runtime.sim.parameters import ProfileError
from runtime.transport import protocol as p

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])
app.add_typer(reward_app, name="reward")
app.command()(tune)
out = Console()
err = Console(stderr=True)

USER_ERRORS = (UserError, RecipeError, LayoutError, ProfileError, SimStalled)


def _exit_code(state: str) -> int:
    return 0 if state in ("COMPLETED", "STOPPED") else 1


@app.command()
def launch(
    recipe: Annotated[
        Optional[Path],  # noqa: UP045
        typer.Argument(help="recipe YAML file (not with --resume)"),
    ] = None,
    resume: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="continue RUN (name or folder) from its newest valid checkpoint"),
    ] = None,
    nodes: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="override resources.nodes", parser=numbers.NODES),
    ] = None,
    local: Annotated[bool, typer.Option("--local", help="run on this machine")] = False,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="override a field, e.g. --set reflow.sigma=0.3"),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print the plan, start nothing")
    ] = False,
    name: Annotated[Optional[str], typer.Option(help="run name (default: recipe name)")] = None,  # noqa: UP045
    wait: Annotated[bool, typer.Option("--wait", help="stay attached until the run ends")] = False,
    partition: Annotated[Optional[str], typer.Option(help="override slurm.partition")] = None,  # noqa: UP045
    time_min: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option("--time", help="override slurm.time_min (minutes)", parser=numbers.MINUTES),
    ] = None,
    account: Annotated[Optional[str], typer.Option(help="override slurm.account")] = None,  # noqa: UP045
    qos: Annotated[Optional[str], typer.Option(help="override slurm.qos")] = None,  # noqa: UP045
    constraint: Annotated[Optional[str], typer.Option(help="override slurm.constraint")] = None,  # noqa: UP045
    gpu_memory_gib: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            help="GPU memory for the memory plan (default: this machine's, or 80)",
            parser=numbers.GIB,
        ),
    ] = None,
    no_memory_check: Annotated[
        bool,
        typer.Option("--no-memory-check", help="launch even if the memory plan does not fit"),
    ] = False,
) -> None:
    """Start a run of RECIPE: on Slurm when a controller answers, else locally."""
    overrides = list(set_ or [])
    if nodes is not None:
        overrides.append(f"resources.nodes={nodes}")
    flags = {
        "slurm.partition": partition,
        "slurm.time_min": time_min,
        "slurm.account": account,
        "slurm.qos": qos,
        "slurm.constraint": constraint,
    }
    overrides += [f"{key}={value}" for key, value in flags.items() if value is not None]
    if name is not None:
        overrides.append(f"name={name}")
    if resume is not None:
        if recipe is not None:
            raise UserError("--resume continues a run with its own config.yaml: give no RECIPE")
        _resume(resume, overrides, _backend(local), wait)
        return
    if recipe is None:
        raise UserError("missing RECIPE (a recipe YAML file), or --resume RUN")
    cfg = load_recipe(recipe, overrides)
    # Slurm is asked only for a recipe that loads: sinfo can take its whole 10 s timeout
    # (a client with no controller), which a typo in the recipe's name should not cost.
    backend = _backend(local)
    where = Where(str(recipe), backend, gpu_memory_gib, memory_check=not no_memory_check)
    if dry_run:
        show_dry_run(out, cfg, backend, gpu_memory_gib)
        preflight(cfg, where)  # what the launch would refuse, refused here too (exit 2)
        out.print("[bold]checks[/]: the launch would start (memory, data, sandbox, user code)")
        return
    # a missing file, column or sandbox, or a GPU plan that does not fit, fails here, not
    # after the engines started (the dry run above refused the same)
    preflight(cfg, where)
    sub = launching.submit(cfg, backend, name)
    out.print(f"run [bold]{sub.paths.name}[/] submitted ({backend} job {sub.job_id})")
    out.print(f"  folder: {sub.paths.root}")
    _follow(sub, cfg, wait)


@app.command()
def plan(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML file")],
    nodes: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="override resources.nodes", parser=numbers.NODES),
    ] = None,
    set_: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option("--set", help="override a field, e.g. --set train.micro_batch_tokens=32768"),
    ] = None,
    gpu_memory_gib: Annotated[
        Optional[float],  # noqa: UP045
        typer.Option(
            help="memory of one GPU (default: this machine's first GPU, or 80)", parser=numbers.GIB
        ),
    ] = None,
) -> None:
    """Per-GPU memory of RECIPE's trainer and rollout roles: weights, gradients and AdamW
    per shard, activations, vLLM weights and KV cache, and whether they fit
    (docs/memory-plan.md). Exits 1 when a launch would be refused."""
    overrides = list(set_ or []) + ([f"resources.nodes={nodes}"] if nodes is not None else [])
    cfg = load_recipe(recipe, overrides)
    gpu = memory.runs_on_gpus(cfg, None)
    gpu_bytes, source = memory.gpu_memory(gpu_memory_gib) if gpu else (None, None)
    result = memory.make_plan(cfg, gpu_bytes)
    for line in memory.plan_lines(cfg, result, source):
        typer.echo(line)
    if result.refusal() is not None:
        raise typer.Exit(1)


def _backend(local: bool) -> str:
    """Where a run goes: Slurm when a controller answers and ``--local`` was not given."""
    return "local" if local or not slurm_available() else "slurm"


def _resume(run: str, overrides: list[str], backend: str, wait: bool) -> None:
    paths = find_run(run)
    before = load_recipe(paths.config)
    cfg = load_recipe(paths.config, overrides)  # e.g. --set train.steps=200 to go further
    if cfg.world_size != before.world_size:
        raise UserError(
            f"--resume: the run has {before.world_size} ranks; a checkpoint continues only "
            f"with the same number ({cfg.world_size} asked)"
        )
    if cfg.algorithm.freeze_router != before.algorithm.freeze_router:
        # a trainer replica that joins later builds its frozen routers from model.path, not
        # from a checkpoint whose routers have trained
        raise UserError(
            "--resume: algorithm.freeze_router is the run's from its start "
            f"({before.algorithm.freeze_router}); it cannot change on a resume"
        )
    sub, info = launching.resume(paths, cfg, backend)
    out.print(
        f"run [bold]{paths.name}[/] resumed from {info.name} (step {info.step}, policy "
        f"v{info.policy_version}) as {backend} job {sub.job_id}"
    )
    _follow(sub, cfg, wait)


def _follow(sub, cfg, wait: bool) -> None:
    if sub.backend == "local":
        status = launching.wait_until(
            sub.paths,
            lambda s: s.get("state") != "STARTING",
            cfg.control.register_timeout_s + 60,
        )
        if status.get("state") == "FAILED":
            raise UserError(f"run {sub.paths.name} failed to start: {status.get('reason')}")
        out.print(f"  {len(status.get('workers', []))} ranks up, state {status.get('state')}")
    out.print(f"follow it with: reflow status {sub.paths.name} --watch")
    if wait:
        final = _watch(sub.paths)
        out.print()
        _print_summary(sub.paths)
        raise typer.Exit(_exit_code(final.get("state", "FAILED")))


def _print_summary(paths) -> None:
    deadline = time.monotonic() + 30  # rank 0 writes it as its last act
    while not paths.summary.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    if not paths.summary.is_file():
        return
    s = json.loads(paths.summary.read_text())
    samples = s.get("samples", {})
    out.print(
        f"[bold]{s['state']}[/] after {s['steps']} steps in {s['wall_s']:.1f} s ({s['mode']}): "
        f"trainer {s['trainer_tokens_per_s']:.0f} tokens/s, trainer idle "
        f"{100 * s['trainer_idle_ratio']:.1f}%"
    )
    if s.get("eval_reward_start") is not None and s.get("eval_reward_end") is not None:
        out.print(
            f"held-out eval reward: {s['eval_reward_start']:.3f} -> {s['eval_reward_end']:.3f}"
        )
    for line in eval_lines(s.get("evals") or {}):
        out.print(line)
    out.print(
        "samples: "
        + ", ".join(f"{k} {v}" for k, v in samples.items())
        + f"   (details: {paths.summary})"
    )


# How long `--wait`/`--watch` follows a run whose rank 0 does not answer while Slurm cannot
# be asked whether its job lives (a queued job has a live squeue entry, so it is not this).
UNANSWERED_WATCH_S = 600.0


def _watch(paths, unanswered_s: float = UNANSWERED_WATCH_S, poll_s: float = 1.0) -> dict:
    status = launching.read_status(paths)
    silent_since: float | None = None
    with Live(status_view(status), console=out, refresh_per_second=2) as live:
        while status.get("state") not in launching.TERMINAL:
            time.sleep(poll_s)
            status = launching.read_status(paths)
            live.update(status_view(status))
            # read_status asked Slurm already: "UNKNOWN" is a squeue/sacct that did not answer
            unknown = (status.get("slurm") or {}).get("state") == "UNKNOWN"
            if not (status.get("stale") and unknown):
                silent_since = None
            elif silent_since is None:
                silent_since = time.monotonic()
            elif time.monotonic() - silent_since > unanswered_s:
                raise UserError(
                    f"run {paths.name}: rank 0 has not answered for {unanswered_s:g} s and "
                    "Slurm cannot say whether the job lives; stopped watching "
                    f"(`reflow status {paths.name}` later)"
                )
    return status


@app.command()
def status(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder; default newest")] = None,  # noqa: UP045
    watch: Annotated[bool, typer.Option("--watch", help="refresh live until the run ends")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
) -> None:
    """Show a run's state, layout, ranks and buffer."""
    paths = find_run(run)
    if watch and not as_json:
        _watch(paths)
        return
    s = launching.read_status(paths)
    if as_json:
        out.print_json(json.dumps(s)) if sys.stdout.isatty() else print(json.dumps(s))
    else:
        out.print(status_view(s))


@app.command()
def rebalance(
    ratio: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="rollout:trainer ranks, e.g. 24:8 (applied at the next sync point)"),
    ] = None,
    auto: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(help="on|off: the producer/consumer allocator moves replica groups"),
    ] = None,
    run: Annotated[Optional[str], typer.Argument(help="run name or folder; default newest")] = None,  # noqa: UP045
) -> None:
    """Move whole replica groups between the rollout and trainer pools, by hand (--ratio)
    or automatically (--auto on)."""
    if ratio is None and auto is None:
        raise UserError("rebalance: give --ratio R:T, --auto on|off, or both")
    if auto is not None and auto not in ("on", "off"):
        raise UserError(f"rebalance --auto: {auto!r} is not on or off")
    parsed = parse_ratio(ratio) if ratio is not None else None
    paths = find_run(run)
    client = ControlClient(paths)
    if auto is not None:
        reply = client.command(p.AllocatorRequest(auto=auto == "on"))
        if not reply.ok:
            raise UserError(f"rebalance --auto {auto}: {reply.text}")
        out.print(reply.text)
    if parsed is not None:
        reply = client.command(p.RebalanceRequest(rollout=parsed[0], trainer=parsed[1]))
        if not reply.ok:
            raise UserError(f"rebalance {ratio}: {reply.text}")
        out.print(reply.text)


@app.command()
def stop(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder; default newest")] = None,  # noqa: UP045
    grace: Annotated[
        float, typer.Option(help="seconds before the job is killed", parser=numbers.SECONDS)
    ] = 60.0,
) -> None:
    """Stop a run gracefully (the job is killed if it does not end within --grace)."""
    paths = find_run(run)
    final = launching.stop(paths, grace)
    out.print(f"run {paths.name}: {final.get('state')} {final.get('reason', '')}".rstrip())


@app.command()
def rejoin(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder; default newest")] = None,  # noqa: UP045
    rank: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="the lost rank to start again", parser=numbers.RANK),
    ] = None,
) -> None:
    """Start a lost rank of a running run again (on Slurm: a step on the run's allocation,
    on the rank's node): it registers and takes its role back at a later layout epoch, with
    the current weights (rollout) or the trainer state of the replicas that stayed
    (trainer, once its whole replica group is back)."""
    if rank is None:
        raise UserError("rejoin: give --rank K, the lost rank to start again")
    paths = find_run(run)
    where = rejoining.start(paths, rank)
    out.print(f"run {paths.name}: rank {rank} started again ({where}, see logs/rank{rank}.*)")


@app.command()
def export(
    run: Annotated[str, typer.Argument(help="run name or folder")],
    out: Annotated[Path, typer.Argument(help="folder to write (new or empty)")],
    step: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(help="which saved policy version (default: the latest)", parser=numbers.STEPS),
    ] = None,
    checkpoint: Annotated[
        Optional[str],  # noqa: UP045
        typer.Option(
            help="export a sharded checkpoint instead (e.g. step-00000010), tensor by tensor"
        ),
    ] = None,
    merged: Annotated[
        bool,
        typer.Option(
            "--merged",
            help="LoRA run: the base with the adapter merged in (a plain model folder), "
            "not the peft adapter",
        ),
    ] = False,
) -> None:
    """Write a run's policy as a Hugging Face folder (config, safetensors, tokenizer); a
    LoRA run's as a peft adapter folder, or merged into the base with --merged."""
    from jobs.export import export as export_run

    # ``out`` is the folder here, not the console
    folder = export_run(find_run(run), out, step, checkpoint=checkpoint, merged=merged)
    typer.echo(f"exported to {folder}")


@app.command()
def simulate(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML file")],
    gpus: Annotated[
        int, typer.Option(help="GPUs of the simulated cluster (whole nodes)", parser=numbers.GPUS)
    ],
    mode: Annotated[
        Optional[list[str]],  # noqa: UP045
        typer.Option(help="execution mode(s) to compare; default the recipe's"),
    ] = None,
    steps: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="train.steps to simulate (default: the protocol's warm-up + measured steps, "
            "not the recipe's train.steps, unless --set train.steps gives one)",
            parser=numbers.STEPS,
        ),
    ] = None,
    model: ModelOption = None,
    workload: WorkloadOption = None,
    profiles: ProfilesOption = None,
    set_: SetOption = None,
    seed: Annotated[int, typer.Option(help="workload seed", parser=numbers.SEED)] = 0,
    warmup_steps: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="trainer steps before the measured ones (default: 5 sync intervals, "
            "10 for agent workloads)",
            parser=numbers.STEPS,
        ),
    ] = None,
    measure_steps: Annotated[
        Optional[int],  # noqa: UP045
        typer.Option(
            help="trainer steps measured (default as --warmup-steps)", parser=numbers.STEPS
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per mode")] = False,
) -> None:
    """Simulate RECIPE on a cluster of --gpus GPUs: the real control plane (coordinator,
    buffer, dispatcher, schedulers, allocator) against modelled engines and a simulated
    clock; prints throughput (the measurement protocol of docs/simulator.md: measured
    steps after warm-up), idle ratios and the ideal-throughput bound per mode. It runs as
    many steps as the protocol measures unless --steps (or --set train.steps) sets the
    length: a recipe's whole train.steps (4,800 for dapo_math) would take many times
    longer for the same figures."""
    from rich.table import Table

    from runtime.config.schema import Config
    from runtime.sim.parameters import DEFAULT_PROFILES, load_profiles
    from runtime.sim.run import (
        ProtocolError,
        SimPlan,
        figures,
        given_fields,
        plan,
        protocol_steps,
        steps_needed,
    )
    from runtime.sim.run import simulate as run_sim

    overrides = list(set_ or []) + ([f"train.steps={steps}"] if steps is not None else [])
    explicit = "train.steps" in given_fields(overrides)
    cfg = load_recipe(recipe, overrides)
    path = profiles or DEFAULT_PROFILES
    profs = load_profiles(path)

    def plans_of(cfg: Config, overrides: list[str]) -> list[SimPlan]:
        # Every mode is checked before the first one runs: a bad one is refused at once,
        # not after the simulations before it.
        return [
            plan(cfg, gpus, mode=m, model=model, workload=workload, profiles=profs, sets=overrides)
            for m in mode or [None]  # None: the recipe as written
        ]

    plans = plans_of(cfg, overrides)
    every = cfg.train.sync_every
    warmup, measure = protocol_steps(plans[0].workload, warmup_steps, measure_steps, every)
    needed = steps_needed(warmup, measure, every)
    if not explicit:  # the protocol's length, in whole sync intervals
        overrides.append(f"train.steps={needed}")
        cfg = load_recipe(recipe, overrides, on_note=lambda _: None)  # noted by the first load
        plans = plans_of(cfg, overrides)
    if cfg.train.steps < needed:  # refused before anything runs
        raise ProtocolError(
            f"train.steps: {cfg.train.steps} is fewer than the protocol's {needed} (warm-up "
            f"{warmup} + measured {measure} steps, in whole syncs of {every}): --steps "
            f"{needed}, or --warmup-steps/--measure-steps"
        )
    rows = []
    for sim_plan in plans:
        row = figures(
            run_sim(sim_plan, seed=seed, profiles_path=path),
            gpus,
            workload=sim_plan.workload,
            warmup_steps=warmup,
            measure_steps=measure,
            sync_every=every,
        )
        row.update(model=sim_plan.model, workload=sim_plan.workload, gpus=gpus)
        rows.append(row)
        if as_json:
            typer.echo(json.dumps(row))
    if as_json:
        return
    base = rows[0]["trainer_tokens_per_s"] or 1.0
    table = Table(title=f"{cfg.name}: {rows[0]['model']}, {rows[0]['workload']}, {gpus} GPUs")
    for col in (
        "mode",
        "steps",
        "sim h",
        "tokens/s",
        "fresh tokens/s",
        "vs first",
        "trainer idle",
        "rollout idle",
        "X*",
        "X/X*",
        "placements",
        "real s",
    ):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["mode"],
            str(r["steps"]),
            f"{r['sim_hours']:.2f}",
            f"{r['trainer_tokens_per_s']:.0f}",
            f"{r['fresh_tokens_per_s']:.0f}",
            f"{r['trainer_tokens_per_s'] / base:.2f}x",
            f"{r['trainer_idle_ratio']:.1%}",
            f"{r['rollout_idle_ratio']:.1%}",
            f"{r['bound_tokens_per_s']:.0f}",
            f"{r['efficiency']:.2f}" if r["efficiency"] is not None else "-",
            " -> ".join(r["placements"]),
            f"{r['real_s']:.1f}",
        )
    out.print(table)
    for r in rows:
        line = sim_eval_line(r.get("evals"))
        if line:
            out.print(f"{r['mode']}: {line}")


@app.command()
def logs(
    run: Annotated[Optional[str], typer.Argument(help="run name or folder; default newest")] = None,  # noqa: UP045
    rank: Annotated[int, typer.Option(help="which rank's log", parser=numbers.RANK)] = 0,
    tail: Annotated[int, typer.Option(help="last N lines (0 = all)", parser=numbers.LINES)] = 100,
) -> None:
    """Print a rank's log."""
    paths = find_run(run)
    path = paths.rank_log(rank)
    if not path.is_file():
        raise UserError(f"{path}: no log for rank {rank}")
    lines = path.read_text(errors="replace").splitlines()
    print("\n".join(lines[-tail:] if tail else lines))


def _click_errors() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """(usage errors, other click errors) of click and of typer's own copy of it (typer
    0.20 and later vendor click as ``typer._click``: its exceptions are not click's, and
    an unknown option printed "internal error: NoSuchOption")."""
    import click

    usage: list[type] = [click.exceptions.UsageError]
    other: list[type] = [click.exceptions.ClickException]
    vendored = getattr(getattr(typer, "_click", None), "exceptions", None)
    if vendored is not None:
        usage.append(vendored.UsageError)
        other.append(vendored.ClickException)
    return tuple(usage), tuple(other)


def main() -> None:
    if os.environ.get("REFLOW_DEBUG") == "1":
        app()
        return
    try:
        # Outside standalone mode click returns the code of a typer.Exit instead of
        # exiting with it (`launch --wait` of a failed run raises Exit(1)).
        code = app(standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except USER_ERRORS as exc:
        err.print(f"reflow: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except Exception as exc:
        usage, other = _click_errors()
        if isinstance(exc, usage):  # a bad option or value: one line, as a UserError
            err.print(f"reflow: {exc.format_message()}", markup=False, highlight=False)
            sys.exit(2)
        if isinstance(exc, other):
            exc.show()
            sys.exit(exc.exit_code)
        err.print(
            f"reflow: internal error: {type(exc).__name__}: {exc} (REFLOW_DEBUG=1 shows more)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(1)


if __name__ == "__main__":
    main()
