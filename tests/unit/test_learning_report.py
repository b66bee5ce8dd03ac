"""benchmarks/learning.py's report, from fake run folders: the spread over seeds, the
common level, steps and seconds to it, and wording that says no more than the spread."""

import importlib.util
import json
import os

import pytest
import yaml

from benchmarks import learning

pytestmark = pytest.mark.unit

START = 0.2
# mode -> seed -> (seconds per step, held-out reward at steps 5 and 10). async s2 peaks
# mid-run; reflow s1's best (0.37) is above its final (0.33) and below its start (0.5), so
# the common level (0.37), the lowest final (0.33) and a level that counted the start (0.40)
# all differ.
RUNS = {
    "async": {0: (2.0, 0.30, 0.40), 1: (2.0, 0.35, 0.45), 2: (2.0, 0.50, 0.38)},
    "reflow": {0: (1.0, 0.32, 0.42), 1: (1.0, 0.37, 0.33), 2: (1.0, 0.41, 0.44)},
}


def make_run(root, mode, seed, dt, r5, r10, *, start=START, state="COMPLETED", name=None):
    """A run folder as the runtime writes it: 10 steps, rank 0's clock at 100 s at step 0,
    the start eval on step 1's line, a periodic eval at step 5, the end eval at step 10."""
    d = root / (name or f"learn-{mode}-s{seed}-20260101-000000")
    d.mkdir()
    cfg = {"reflow": {"mode": mode}, "train": {"seed": seed}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    lines = []
    for step in range(1, 11):
        x = {"step": step, "wall_s": 100.0 + dt * step, "attempt": 1, "reward_mean": 0.1}
        if step == 1:
            x["eval_reward_start"] = start
        if step == 5:
            x["eval_reward"] = r5
        if step == 10:
            x["eval_reward_end"] = r10
        lines.append(json.dumps(x))
    (d / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (d / "summary.json").write_text(json.dumps({"state": state, "reason": "test"}))
    return d


@pytest.fixture
def folder(tmp_path):
    for mode, seeds in RUNS.items():
        for seed, (dt, r5, r10) in seeds.items():
            make_run(tmp_path, mode, seed, dt, r5, r10, start=0.5 if mode == "reflow" else START)
    return tmp_path


def aggregate(folder, level=None):
    runs, _ = learning.find_runs(folder)
    return learning.aggregate(runs, level)


def test_reads_evals_with_the_first_step_as_time_zero(folder):
    run = learning.read_run(folder / "learn-async-s2-20260101-000000")
    assert (run.mode, run.seed, run.steps, run.problem) == ("async", 2, 10, None)
    # step 0 is the start eval at 0 s; steps 5 and 10 at 2 s per step after step 1
    assert run.evals == [(0, 0.0, START), (5, 8.0, 0.50), (10, 18.0, 0.38)]
    assert run.final == 0.38
    assert run.train_wall_s == pytest.approx(18.0)


def test_final_reward_mean_min_max_per_mode(folder):
    modes = aggregate(folder)["modes"]
    assert list(modes) == ["async", "reflow"]
    a, r = modes["async"]["final_reward"], modes["reflow"]["final_reward"]
    assert a["mean"] == pytest.approx((0.40 + 0.45 + 0.38) / 3)
    assert (a["min"], a["max"], a["n"]) == (0.38, 0.45, 3)
    assert r["mean"] == pytest.approx((0.42 + 0.33 + 0.44) / 3)
    assert (r["min"], r["max"]) == (0.33, 0.44)
    assert modes["reflow"]["seeds"] == [0, 1, 2]


def test_common_level_is_the_lowest_best_after_training_began(folder):
    agg = aggregate(folder)
    # not the lowest final (0.33), not counting reflow's start of 0.5 (0.40)
    assert agg["level"] == 0.37
    assert all(s["reached"] == 3 for s in agg["modes"].values())


def test_steps_and_seconds_to_the_level_are_the_first_eval_at_or_above_it(folder):
    modes = aggregate(folder)["modes"]
    a, r = modes["async"], modes["reflow"]
    # async: s0 and s1 at step 10 (18 s), s2 at step 5 (8 s)
    assert [x["to_level"] for x in a["per_run"]] == [(10, 18.0), (10, 18.0), (5, 8.0)]
    assert a["steps_to_level"]["mean"] == pytest.approx(25 / 3)
    assert (a["time_to_level"]["min"], a["time_to_level"]["max"]) == (8.0, 18.0)
    # reflow: s1's 0.37 at step 5 reaches it exactly (at or above)
    assert [x["to_level"] for x in r["per_run"]] == [(10, 9.0), (5, 4.0), (5, 4.0)]
    assert r["time_to_level"]["mean"] == pytest.approx(17 / 3)


def test_a_given_level_not_every_run_reached(folder):
    agg = aggregate(folder, level=0.43)
    a, r = agg["modes"]["async"], agg["modes"]["reflow"]
    assert (a["reached"], r["reached"]) == (2, 1)
    assert a["steps_to_level"]["n"] == 2
    report = learning.render(agg, settings="s", notes=[], plot_note="p")
    assert "Not every run reached 0.430 in: async, reflow." in report
    assert "not compared on time to level" in report


def test_bands_hold_each_runs_latest_eval(folder):
    modes = aggregate(folder)["modes"]
    b = modes["async"]["vs_step"]
    assert b["x"] == [0, 5, 10]
    assert b["mean"][1] == pytest.approx((0.30 + 0.35 + 0.50) / 3)
    assert (b["min"][1], b["max"][1]) == (0.30, 0.50)
    t = modes["reflow"]["vs_time"]
    assert t["x"] == [0.0, 4.0, 9.0]
    assert t["min"][0] == t["max"][0] == 0.5
    # two runs of different lengths: after the short one ends it holds its final value
    ragged = learning.band([[(0, 0.1), (10, 0.5)], [(0, 0.2), (4, 0.3)]])
    assert ragged["x"] == [0, 4, 10]
    assert ragged["mean"] == pytest.approx([0.15, 0.2, 0.4])
    assert (ragged["min"], ragged["max"]) == ([0.1, 0.1, 0.3], [0.2, 0.3, 0.5])


def test_overlapping_ranges_are_indistinguishable(folder):
    agg = aggregate(folder)
    (final,) = agg["comparisons"]["final_reward"]
    assert final.startswith("async and reflow: indistinguishable at this spread")
    assert "async 0.380-0.450, reflow 0.330-0.440" in final
    (times,) = agg["comparisons"]["time_to_level"]  # 8-18 s and 4-9 s overlap
    assert "indistinguishable at this spread" in times


def test_separate_ranges_say_which_is_ahead(tmp_path):
    for seed, (r5, r10) in enumerate([(0.3, 0.30), (0.3, 0.32), (0.3, 0.31)]):
        make_run(tmp_path, "async", seed, 2.0, r5, r10)
    for seed, (r5, r10) in enumerate([(0.5, 0.60), (0.5, 0.70), (0.5, 0.65)]):
        make_run(tmp_path, "reflow", seed, 1.0, r5, r10)
    agg = aggregate(tmp_path)
    assert agg["level"] == 0.30  # async seed 0's best, reached at step 5
    (final,) = agg["comparisons"]["final_reward"]
    assert final.startswith("reflow higher than async: the ranges do not overlap")
    assert "indistinguishable" not in final
    (times,) = agg["comparisons"]["time_to_level"]  # step 5: async 8 s, reflow 4 s
    assert times.startswith("reflow faster than async")


def test_single_runs_are_not_compared():
    one, other = {"mean": 0.3, "min": 0.3, "max": 0.3, "n": 1}, learning.spread([0.5, 0.6])
    sentence = learning.compare("async", one, "reflow", other, "final reward", ".3f", "higher")
    assert sentence.startswith("async and reflow: not compared, a single run has no spread")


def test_ranges_overlap_edges():
    def r(lo, hi):
        return {"min": lo, "max": hi}

    assert learning.ranges_overlap(r(0.1, 0.3), r(0.3, 0.5))  # touching counts
    assert learning.ranges_overlap(r(0.1, 0.6), r(0.3, 0.5))  # inside
    assert not learning.ranges_overlap(r(0.1, 0.29), r(0.3, 0.5))
    assert not learning.ranges_overlap(r(0.6, 0.7), r(0.3, 0.5))


def test_failed_and_replaced_runs_are_left_out(folder):
    make_run(folder, "async", 3, 2.0, 0.9, 0.9, state="FAILED", name="learn-async-s3-x")
    old = make_run(folder, "reflow", 0, 1.0, 0.9, 0.9, name="learn-reflow-s0-older")
    os.utime(old, (1, 1))  # older than the fixture's reflow seed 0
    runs, notes = learning.find_runs(folder)
    agg = learning.aggregate(runs)
    assert agg["modes"]["async"]["runs"] == 3 and agg["level"] == 0.37
    assert agg["modes"]["reflow"]["final_reward"]["max"] == 0.44
    assert any("learn-reflow-s0-older: replaced by" in n for n in notes)
    report = learning.render(agg, settings="s", notes=notes, plot_note="p")
    assert "learn-async-s3-x: state FAILED (test)" in report


def test_a_run_that_failed_before_its_first_step_is_left_out(folder):
    dead = make_run(folder, "async", 4, 2.0, 0.9, 0.9, state="FAILED", name="learn-async-s4-x")
    (dead / "metrics.jsonl").unlink()  # e.g. its engines could not start
    run = learning.read_run(dead)  # what a run just launched gives: no crash, left out
    assert run.problem == "no metrics.jsonl: the run ended before its first step"
    runs, _ = learning.find_runs(folder)  # and a report on the folder skips it
    assert all(r.seed != 4 for r in runs)


def test_report_only_writes_the_report(folder, capsys):
    learning.main(["--report-only", str(folder)])
    md = (folder / "learning.md").read_text()
    assert md == capsys.readouterr().out
    assert "Common level: **0.370**" in md
    assert "| async | 3 (0, 1, 2) | 0.200 | 0.410 [0.380-0.450] |" in md
    data = json.loads((folder / "learning.json").read_text())
    assert data["level"] == 0.37 and len(data["runs"]) == 6
    if importlib.util.find_spec("matplotlib"):
        assert (folder / "reward_vs_step.png").stat().st_size > 0
        assert (folder / "reward_vs_time.png").exists()
    else:
        assert "No plots: matplotlib is not importable" in md


def test_bad_input_names_the_file(folder):
    path = folder / "learn-async-s0-20260101-000000" / "metrics.jsonl"
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(SystemExit, match=r"metrics.jsonl:11: not a metrics line"):
        learning.main(["--report-only", str(folder)])
    with pytest.raises(SystemExit, match="no run folders"):
        learning.main(["--report-only", str(folder / "learn-async-s0-20260101-000000")])


def test_baselines_get_no_replay():
    assert learning.mode_sets("async", 2, 6) == [
        "train.steps=6",
        "train.seed=2",
        "reflow.mode=async",
        "reflow.sigma=0",
    ]
    assert "reflow.sigma=0" not in learning.mode_sets("reflow", 0, 6)
