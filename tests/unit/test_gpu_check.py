"""The GPU check's logic (benchmarks/gpu_check.py): the shapes it builds, the FLOPs it
counts, the test results and arguments it reads. The script itself runs in
tests/integration/test_gpu_check.py."""

from __future__ import annotations

import pytest

from benchmarks import gpu_check
from runtime.config.architectures import model_shape


@pytest.mark.parametrize("name", sorted(gpu_check.MODELS))
def test_the_written_config_has_the_public_checkpoints_shape(name, tmp_path):
    want = model_shape(gpu_check.MODELS[name])
    gpu_check.qwen3_config(want, 1024).save_pretrained(tmp_path)
    got = model_shape(str(tmp_path))  # read back from config.json, as the plan reads it
    assert got.total_params == want.total_params
    assert (got.hidden, got.layers, got.vocab, got.tied) == (
        want.hidden,
        want.layers,
        want.vocab,
        want.tied,
    )


def test_matmul_parameters_are_the_linear_layers_of_the_real_model(tmp_path):
    import torch

    from runtime.embedded.tiny_qwen3 import build_model, build_tokenizer, save_pretrained

    path = save_pretrained(
        build_model(seed=0, **gpu_check.DRY_MODELS["small"]), build_tokenizer(), tmp_path
    )
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    shape = model_shape(str(path))
    assert gpu_check.matmul_params(shape) == linear
    per_token = gpu_check.model_flops_per_token(shape, 100)
    assert per_token == 6 * linear + 12 * shape.layers * shape.q_width * 100


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.gpu.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.gpu.test_a" name="test_bad" time="2.0">
  <failure message="AssertionError: 0.9 &lt; 0.97&#10;more">trace</failure></testcase>
<testcase classname="tests.gpu.test_b" name="test_two_gpus" time="0">
  <skipped message="needs 2 CUDA devices"/></testcase>
</testsuite></testsuites>"""


def test_junit_results_are_counted_with_one_line_per_test(tmp_path):
    path = tmp_path / "j.xml"
    path.write_text(JUNIT)
    got = gpu_check.junit_results(path)
    assert (got["passed"], got["failed"], got["skipped"]) == (1, 1, 1)
    bad = next(c for c in got["cases"] if c["outcome"] == "failed")
    assert bad == {
        "test": "test_a::test_bad",
        "outcome": "failed",
        "s": 2.0,
        "why": "AssertionError: 0.9 < 0.97",
    }
    missing = gpu_check.junit_results(tmp_path / "none.xml")
    assert "not written" in missing["error"]


def test_unknown_models_and_empty_runs_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        gpu_check.parse_args(["--out", str(tmp_path), "--models", "0.6b,70b"])
    assert e.value.code == 2
    assert "--models: 70b not among 0.6b, 1.7b, 4b" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--out", str(tmp_path), "--dry-run", "--models", "4b"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--out", str(tmp_path), "--steps", "0"])
    args = gpu_check.parse_args(["--out", str(tmp_path), "--dry-run"])
    assert args.models == ["tiny", "small"]


def test_the_summary_names_errors_skips_and_failed_tests():
    data = {
        "meta": {"date": "2026-12-04", "dry_run": False},
        "env": {"device": "NVIDIA H200", "torch": "2.11.0", "cuda": "13.0", "nccl": "2.27"},
        "tests": {
            "passed": 0,
            "failed": 1,
            "skipped": 0,
            "cases": [{"test": "t::x", "outcome": "failed", "s": 1.0, "why": "boom"}],
        },
        "models": {"4b": {"error": "4b: OutOfMemoryError: CUDA out of memory"}},
        "skipped": ["1.7b: past --budget-s 10"],
        "errors": ["4b: OutOfMemoryError: CUDA out of memory"],
    }
    page = gpu_check.summary(data)
    assert "failed  t::x (boom)" in page
    assert "skipped: 1.7b: past --budget-s 10" in page
    assert "error: 4b: OutOfMemoryError" in page


def test_every_gpu_tests_recipe_builds(tmp_path):
    """The gpu tests run only where a GPU is lent; their recipes are checked here, so a
    recipe rule added since (one did: workload.max_response_tokens must leave room for a
    prompt) fails in CI and not on the device."""
    from tests.gpu import (
        test_fsdp_cuda,
        test_nccl_weight_sync,
        test_trainer_offload,
        test_vllm_sleep,
    )

    model = str(tmp_path)
    for world in (1, 2):
        for strategy in ("fsdp2", "replicate"):
            test_fsdp_cuda.cfg_for(model, world, "float32", strategy=strategy)
            test_trainer_offload.cfg_for(model, strategy, world=world)
    test_nccl_weight_sync.cfg_for(model, 2, 1, "replicate")
    test_nccl_weight_sync.cfg_for(model, 3, 2, "fsdp2")
    test_vllm_sleep.cuda_cfg(tmp_path)
