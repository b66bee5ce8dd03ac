"""The learning report as Markdown and plots (the figures are learning_report.build's)."""

from __future__ import annotations

from pathlib import Path

try:
    from benchmarks import learning_plan as plan
except ModuleNotFoundError:
    import learning_plan as plan

CLOCK = (
    "training clock: wall seconds since the run's first training step (rank 0's clock) "
    "minus the seconds the trainer leader spent in held-out evals up to then"
)


def fmt(s: dict | None, f: str, unit: str = "") -> str:
    if s is None:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['mean']:{f}}{unit}"
    return f"{s['mean']:{f}}{unit} [{s['min']:{f}}-{s['max']:{f}}]"


def status_lines(st: dict[str, list[str]]) -> list[str]:
    out = [
        f"Arms: {len(st['recorded'])} recorded, {len(st['busy'])} busy (seconds left out), "
        f"{len(st['failed'])} failed, {len(st['missing'])} missing (in no figure)."
    ]
    for key in ("busy", "failed", "missing"):
        if st[key]:
            out.append(f"- {key}: {', '.join(st[key])}")
    return out


def render(rep: dict, *, plot_note: str) -> str:
    out = [
        "# Time to reward: the learning report",
        "",
        f"Built from the arm records in `docs/learning/` (commits: "
        f"{', '.join(c[:12] for c in rep['commits'])}). Figures are the mean over seeds "
        f"[min-max]. Seconds: {CLOCK}; an arm marked busy is in no seconds figure. The "
        "policy before training (step 0) does not count as reaching a level. Area: the mean "
        "held-out reward over the run's steps (trapezoids between evals). Late rollout "
        "reward: the mean reward of the generated samples (every group, before the sampler) "
        "over the last tenth of the steps, the policy's own reward on the training "
        "distribution; a held-out eval is one noisy point (a policy moves by several "
        "hundredths between two evals 25 steps apart), this is thousands of samples.",
    ]
    out += modes_section(rep["modes"])
    out += equivalence_section(rep["equivalence"])
    out += variants_section("Settings chosen by learning (demo, reflow)", rep["variants"])
    out += variants_section("Multi-turn settings (examples/arith_retry, reflow)", rep["multiturn"])
    if "projection" in rep:
        try:
            from benchmarks.learning_projection import render_projection
        except ModuleNotFoundError:
            from learning_projection import render_projection
        out += render_projection(rep["projection"])
    if rep["unplanned"]:
        out += ["", f"Records outside the plan (in no section): {', '.join(rep['unplanned'])}."]
    out += ["", plot_note]
    return "\n".join(out) + "\n"


