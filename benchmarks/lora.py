"""LoRA against full fine-tuning on the CPU demo: held-out reward and weight syncs.

Three real runs of the demo (4 local ranks, vLLM CPU build + torch), one after another:
full-parameter (``recipes/demo.yaml``), LoRA syncing the adapter and LoRA syncing the
merged weights (``recipes/demo_lora.yaml``, ``model.lora.sync`` adapter / merged). Per run:
held-out reward at the start and the end, wall seconds, and per weight publication the
bytes sent, the leader's seconds to send them (``weight_sync_s``) and the rollout engines'
seconds paused for it (from their ``weight_sync`` idle share: pause, load, resume):

    .venv/bin/python benchmarks/lora.py [--steps 400] [--out reports/lora]
    .venv/bin/python benchmarks/lora.py --report-only reports/lora

Writes ``lora.md`` and ``lora.json`` to ``--out``. One run per arm: a single seed, said so.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

try:  # imported as benchmarks.lora or run as a script (benchmarks/ on the path)
    from benchmarks.modes import REPO, cli
except ModuleNotFoundError:
    from modes import REPO, cli

ARMS = {
    "full": ("recipes/demo.yaml", []),
    "lora_adapter": ("recipes/demo_lora.yaml", ["model.lora.sync=adapter"]),
    "lora_merged": ("recipes/demo_lora.yaml", ["model.lora.sync=merged"]),
}


def run_arm(arm: str, steps: int, out: Path) -> Path:
    recipe, sets = ARMS[arm]
    args = ["launch", str(REPO / recipe), "--local", "--wait", "--set", f"name=lora-{arm}"]
    for s in [f"train.steps={steps}", *sets]:
        args += ["--set", s]
    done = cli(*args, runs=out)
    run_dir = max(out.glob(f"lora-{arm}-*"), key=lambda d: d.stat().st_mtime)
    if done.returncode != 0:
        raise SystemExit(f"{arm}: the run failed; see {run_dir}")
    return run_dir


def summarize(arm: str, run_dir: Path) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    if summary["state"] != "COMPLETED":
        raise SystemExit(f"{run_dir}: {summary['state']} ({summary.get('reason')})")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    syncs = [m for m in lines if m.get("weight_sync_bytes")]
    window = lines[-1]["wall_s"] - lines[0]["wall_s"]
    # rollout seconds paused for syncs: the weight_sync share of the rollout ranks' time
    rollout_ranks = 2  # the demo's 2:2 split, which it keeps (no allocator)
    paused = summary["rollout_idle_by_cause"].get("weight_sync", 0.0) * window * rollout_ranks
    return {
        "arm": arm,
        "run": run_dir.name,
        "steps": summary["steps"],
        "eval_start": summary["eval_reward_start"],
        "eval_end": summary["eval_reward_end"],
        "wall_s": summary["wall_s"],
        "trainer_tokens_per_s": summary["trainer_tokens_per_s"],
        "lost": summary["samples"]["lost"],
        "syncs": len(syncs),
        "sync_bytes": statistics.median(m["weight_sync_bytes"] for m in syncs) if syncs else 0,
        "sync_send_s": statistics.median(m["weight_sync_s"] for m in syncs) if syncs else 0,
        "rollout_paused_s_per_sync": paused / len(syncs) / rollout_ranks if syncs else 0.0,
    }


def report(rows: list[dict], out: Path) -> str:
    full = next((r for r in rows if r["arm"] == "full"), None)
    head = (
        "| arm | held-out reward start -> end | gain | of full's gain | wall s | "
        "bytes / sync | send s / sync | rollout paused s / sync | lost |\n"
        "|---|---|---|---|---|---|---|---|---|\n"
    )
    body = ""
    for r in rows:
        gain = r["eval_end"] - r["eval_start"]
        of_full = ""
        if full is not None and full["eval_end"] > full["eval_start"]:
            of_full = f"{gain / (full['eval_end'] - full['eval_start']):.2f}"
        body += (
            f"| {r['arm']} | {r['eval_start']:.3f} -> {r['eval_end']:.3f} | {gain:+.3f} | "
            f"{of_full} | {r['wall_s']:.0f} | {r['sync_bytes']:,.0f} | "
            f"{r['sync_send_s'] * 1e3:.1f} ms | {r['rollout_paused_s_per_sync'] * 1e3:.1f} ms | "
            f"{r['lost']} |\n"
        )
    text = head + body
    (out / "lora.md").write_text(text)
    (out / "lora.json").write_text(json.dumps(rows, indent=1))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--out", type=Path, default=REPO / "reports/lora")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--report-only", type=Path, default=None)
    a = ap.parse_args(argv)
    if a.report_only is not None:
        out = a.report_only
        runs = {arm: max(out.glob(f"lora-{arm}-*"), default=None) for arm in ARMS}
        rows = [summarize(arm, d) for arm, d in runs.items() if d is not None]
    else:
        out = a.out
        out.mkdir(parents=True, exist_ok=True)
        rows = []
        for arm in a.arms.split(","):
            if arm not in ARMS:
                raise SystemExit(f"--arms: {arm!r} is not one of {', '.join(ARMS)}")
            rows.append(summarize(arm, run_arm(arm, a.steps, out)))
    print(report(rows, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
