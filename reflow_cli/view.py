"""Rich renderings of a run's status and of a launch plan."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from jobs.allocation import RankPlan

STATE_STYLE = {
    "STARTING": "yellow",
    "RUNNING": "green",
    "STOPPING": "yellow",
    "COMPLETED": "bold green",
    "STOPPED": "cyan",
    "FAILED": "bold red",
}


def status_view(s: dict[str, Any]) -> Group:
    state = s.get("state", "?")
    layout = s.get("layout") or {}
    head = Text.assemble(
        ("run ", "dim"),
        (str(s.get("run", "?")), "bold"),
        ("  state ", "dim"),
        (state, STATE_STYLE.get(state, "")),
        ("  step ", "dim"),
        f"{s.get('step', 0)}/{s.get('total_steps', '?')}",
        ("  policy v", "dim"),
        str(s.get("policy_version", 0)),
        ("  layout ", "dim"),
        f"{layout.get('rollout_gpus', '?')} rollout : {layout.get('trainer_gpus', '?')} trainer",
    )
    parts: list[Any] = [head]
    total = s.get("total_steps")
    if isinstance(total, int) and total > 0:
        parts.append(progress_bar(int(s.get("step", 0)), total))
    slurm = s.get("slurm")
    if slurm:
        parts.append(
            Text(
                f"slurm job {slurm.get('job_id')}  {slurm.get('state')}  nodes "
                f"{slurm.get('nodes') or '-'}  time {slurm.get('elapsed') or '-'} of "
                f"{slurm.get('time_limit') or '-'}",
                "dim",
            )
        )
    if layout.get("pending"):
        parts.append(Text(f"rebalance to {layout['pending']} pending (next sync point)", "yellow"))
    if layout.get("switching"):
        parts.append(Text(f"switching to layout epoch {layout.get('epoch')}", "yellow"))
    alloc = s.get("allocator") or {}
    if alloc.get("auto") or alloc.get("decisions"):
        line = f"allocator: auto {'on' if alloc.get('auto') else 'off'}"
        decided = [d for d in alloc.get("decisions", []) if d.get("rollout_rate") is not None]
        if decided:
            d = decided[-1]
            verb = "moved" if d.get("applied") else "kept"
            line += (
                f"; step {d['step']}: {verb} {d['current']} -> {d['best']} ({d['reason']}); "
                f"rates rollout {d['rollout_rate']:.2f}/rank-s, trainer "
                f"{d['trainer_rate']:.2f}/rank-s"
            )
        parts.append(Text(line, "dim"))
    lends = s.get("lends")
    if lends:
        parts.append(Text(lend_line(lends), "yellow" if lends.get("lent_now") else "dim"))
    for line in eval_lines(s.get("evals") or {}):
        parts.append(Text(line))
    ckpt = s.get("checkpoint") or {}
    resumed = s.get("resumed")
    if ckpt.get("last") or resumed or ckpt.get("pending"):
        line = f"attempt {s.get('attempt', 1)}"
        if resumed:
            line += f" (resumed from {resumed['from']})"
        last = ckpt.get("last")
        line += f"; last checkpoint: step {last['step']}" if last else "; no checkpoint yet"
        if ckpt.get("failed"):
            line += f"; {ckpt['failed']} failed"
        if ckpt.get("pending"):
            line += f"; writing step {ckpt['pending']['step']}"
        parts.append(Text(line, "dim"))
    if s.get("reason"):
        parts.append(Text(f"reason: {s['reason']}", "red" if state == "FAILED" else "dim"))
    if s.get("stale"):
        parts.append(Text("coordinator not answering: last saved status shown", "dim"))
    table = Table(box=None, pad_edge=False)
    for col in ("rank", "node", "pid", "role", "state", "heartbeat age", "waiting on"):
        table.add_column(col, justify="right" if col in ("rank", "pid") else "left")
    for w in s.get("workers", []):
        age = w.get("heartbeat_age_s")
        table.add_row(
            str(w.get("rank")),
            Text(str(w.get("node"))),  # Text: what a rank sent is not read as markup
            str(w.get("pid")),
            str(w.get("role")),
            str(w.get("state")),
            f"{age:.1f} s" if isinstance(age, (int, float)) else "-",
            Text(str(w.get("waiting_on") or "")),
        )
    parts.append(table)
    for wait in s.get("waits") or []:
        parts.append(
            Text(
                f"rank 0 waits on {wait['what']} from ranks {wait['from']} for "
                f"{wait['for_s']:.1f} s (bound: {wait['bound']})",
                "dim",
            )
        )
    buffer = s.get("buffer") or {}
    if buffer:
        evicted = buffer.get("evicted") or {}
        ev = ", ".join(f"{k} {v}" for k, v in evicted.items()) or "none"
        parts.append(
            Text(
                f"buffer: unused {buffer.get('unused', 0)}  replay {buffer.get('replay', 0)}  "
                f"waiting for group {buffer.get('waiting_for_group', 0)}  "
                f"in batch {buffer.get('in_batch', 0)}  consumed {buffer.get('consumed', 0)}  "
                f"replay fraction (recent) {buffer.get('replay_fraction_recent', 0):.2f}\n"
                f"rollout: pending {buffer.get('pending', 0)}  running "
                f"{buffer.get('running', 0)}  delivered {buffer.get('delivered', 0)}  "
                f"evicted: {ev}  trainer idle {buffer.get('trainer_idle_s', 0):.1f} s"
            )
        )
    control = s.get("control") or {}
    if control.get("rejected"):
        parts.append(Text(f"control plane: {control['rejected']} invalid messages dropped", "dim"))
    return Group(*parts)


def progress_bar(step: int, total: int, width: int = 40) -> Text:
    done = min(width, round(width * step / total))
    return Text.assemble(
        ("[" + "#" * done + "." * (width - done) + "] ", "green"),
        f"{100 * step / total:.0f}% of {total} steps",
    )


def plan_view(plan: list[RankPlan]) -> Table:
    table = Table(title="ranks at start", box=None, pad_edge=False)
    table.add_column("node", justify="right")
    table.add_column("ranks")
    table.add_column("roles (replica group)")
    nodes: dict[int, list[RankPlan]] = {}
    for r in plan:
        nodes.setdefault(r.node, []).append(r)
    for node, ranks in nodes.items():
        table.add_row(
            str(node),
            f"{ranks[0].rank}-{ranks[-1].rank}" if len(ranks) > 1 else str(ranks[0].rank),
            " ".join(f"{r.rank}:{r.role.value[0]}{r.group}" for r in ranks),
        )
    return table


def eval_lines(evals: dict[str, Any]) -> list[str]:
    """One line per held-out set: its figures at the start and at the latest eval."""
    out = []
    for name, when in sorted(evals.items()):
        start, last = when.get("start") or {}, when.get("last") or {}
        figures = [k for k in (last or start) if k not in ("prompts", "unscored")]
        shown = []
        for k in figures:
            before = f"{start[k]:.3f} -> " if k in start and last else ""
            now = last.get(k, start.get(k))
            shown.append(f"{k} {before}{now:.3f}")
        prompts = int((last or start).get("prompts", 0))
        out.append(f"eval {name} ({prompts} prompts): " + ", ".join(shown))
    return out


def lend_line(lends: dict) -> str:
    """The trainer's lends (scheduler.lend_trainer): now, so far, and what they cost."""
    now = f"{lends['lent_now']} trainer group(s) lent now" if lends.get("lent_now") else "none now"
    return (
        f"lends: {now}; {lends.get('lends', 0)} done, {lends.get('paid', 0)} paid; margin "
        f"{lends.get('margin')}; switch {lends.get('lend_s')} s out, "
        f"{lends.get('reclaim_s')} s back"
    )


def sim_eval_line(evals: dict[str, Any] | None) -> str | None:
    """A simulated run's held-out eval rounds and their cost, in one line (None: none)."""
    if not evals:
        return None
    parts = [f"{evals['rounds']} eval rounds of {evals['episodes_per_round']} episodes"]
    if evals["round_s_mean"] is not None:
        parts.append(f"{evals['round_s_mean']:.0f} s each during training")
    if evals.get("shared"):
        parts.append("every engine plays them inside a rollout phase, which waits for them")
    if evals["share_of_rollout"] is not None:
        parts.append(f"{evals['share_of_rollout']:.1%} of rollout GPU time")
    if evals["end_round_s"] is not None:
        parts.append(f"the end's round {evals['end_round_s']:.0f} s after the last step")
    if evals["incomplete"]:
        parts.append(f"{evals['incomplete']} incomplete (eval.timeout_s)")
    return ", ".join(parts) + " (simulated)"