def modes_section(m: dict) -> list[str]:
    out = [
        "",
        f"## The four modes, demo recipe, {plan.DEMO_STEPS} steps, eval every "
        f"{plan.DEMO_EVAL_EVERY}",
        "",
        *status_lines(m["status"]),
    ]
    if not m["groups"]:
        return out
    l1, l2 = m["levels"]
    out += [
        "",
        f"Levels: **{l1:.3f}** (the lowest every arm reached) and **{l2:.3f}** (the median "
        "of the arms' best: about half reach it).",
        "",
        "| mode | arms (seeds) | final reward | area | late rollout reward | "
        f"reached {l1:.3f} | steps to it | seconds to it | reached {l2:.3f} | steps to it | "
        "seconds to it | fresh share of trained | training clock s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, g in m["groups"].items():
        seeds = ", ".join(map(str, g["seeds"]))
        busy = f"; busy {', '.join(map(str, g['busy']))}" if g["busy"] else ""
        cells = [
            f"{name}",
            f"{g['arms']} ({seeds}{busy})",
            fmt(g["final"], ".3f"),
            fmt(g["area"], ".3f"),
            fmt(g["late_rollout_reward"], ".3f"),
        ]
        for key in ("level1", "level2"):
            lv = g[key]
            cells += [
                f"{lv['reached']}/{g['arms']}",
                fmt(lv["steps"], ".0f"),
                fmt(lv["seconds"], ".0f"),
            ]
        cells += [fmt(g["fresh_share"], ".2f"), fmt(g["train_s"], ".0f")]
        out.append("| " + " | ".join(cells) + " |")
    out += [
        "",
        f"What the spread supports, pair by pair (the ranges over seeds overlap: "
        f"indistinguishable; levels: the first, {l1:.3f}; sentences with both ranges in "
        "learning.json):",
        "",
        "| pair | final reward | area | steps to the level | seconds to it |",
        "|---|---|---|---|---|",
    ]
    for p in m["pairs"]:
        a, b = p["pair"]
        out.append(f"| {a} / {b} | {p['final']} | {p['area']} | {p['steps']} | {p['seconds']} |")
    return out


def equivalence_section(e: dict) -> list[str]:
    out = [
        "",
        "## Equivalence: reflow with sigma = 0 and delta = 0 against disaggregated_sync",
        "",
        *status_lines(e["status"]),
        "",
        f"Verdict: **{e['verdict']}**.",
    ]
    if "disaggregated_sync" not in e:
        return out
    gs, gf = e["disaggregated_sync"], e["reflow_sync_in_effect"]
    k, n = e["eval_steps_overlapping"]
    out += [
        "",
        "| | arms | final reward | area | late rollout reward | max sample age | replayed samples "
        "| training clock s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, g in (("disaggregated_sync", gs), ("reflow, sigma 0, delta 0", gf)):
        out.append(
            f"| {name} | {g['arms']} | {fmt(g['final'], '.3f')} | {fmt(g['area'], '.3f')} | "
            f"{fmt(g['late_rollout_reward'], '.3f')} | {g['max_age']} | {g['replayed']} | "
            f"{fmt(g['train_s'], '.0f')} |"
        )
    out += ["", f"Eval steps whose min-max ranges overlap: {k} of {n}."]
    return out


def variants_section(title: str, variants: dict) -> list[str]:
    out = ["", f"## {title}", ""]
    out += [
        "A variant is no worse when its mean area is at least the default's on the same "
        "seeds; a default may change only if it is no worse on the choosing seeds and again "
        "on the confirming ones.",
        "",
        "| variant | seeds | default area | variant area | default final | variant final | "
        "stale tokens, default | stale tokens, variant | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in variants.items():
        for r in v["rows"]:
            seeds = ",".join(map(str, r["seeds"]))
            if "default_area" not in r:
                out.append(f"| {name} | {seeds} | - | - | - | - | - | - | {r['verdict']} |")
                continue
            out.append(
                f"| {name} | {seeds} | {fmt(r['default_area'], '.3f')} | "
                f"{fmt(r['variant_area'], '.3f')} | {fmt(r['default_final'], '.3f')} | "
                f"{fmt(r['variant_final'], '.3f')} | {fmt(r['default_stale_tokens'], '.0f')} | "
                f"{fmt(r['variant_stale_tokens'], '.0f')} | {r['verdict']} |"
            )
    return out


def plots(rep: dict, out: Path) -> str:
    """reward_vs_step.png and reward_vs_time.png of the four modes (mean line, min-max band
    over seeds, the two levels dashed). Returns the report's line about them."""
    groups = rep["modes"]["groups"]
    if not groups:
        return "No plots: no mode has a recorded arm."
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "No plots: matplotlib is not importable (`pip install -e '.[bench]'`)."
    names = []
    for key, xlabel, name in (
        ("vs_step", "training step", "reward_vs_step.png"),
        ("vs_time", "seconds of training clock (evals taken out)", "reward_vs_time.png"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode, g in groups.items():
            b = g[key]
            if b is None:  # every arm of the mode busy: no seconds to draw
                continue
            n = g["arms"] - (len(g["busy"]) if key == "vs_time" else 0)  # seconds: quiet only
            (line,) = ax.step(b["x"], b["mean"], where="post", label=f"{mode} ({n} arms)")
            ax.fill_between(
                b["x"], b["min"], b["max"], step="post", alpha=0.15, color=line.get_color()
            )
        for lv in rep["modes"]["levels"]:
            ax.axhline(lv, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out reward (mean, min-max)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names.append(f"`{name}`")
    return f"Plots: {', '.join(names)} (mean line, min-max band over seeds, levels dashed)."
