"""benchmarks/learning.py's report, from arm records written here: figures over seeds, the
training clock, busy and missing arms, the equivalence check, the variants' verdicts and
the projection; and the record made from a run folder as the runtime writes it."""

import json
import os
import subprocess
import sys
import time
from collections import Counter

import pytest

from benchmarks import learning, learning_arms, learning_plan, learning_projection
from benchmarks import learning_report as report

pytestmark = pytest.mark.unit

EVALS = (0, 100, 200, 300, 400)


def write_record(
    folder,
    spec,
    rewards,
    *,
    dt=1.0,
    eval_s=2.0,
    busy=None,
    problem=None,
    replayed=0,
    max_age=1,
    stale=100,
):
    """An arm's record as learning_arms.record_from_run writes it: rewards at EVALS, each
    step ``dt`` wall seconds, each eval after training ``eval_s`` seconds."""
    steps = list(range(1, spec.steps + 1))
    evals, spent = [], 0.0
    for s, r in zip(EVALS, rewards, strict=True):
        spent += eval_s if s else 0.0
        wall = 0.0 if s == 0 else (s - 1) * dt + spent
        evals.append({"step": s, "wall_s": wall, "eval_s": spent, "reward": r, "figures": {}})
    rec = {
        "format": learning_arms.RECORD_FORMAT,
        "arm": spec.to_json(),
        "name": spec.name,
        "commit": "abc123",
        "run_folder": "x",
        "held_out": "eval_reward",
        "machine": {"busy": busy},
        "problem": problem,
        "steps": {
            "step": steps,
            "wall_s": [(s - 1) * dt for s in steps],
            "fresh": [32 - replayed] * len(steps),
            "replayed": [replayed] * len(steps),
            "max_age": [max_age] * len(steps),
            # the generated samples' reward: the curve's last value over the last tenth
            "rollout_reward": [None] * (len(steps) - 40) + [rewards[-1]] * 40,
        },
        "evals": evals,
        "summary": {"state": "COMPLETED", "wasted_tokens": {"stale_unused": stale}},
    }
    learning_arms.write_record(rec, folder)
    return rec


# mode -> seed -> held-out reward at EVALS; seconds per step
CURVES = {
    "colocated_sync": ({0: (0.2, 0.25, 0.30, 0.32, 0.34), 1: (0.2, 0.24, 0.29, 0.33, 0.35)}, 2.0),
    "one_step_off": ({0: (0.2, 0.26, 0.31, 0.33, 0.36), 1: (0.2, 0.25, 0.30, 0.34, 0.37)}, 1.0),
    "async": ({0: (0.2, 0.27, 0.30, 0.35, 0.36), 1: (0.2, 0.26, 0.31, 0.35, 0.38)}, 1.0),
    "reflow": ({0: (0.2, 0.30, 0.36, 0.40, 0.42), 1: (0.2, 0.31, 0.35, 0.41, 0.44)}, 0.8),
}


@pytest.fixture
def folder(tmp_path):
    arms = tmp_path / "arms"
    for mode, (seeds, dt) in CURVES.items():
        for seed, rewards in seeds.items():
            busy = "foreign load 1.20 runnable threads" if (mode, seed) == ("async", 1) else None
            write_record(arms, learning_plan.demo(mode, seed), rewards, dt=dt, busy=busy)
    return tmp_path


def test_the_training_clock_takes_the_evals_out(tmp_path):
    spec = learning_plan.demo("reflow", 0)
    rec = write_record(tmp_path, spec, (0.2, 0.3, 0.3, 0.4, 0.5), dt=1.0, eval_s=5.0)
    arm = report.arm_from_record({**rec, "spec": spec})
    # step 100's eval: wall 99 + 5 s of its own eval, clock 99
    assert arm.evals[1] == (100, 99.0, 0.3)
    assert arm.evals[-1] == (400, 399.0, 0.5)
    assert arm.area == pytest.approx((0.25 + 0.3 + 0.35 + 0.45) / 4)


