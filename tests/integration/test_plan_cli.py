"""`reflow plan` and the memory plan of `reflow launch` through the real CLI: the figures
printed, the exit codes, and the one-line refusal of a recipe that cannot fit its GPUs."""

import pytest

from tests.helpers import reflow

pytestmark = pytest.mark.integration

# dapo_math.yaml checkpoints activations in micro-batches of 45,056 tokens, which fits 80
# GiB; one pass per update without checkpointing (as the recipe trained before) does not.
FITTING: list[str] = []
WHOLE_PASS = [
    "--set",
    "train.activation_checkpointing=false",
    "--set",
    "train.micro_batch_tokens=null",
]


def _row(stdout: str, label: str) -> str:
    return next(line for line in stdout.splitlines() if line.strip().startswith(label))


def test_plan_of_the_dapo_recipe_prints_both_roles_per_gpu():
    done = reflow("plan", "recipes/dapo_math.yaml", "--nodes", "16", *FITTING, check=True)
    out = done.stdout
    assert out.startswith("memory plan: Qwen3-8B, 8,190,735,360 parameters")
    assert "80.0 GiB per GPU (default; --gpu-memory-gib sets it)" in out
    assert "trainer role (fsdp2 over 8 ranks, param_dtype bfloat16):" in out
    # 8,190,735,360 x 4 B / 8 ranks = 3.8 GiB each for master weights and gradients
    assert "3.8 GiB   1/8 each" in _row(out, "parameters (float32 master)")
    assert "7.6 GiB   1/8 each" in _row(out, "AdamW state")
    assert "45,056 tokens per pass" in _row(out, "activations with checkpointing")
    assert _row(out, "(without checkpointing)")
    assert "144.0 KiB" in _row(out, "KV per token")
    assert "395,712" in _row(out, "KV tokens")
    assert "393,664" in _row(out, "largest response that fits")
    assert "fits: 17 such sequences at once" in _row(out, "model.max_seq_len=22,528")
    assert out.rstrip().endswith("verdict: fits")


def test_plan_of_the_dapo_recipe_in_one_pass_says_it_would_be_refused():
    done = reflow("plan", "recipes/dapo_math.yaml", "--nodes", "16", *WHOLE_PASS)
    assert done.returncode == 1, done.stdout + done.stderr
    verdict = done.stdout.strip().splitlines()[-1]
    assert verdict.startswith("verdict: refused at launch: trainer role needs ")
    assert "80.0 GiB available (Qwen3-8B, fsdp2 over 8 ranks)" in verdict
    assert "with train.activation_checkpointing, train.micro_batch_tokens <= " in verdict


def test_gpu_memory_option_changes_the_kv_cache():
    small = reflow("plan", "recipes/dapo_math.yaml", *FITTING, check=True).stdout
    big = reflow(
        "plan", "recipes/dapo_math.yaml", *FITTING, "--gpu-memory-gib", "141", check=True
    ).stdout
    assert "141.0 GiB per GPU (--gpu-memory-gib)" in big

    def tokens(out: str) -> int:
        return int(_row(out, "KV tokens").split()[2].replace(",", ""))

    # 0.92 x 61 GiB more, at 144 KiB per token, in blocks of 16
    assert tokens(big) - tokens(small) == pytest.approx(0.92 * 61 * 2**30 / 147_456, abs=32)


def test_launch_refuses_a_recipe_that_cannot_fit_in_one_line(runs_dir):
    done = reflow("launch", "recipes/dapo_math.yaml", "--local", *WHOLE_PASS)
    assert done.returncode == 2
    line = done.stderr.strip()
    assert (
        line.startswith("reflow: recipes/dapo_math.yaml: trainer role needs ")
        and "GiB per GPU, 80.0 GiB available (Qwen3-8B, fsdp2 over 8 ranks)" in line
    )
    assert len(line.splitlines()) == 1 and "Traceback" not in done.stderr
    assert not runs_dir.exists(), "a refused launch must start nothing"
    # past the memory check, the same launch stops at the next one (the data, absent here)
    done = reflow("launch", "recipes/dapo_math.yaml", "--local", *WHOLE_PASS, "--no-memory-check")
    assert done.returncode == 2 and "trainer role" not in done.stderr
    assert "/data/dapo-math-17k/train.parquet" in done.stderr


def test_dry_run_shows_the_plan_and_its_verdict(runs_dir):
    done = reflow("launch", "recipes/apps_coding.yaml", "--nodes", "8", "--dry-run")
    assert "memory plan: Qwen3-8B" in done.stdout
    assert "verdict: fits" in done.stdout
    # the recipe's data is a cluster path, absent here: refused, as the launch would be
    assert done.returncode == 2 and "/data/apps/train.jsonl" in done.stderr
    done = reflow("launch", "recipes/apps_coding.yaml", "--nodes", "8", "--dry-run", *WHOLE_PASS)
    assert "verdict: refused at launch: trainer role needs " in done.stdout
    assert "#SBATCH" in done.stdout  # the plan comes before the sbatch script, which stays
    # then the refusal itself, the launch's line (memory is checked before the data)
    assert done.returncode == 2 and "trainer role needs " in done.stderr
    assert not runs_dir.exists()


def test_cpu_recipes_plan_tiny_figures_and_are_not_checked(runs_dir):
    done = reflow("launch", "recipes/demo.yaml", "--dry-run", check=True)
    assert "memory plan: embedded:tiny-qwen3, 397,312 parameters" in done.stdout
    assert "a CPU run (resources.device: cpu): figures only" in done.stdout
    assert "verdict" not in done.stdout
    done = reflow("plan", "recipes/dapo_math_cpu.yaml", check=True)
    assert "memory plan: embedded:tiny-qwen3-chat" in done.stdout
    assert "MiB" in _row(done.stdout, "parameters (float32 master)")
    assert "engine.kv_cache_memory_bytes" in _row(done.stdout, "KV cache")


def test_an_unknown_model_is_one_line_for_plan_and_a_note_for_a_dry_run(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "model: {path: /nowhere/Mystery-7B, dtype: bfloat16, max_seq_len: 4096}\n"
        "workload: {max_response_tokens: 1024}\n"
        "resources: {device: cuda}\n"
    )
    done = reflow("plan", str(recipe))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "reflow: model.path: /nowhere/Mystery-7B has no config.json on this machine and "
        "'Mystery-7B' is not a known architecture (Qwen3-0.6B, Qwen3-1.7B, Qwen3-4B, "
        "Qwen3-8B, Qwen3-14B, Qwen3-32B, Qwen3-30B-A3B, Qwen3-235B-A22B)"
    )
    done = reflow("launch", str(recipe), "--dry-run", check=True)
    assert "memory plan: none (model.path: /nowhere/Mystery-7B has no config.json" in done.stdout
