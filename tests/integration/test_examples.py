"""The tasks of one's own in examples/ run as a user would launch them (a few steps on the
CPU, real engines): their own reward file, their own dataset folder (docs/your-task.md)."""

from __future__ import annotations

import json

from tests.helpers import REPO, reflow


def launch(example: str, runs_dir, *sets: str) -> tuple[dict, list[dict], list[dict]]:
    recipe = str(REPO / "examples" / example / "recipe.yaml")
    args = [x for s in sets for x in ("--set", s)]
    done = reflow("launch", recipe, "--local", "--wait", *args, timeout=900)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    run_dir = next(runs_dir.iterdir())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["state"] == "COMPLETED" and summary["samples"]["lost"] == 0
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    steps = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return summary, samples, [s for s in steps if "step" in s]


def test_a_verl_reward_file_on_a_save_to_disk_folder(runs_dir):
    """examples/verl_reward_hf: verl's GSM8K layout written by datasets' save_to_disk,
    scored by a reward file in verl's signature."""
    import importlib.util

    _, samples, steps = launch("verl_reward_hf", runs_dir)
    spec = importlib.util.spec_from_file_location(
        "example_reward", REPO / "examples/verl_reward_hf/reward.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for s in samples:  # every reward is the file's, with its diagnostics
        info = s["info"]
        assert set(info["reward_info"]) == {"found", "chars"}, info
        assert "reward_error" not in info
    assert all("reward_info/found" in line and "reward_info/chars" in line for line in steps)
    assert len(steps) == 3
    # the function on a few strings, as verl would call it
    score = module.compute_score
    assert score("openai/gsm8k", "so #### 1,200.", "1200", {})["score"] == 1.0
    assert score("openai/gsm8k", "it is 7 or 8", "8", None)["score"] == 1.0
    assert score("openai/gsm8k", "no number", "8", None) == {
        "score": 0.0,
        "found": False,
        "chars": 9,
    }


def test_a_multi_turn_environment_of_ones_own(runs_dir, tmp_path):
    """examples/number_game: kind custom with env.py's NumberGame: every sample has the
    environment's turns masked out between the model's, its reward summed from the steps.
    Its games come from two files mixed by weight (data.train as a list)."""
    other = tmp_path / "short_games.jsonl"
    other.write_text(
        "".join(json.dumps({"prompt": "Guess 1-16.", "target": t}) + "\n" for t in (3, 9))
    )
    mix = f"data.train=[{{path: examples/number_game/games.jsonl}}, {{path: {other}, weight: 1.0}}]"
    _, samples, steps = launch("number_game", runs_dir, mix, "logging.samples=true")
    assert len(steps) == 3
    # prompts of both files were played (the short file's prompt is the shorter one)
    assert len({len(s["prompt_ids"]) for s in samples}) == 2, [
        len(s["prompt_ids"]) for s in samples
    ]
    for s in samples:
        turns = s["info"]["turns"]
        # a one-turn episode has no environment tokens: its mask is left out (all ones)
        mask = s["loss_mask"] if s["loss_mask"] is not None else [1]
        assert 1 <= turns <= 4 and "reward_error" not in s["info"]
        # model turns and observations alternate: turns - 1 masked runs between them
        runs = [m for i, m in enumerate(mask) if i == 0 or mask[i - 1] != m]
        assert runs == [1, 0] * (turns - 1) + [1], (turns, runs)
        assert 0.0 <= s["reward"] <= 1.0


def test_the_arith_retry_environment_runs_on_the_embedded_task(runs_dir):
    """examples/arith_retry: a custom environment on the embedded prompts and model (the
    run that learns is 400 steps, outside make test: docs/results.md)."""
    sets = ("train.steps=3", "logging.samples=true", "eval.max_prompts=3", "eval.k=2")
    summary, samples, lines = launch("arith_retry", runs_dir, *sets)
    steps = [line for line in lines if "eval_version" not in line]
    assert len(steps) == 3
    # the held-out sets, played by the environment on a rollout engine at the start and
    # the end (runtime/control/evals.py), each under the step that published its version
    rounds = [line for line in lines if "eval_version" in line]
    assert [(r["step"], r["eval_version"], r["eval_complete"]) for r in rounds] == [
        (0, 0, True),
        (3, 3, True),
    ], rounds
    for line, prefix in ((rounds[0], "eval_start/unseen/"), (rounds[-1], "eval/draws/")):
        figures = {k.removeprefix(prefix): v for k, v in line.items() if k.startswith(prefix)}
        assert set(figures) >= {"greedy", "mean@2", "pass@2", "prompts"}, line
        assert figures["prompts"] == 3.0
        assert 0.0 <= figures["mean@2"] <= 1.0
        # per prompt: solved or not (pass@2); 0, 0.5 or 1 (greedy: ArithRetry's rewards)
        for name, unit in (("pass@2", 3), ("greedy", 6)):
            assert abs(figures[name] * unit - round(figures[name] * unit)) < 1e-9, figures
    assert set(summary["evals"]) == {"draws", "unseen"}
    for held in summary["evals"].values():
        assert set(held) == {"start", "last"} and held["last"]["prompts"] == 3.0
    shown = reflow("status", str(next(runs_dir.iterdir()))).stdout
    assert "eval unseen (3 prompts): greedy" in shown and "pass@2" in shown
    for s in samples:
        tries, turns = s["info"]["env/tries"], s["info"]["turns"]
        assert tries == turns and 1 <= turns <= 2
        assert s["reward"] in (0.0, 0.5, 1.0)
        assert (s["reward"] == 1.0) == (turns == 1 and s["reward"] > 0)