def test_missing_and_busy_arms(folder):
    rep = report.build(folder / "arms")
    m = rep["modes"]
    st = m["status"]
    # seed 2 of every mode was never run: listed as missing, in no figure
    assert sorted(st["missing"]) == sorted(f"demo-{x}-s2" for x in CURVES)
    assert st["busy"] == ["demo-async-s1"]
    a = m["groups"]["async"]
    assert a["arms"] == 2 and a["busy"] == [1]
    # its steps and rewards count; its seconds do not
    assert a["final"]["n"] == 2 and a["level1"]["steps"]["n"] == 2
    assert a["level1"]["seconds"]["n"] == 1 and a["train_s"]["n"] == 1
    md = learning.render.render(rep, plot_note="p")
    assert "- missing: demo-colocated_sync-s2" in md
    assert "busy: demo-async-s1" in md
    assert "| async | 2 (0, 1; busy 1) |" in md


def test_levels_and_steps_to_them(folder):
    m = report.build(folder / "arms")["modes"]
    l1, l2 = m["levels"]
    # the bests: 0.34 0.35 0.36 0.37 0.36 0.38 0.42 0.44 -> lowest 0.34, median 0.365
    assert l1 == 0.34 and l2 == pytest.approx(0.365)
    r, c = m["groups"]["reflow"], m["groups"]["colocated_sync"]
    assert r["level1"]["steps"]["mean"] == 200  # 0.36 and 0.35 at step 200
    assert c["level1"]["steps"]["mean"] == 400  # 0.34 and 0.35 at 400; 0.33 at 300 misses
    assert m["groups"]["one_step_off"]["level1"]["steps"]["min"] == 300  # 0.34 at 300
    assert c["level2"]["reached"] == 0 and c["level2"]["steps"] is None
    assert c["late_rollout_reward"]["min"] == 0.34 and c["late_rollout_reward"]["max"] == 0.35
    # reflow's seconds: step 200 at 0.8 s per step, evals out
    assert r["level1"]["seconds"]["mean"] == pytest.approx(199 * 0.8)


def test_comparisons_say_no_more_than_the_spread(folder):
    comps = report.build(folder / "arms")["modes"]["comparisons"]
    final = [c for c in comps if "colocated_sync" in c and "reflow" in c and "final" in c]
    assert final == [
        "reflow higher than colocated_sync on final reward: the ranges do not overlap "
        "(colocated_sync 0.340-0.350, reflow 0.420-0.440; 2 and 2 arms)."
    ]
    osf = [c for c in comps if "one_step_off and async" in c and "final" in c]
    assert "indistinguishable" in osf[0]
    # async's seconds come from one quiet arm: not compared
    secs = [c for c in comps if "async and reflow" in c and "seconds" in c]
    assert "one arm has no spread" in secs[0]
    rep = report.build(folder / "arms")
    pairs = {p["pair"]: p for p in rep["modes"]["pairs"]}
    assert pairs["colocated_sync", "reflow"] == {
        "pair": ("colocated_sync", "reflow"),
        "final": "reflow higher",
        "area": "reflow higher",
        "steps": "reflow faster",  # 400 against 200 steps
        "seconds": "reflow faster",
    }
    assert pairs["async", "reflow"]["seconds"] == "not compared"
    md = learning.render.render(rep, plot_note="p")
    assert "| one_step_off / async | indistinguishable | async higher |" in md


def test_equivalence_checks_mechanics_and_learning(tmp_path):
    arms = tmp_path / "arms"
    for seed in (0, 1, 2):
        base = (0.2, 0.25, 0.3, 0.32, 0.34 + 0.01 * seed)
        write_record(arms, learning_plan.demo("disaggregated_sync", seed), base, max_age=0)
        flow = learning_plan.demo("reflow", seed, learning_plan.SYNC_IN_EFFECT)
        write_record(arms, flow, (0.2, 0.25, 0.3, 0.32, 0.35 - 0.01 * seed), max_age=0)
    e = report.build(arms)["equivalence"]
    assert e["verdict"].startswith("holds")
    assert e["eval_steps_overlapping"] == (5, 5)
    # a batch that took a sample one version old: not synchronous, whatever it learned
    flow = learning_plan.demo("reflow", 1, learning_plan.SYNC_IN_EFFECT)
    write_record(arms, flow, (0.2, 0.26, 0.3, 0.33, 0.34), max_age=1)
    e = report.build(arms)["equivalence"]
    assert e["verdict"].startswith("FAILS in mechanics: reflow took samples up to 1")
    # synchronous, but learning apart
    for seed in (0, 1, 2):
        flow = learning_plan.demo("reflow", seed, learning_plan.SYNC_IN_EFFECT)
        write_record(arms, flow, (0.2, 0.1, 0.1, 0.1, 0.1), max_age=0)
    e = report.build(arms)["equivalence"]
    assert e["verdict"].startswith("FAILS in learning: the ranges of final, area")
    assert e["apart"] == ["final", "area", "late_rollout_reward"]


def test_a_variant_changes_the_default_only_when_confirmed(tmp_path):
    arms = tmp_path / "arms"
    v = ("reflow.sigma=0.25",)
    for seed in (0, 1, 2, 3, 4, 5):
        write_record(arms, learning_plan.demo("reflow", seed), (0.2, 0.3, 0.3, 0.3, 0.3))
        better = seed < 3  # chosen on 0-2, worse on 3-5
        rewards = (0.2, 0.31, 0.31, 0.31, 0.31) if better else (0.2, 0.29, 0.29, 0.29, 0.29)
        write_record(arms, learning_plan.demo("reflow", seed, v), rewards)
    sig = report.build(arms)["variants"]["reflow.sigma=0.25"]
    assert [r["verdict"] for r in sig["rows"]] == ["no worse", "worse"]
    assert sig["default_may_change"] is False
    other = report.build(arms)["variants"]["reflow.delta=2"]
    assert [r["verdict"] for r in other["rows"]] == ["missing arms", "missing arms"]
    assert other["default_may_change"] is False


def test_confirming_seeds_are_asked_only_of_a_variant_no_worse_on_the_choosing_ones(tmp_path):
    """The multi-turn variants: the age rule, no worse on seeds 0-2, waits for its
    confirming seeds (the default cannot change before); delta 2, worse on 0-2, is settled
    and its confirming seeds are not run (not "missing")."""
    arms = tmp_path / "arms"
    age, delta = learning_plan.MULTITURN_VARIANTS
    for seed in (0, 1, 2):
        write_record(arms, learning_plan.retry(seed), (0.2, 0.3, 0.3, 0.3, 0.3))
        write_record(arms, learning_plan.retry(seed, age), (0.2, 0.3, 0.31, 0.3, 0.3))
        write_record(arms, learning_plan.retry(seed, delta), (0.2, 0.29, 0.29, 0.29, 0.29))
    turns = report.build(arms)["multiturn"]
    assert [r["verdict"] for r in turns[age[0]]["rows"]] == ["no worse", "missing arms"]
    assert turns[age[0]]["default_may_change"] is False
    settled = [r["verdict"] for r in turns[delta[0]]["rows"]]
    assert settled == ["worse", "not run: worse on the choosing seeds"]
    # the plan runs the age rule's confirming seeds, with the default beside it
    confirm = {a.name for a in learning_plan.PLANS["multiturn-confirm"]}
    assert confirm == {learning_plan.retry(seed, v).name for seed in (3, 4, 5) for v in ((), age)}


def test_projection_multiplies_steps_by_simulated_step_time(folder):
    rows = [
        {
            "workload": "math",
            "model": "qwen3-8b",
            "gpus": 16,
            "mode": m,
            "protocol": {"step_s_mean": s},
        }
        for m, s in (
            ("colocated_sync", 10.0),
            ("one_step_off", 8.0),
            ("async", 6.0),
            ("reflow", 5.0),
        )
    ]
    rows.append(  # the best placement's row wins over the default's
        {"workload": "math", "model": "qwen3-8b", "gpus": 16, "mode": "async, best placement",
         "protocol": {"step_s_mean": 4.0}, "placement_search": {"best": "12:4"}}
    )  # fmt: skip
    rows.append(  # an ablation is left out
        {"workload": "math", "model": "qwen3-8b", "gpus": 16, "mode": "reflow, replay off",
         "protocol": {"step_s_mean": 1.0}}
    )  # fmt: skip
    grid = learning_projection.distill(rows, source="t", commit="c")
    assert grid["cells"]["math:qwen3-8b:16"]["async"]["step_s"] == 4.0
    assert grid["cells"]["math:qwen3-8b:16"]["reflow"]["step_s"] == 5.0
    rep = report.build(folder / "arms", grid)
    (cell,) = rep["projection"]["cells"]
    # steps to 0.34: colocated 400 x 10 s, one_step_off 350 x 8 s, async 300 x 4 s (its
    # best placement), reflow 200 x 5 s
    steps = {m: s["mean"] for m, s in rep["projection"]["steps"].items()}
    assert steps == {"colocated_sync": 400, "one_step_off": 350, "async": 300, "reflow": 200}
    assert cell["best_baseline"] == "async"
    assert cell["ratio"] == pytest.approx(1000 / 1200)
    assert cell["steps_ratio"] == pytest.approx(200 / 300)
    assert cell["step_time_ratio"] == pytest.approx(5 / 4)
    md = learning.render.render(rep, plot_note="p")
    assert "**A projection, not a measurement**" in md and "| math:qwen3-8b:16 |" in md


def test_report_only_rebuilds_from_records_alone(folder, capsys):
    learning.main(["--report-only", str(folder)])
    md = (folder / "learning.md").read_text()
    assert md == capsys.readouterr().out
    assert "## The four modes" in md and "Levels: **0.340**" in md
    data = json.loads((folder / "learning.json").read_text())
    assert data["modes"]["groups"]["reflow"]["arms"] == 2


def test_a_bad_record_is_one_line_naming_the_file(folder):
    (folder / "arms" / "demo-reflow-s0.json").write_text("{not json")
    with pytest.raises(SystemExit) as exc:
        learning.main(["--report-only", str(folder)])
    assert str(exc.value) == f"learning.py: {folder / 'arms' / 'demo-reflow-s0.json'}: not JSON"
    renamed = folder / "arms" / "demo-async-s0.json"
    rec = json.loads(renamed.read_text())
    rec["arm"]["seed"] = 7  # a record whose file name is not its arm's
    renamed.write_text(json.dumps(rec))
    with pytest.raises(learning_arms.BadRecord, match="its name is not its arm's"):
        learning_arms.read_record(renamed)


def test_record_from_a_run_folder(tmp_path):
    """A run folder as the runtime writes it: the start eval on step 1's line, eval_s on
    the lines whose step ran an eval, the end eval on the last."""
    spec = learning_arms.ArmSpec("recipes/demo.yaml", "reflow", 0, 4, 2)
    d = tmp_path / "run"
    d.mkdir()
    lines = [
        {"step": 1, "wall_s": 50.0, "eval_reward_start": 0.2, "batch_unused": 32},
        {"step": 2, "wall_s": 53.0, "eval_reward": 0.3, "eval_s": 1.5, "batch_unused": 16,
         "batch_replay": 16, "max_sample_age": 1, "rollout_reward_mean": 0.25},
        {"step": 3, "wall_s": 54.0, "batch_unused": 20, "batch_replay": 12},
        {"step": 4, "wall_s": 57.0, "eval_reward_end": 0.4, "eval_s": 1.0, "eval/gsm/greedy": 0.1},
    ]  # fmt: skip
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "summary.json").write_text(json.dumps({"state": "COMPLETED", "samples": {"lost": 0}}))
    rec = learning_arms.record_from_run(d, spec, commit="c", machine={"busy": None})
    assert rec["problem"] is None
    assert [(e["step"], e["wall_s"], e["eval_s"], e["reward"]) for e in rec["evals"]] == [
        (0, 0.0, 0.0, 0.2),
        (2, 3.0, 1.5, 0.3),
        (4, 7.0, 2.5, 0.4),
    ]
    assert rec["evals"][-1]["figures"] == {"eval_reward": 0.4, "eval/gsm/greedy": 0.1}
    assert rec["steps"]["fresh"] == [32, 16, 20, None]
    assert rec["steps"]["rollout_reward"] == [None, 0.25, None, None]
    # resumed, short, or failed: a problem, and the arm runs again
    lines[2]["attempt"] = 2
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    rec = learning_arms.record_from_run(d, spec, commit="c", machine={})
    assert rec["problem"] == "resumed: wall_s restarts at each attempt"
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))
    (d / "summary.json").write_text(json.dumps({"state": "FAILED", "reason": "x"}))
    assert learning_arms.record_from_run(d, spec, commit="c", machine={})["problem"] == (
        "state FAILED (x)"
    )


def test_a_record_takes_the_evals_of_the_rollout_engines_from_their_own_lines(tmp_path):
    """With vLLM rollout engines a data.eval set's eval is a line of its own, written when
    it ended, under the step that published its version; it stalls no training step."""
    spec = learning_arms.ArmSpec("examples/arith_retry/recipe.yaml", "reflow", 0, 4, 2)
    d = tmp_path / "run"
    d.mkdir()
    lines = [
        {"step": 1, "wall_s": 50.0, "batch_unused": 32},
        {"step": 0, "eval_version": 0, "eval_s": 9.0, "eval_start/gsm/greedy": 0.1},
        {"step": 2, "wall_s": 53.0},
        {"step": 3, "wall_s": 54.0},
        {"step": 2, "eval_version": 2, "eval_s": 8.0, "eval/gsm/greedy": 0.2},
        {"step": 4, "wall_s": 57.0},
        {"step": 4, "eval_version": 4, "eval_s": 7.0, "eval/gsm/greedy": 0.3},
    ]
    (d / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (d / "summary.json").write_text(json.dumps({"state": "COMPLETED", "samples": {"lost": 0}}))
    rec = learning_arms.record_from_run(d, spec, commit="c", machine={}, held_out="eval/gsm/greedy")
    assert rec["problem"] is None and rec["steps"]["step"] == [1, 2, 3, 4]
    assert [(e["step"], e["wall_s"], e["eval_s"], e["reward"]) for e in rec["evals"]] == [
        (0, 0.0, 0.0, 0.1),
        (2, 3.0, 0.0, 0.2),
        (4, 7.0, 0.0, 0.3),
    ]


def test_recorded_arms_are_skipped_and_failed_ones_run_again(tmp_path):
    spec = learning_plan.demo("async", 0)
    assert not learning.recorded(spec, tmp_path)
    write_record(tmp_path, spec, (0.2, 0.3, 0.3, 0.3, 0.3))
    assert learning.recorded(spec, tmp_path)
    write_record(tmp_path, spec, (0.2, 0.3, 0.3, 0.3, 0.3), problem="state FAILED (x)")
    assert not learning.recorded(spec, tmp_path)
    write_record(tmp_path, spec, (0.2, 0.3, 0.3, 0.3, 0.3), busy="foreign load 0.9")
    assert learning.recorded(spec, tmp_path)  # its steps count; its seconds are left out
    assert not learning.recorded(spec, tmp_path, rerun_busy=True)


def test_plans_name_each_arm_once_and_seed_major():
    arms = learning_plan.plan_arms(["equivalence", "modes"])
    assert len(arms) == 18 and len({a.name for a in arms}) == 18
    assert [a.seed for a in arms] == sorted(a.seed for a in arms)
    assert arms[1].name == "demo-reflow-delta0+sigma0-s0"
    with pytest.raises(ValueError, match="not a plan"):
        learning_plan.plan_arms(["nope"])


def test_a_foreign_busy_process_counts_as_foreign_and_a_child_as_the_runs(tmp_path):
    spin = [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 20: pass"]
    proc = subprocess.Popen(spin)
    try:
        seen_foreign = seen_own = 0
        names: Counter[str] = Counter()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (seen_foreign and seen_own):
            own, foreign = learning_arms.runnable_split(None, b"\0nothing\0", os.getpid(), names)
            seen_foreign += foreign >= 1
            own, _ = learning_arms.runnable_split(proc.pid, b"\0nothing\0", os.getpid())
            seen_own += own >= 1
            time.sleep(0.05)
        assert seen_foreign and seen_own
        # the record names what was runnable: the spinning process's command line
        assert any("-c import time" in cmd for cmd in names), names
    finally:
        proc.kill()
        proc.wait()


def test_foreign_cpu_counts_the_seconds_a_process_not_the_runs_used(tmp_path):
    """A process spinning beside the run counts its CPU seconds as foreign; one of the run
    (here the root) as its own; one sleeping beside it next to nothing, however often it
    would have been seen runnable on a machine the run oversubscribes."""
    spin = [sys.executable, "-c", "while True: pass"]
    nap = [sys.executable, "-c", "import time\nfor _ in range(300): time.sleep(0.01)"]
    run, foreign, quiet = (subprocess.Popen(c) for c in (spin, spin, nap))
    try:
        split = learning_arms.CpuSplit(os.getpid())
        split.sample(run.pid, b"\0nothing\0")  # the baseline
        # Sampled until each spinner has had 0.3 s of CPU: how soon depends on what else
        # the machine runs (a fixed 2 s wait failed beside a loaded test run), not on the
        # split, which is what is checked. The foreign spinner's own seconds, not all
        # foreign seconds: another process beside the test counts as foreign too.
        deadline = time.monotonic() + 60
        while True:
            time.sleep(0.5)
            split.sample(run.pid, b"\0nothing\0")
            seen = {c: t / learning_arms.TICKS_PER_S for c, t in split.foreign_seen.items()}
            spun = max((s for c, s in seen.items() if "while True" in c), default=0.0)
            if spun > 0.3 and split.own_s > 0.3:
                break
            assert time.monotonic() < deadline, (seen, split.own_s)
        assert any("while True" in cmd and s > 0.3 for cmd, s in seen.items()), seen
        assert all(s < 0.2 for cmd, s in seen.items() if "sleep(0.01)" in cmd), seen
    finally:
        for proc in (run, foreign, quiet):
            proc.kill()
            proc.wait()


def test_busy_reason():
    assert learning_arms.busy_reason({"during": {"foreign_cpu_cores": 0.1}}) is None
    assert "foreign CPU 0.35 cores" in learning_arms.busy_reason(
        {"during": {"foreign_cpu_cores": 0.35, "foreign_runnable_mean": 0.1}}
    )
    # the CPU figure decides where a record has it, whatever the runnable count says
    assert (
        learning_arms.busy_reason(
            {"during": {"foreign_cpu_cores": 0.1, "foreign_runnable_mean": 2}}
        )
        is None
    )
    assert learning_arms.busy_reason({"during": {"foreign_runnable_mean": 0.2}}) is None
    assert "foreign load 0.90" in learning_arms.busy_reason(
        {"during": {"foreign_runnable_mean": 0.9}}
    )
    assert learning_arms.busy_reason({"during": {}}) == "no load samples during the run"


def test_arm_names():
    spec = learning_plan.retry(1, ("reflow.age_from=newest_span",))
    assert spec.name == "arith_retry-reflow-age_fromnewest_span-s1"
    assert learning_plan.demo("async", 2).name == "demo-async-s2"


def test_an_arm_past_its_time_is_killed_with_its_whole_tree(tmp_path):
    """The launcher's grandchildren and a process that left the tree but carries the arm's
    marker (as submitit's local ranks do) are all killed."""
    pidfile = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(g.pid))\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, learning_arms.ARM_ENV: "t-arm"}
    marked = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True
    )
    child = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text()) and time.monotonic() < deadline:
            time.sleep(0.05)
        grandchild = int(pidfile.read_text())
        marker = f"{learning_arms.ARM_ENV}=t-arm".encode()
        assert {child.pid, grandchild, marked.pid} <= learning_arms.run_processes(child.pid, marker)
        learning_arms.kill_tree(child.pid, marker)
        assert child.wait(timeout=10) == -9 and marked.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
            if learning_arms._proc_stat(str(grandchild))[1] == "Z":
                break  # killed, a zombie until its reaper (init) collects it
            time.sleep(0.05)
        stat = learning_arms._proc_stat(str(grandchild))
        assert stat is None or stat[1] == "Z"
    finally:
        for p in (child, marked):
            p.kill()
            p.wait()


def test_kill_tree_leaves_nothing_of_the_run_that_starts_while_it_is_killed(monkeypatch):
    # A launcher starts ranks and engines while the kill goes on: one pass over the
    # processes missed those started after it listed them, and they ran beside the next
    # two arms (2026-12-05). Here a marked process starts during the first kill.
    tag = f"t-late-{os.getpid()}"
    env = {**os.environ, learning_arms.ARM_ENV: tag}
    marker = f"{learning_arms.ARM_ENV}={tag}".encode()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    first = subprocess.Popen(sleeper, env=env)
    late: list[subprocess.Popen] = []
    kill = os.kill

    def kill_and_a_late_start(pid: int, sig: int) -> None:
        if not late:
            late.append(subprocess.Popen(sleeper, env=env, start_new_session=True))
        kill(pid, sig)

    monkeypatch.setattr(learning_arms.os, "kill", kill_and_a_late_start)
    try:
        learning_arms.kill_tree(first.pid, marker)
        assert first.wait(timeout=10) == -9
        assert late and late[0].wait(timeout=10) == -9  # found by the next round
    finally:
        monkeypatch.undo()
        for p in (first, *late):
            p.kill()
            p.wait()


def test_grid_from_distills_a_sim_grid_and_the_report_projects_it(folder, tmp_path):
    cell = {"workload": "math", "model": "qwen3-8b", "gpus": 32}
    rows = [
        {**cell, "mode": m, "protocol": {"step_s_mean": 2.0}}
        for m in ("colocated_sync", "one_step_off", "async", "reflow")
    ]
    grid_json = tmp_path / "grid-rows.json"
    grid_json.write_text(json.dumps(rows))
    learning.main(["--grid-from", str(grid_json), "--dir", str(folder)])
    assert learning_projection.read_grid(folder / "grid.json")["cells"]["math:qwen3-8b:32"]
    md = learning.write_report(folder)
    # equal step times: reflow's ratio is its steps to the level over async's, 200 / 300
    assert "| math:qwen3-8b:32 | async | 0.67x | 1.00x | **0.67x** |" in md
    grid_json.write_text("[1, 2]")
    with pytest.raises(SystemExit, match=r"grid-rows.json: not a sim_grid.py grid.json"):
        learning.main(["--grid-from", str(grid_json), "--dir", str(folder)])
    (folder / "grid.json").write_text('{"cells": []}')
    with pytest.raises(SystemExit, match=r"grid.json: not a distilled grid"):
        learning.main(["--report-only", str(folder)])


def test_a_command_is_shown_by_its_program_name_so_a_long_path_keeps_its_arguments():
    """CI's checkout path cut the arguments off `foreign_seen`'s keys (issue 49's CI run)."""
    deep = (
        b"/check/work/main/"
        + b"x/" * 30
        + b".venv/bin/python3\0-c\0while time.time() - t < 3: pass\0"
    )
    assert learning_arms.shorten_command(deep) == "python3 -c while time.time() - t < 3: pass"
    assert learning_arms.shorten_command(b"sleep\x0010\x00") == "sleep 10"
    assert learning_arms.shorten_command(b"") == "?"
    assert len(learning_arms.shorten_command(b"a\0" + b"y" * 200)) == 80
