"""``reflow export``: a run's trained policy as a Hugging Face folder that transformers and
vLLM (CPU build) load unchanged, with the run's weights, not the base model's."""

import asyncio
import threading

import torch

from runtime.config.recipe import dump_config, load_recipe
from runtime.embedded.resolve import resolve_model_path
from runtime.embedded.tiny_qwen3 import BOS
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.store.run_dir import RunPaths
from tests.helpers import REPO, reflow
from tests.integration.test_vllm_engine import hf_logprobs
from tests.unit.test_trainer import batch


def trained_run(tmp_path):
    """A run folder as a finished run leaves it: config.yaml and weights/v<N>/."""
    cfg = load_recipe(REPO / "recipes" / "demo.yaml", ["train.lr=1e-2"])
    paths = RunPaths(tmp_path / "runs" / "done-1")
    paths.root.mkdir(parents=True)
    dump_config(cfg, paths.config)
    trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), resolve_model_path(cfg.model.path))
    for seed in range(3):
        trainer.train_step(batch(seed))
    trainer.publish(paths.root / "weights")
    return cfg, paths, trainer


def test_export_loads_in_transformers_and_vllm_with_the_trained_weights(tmp_path):
    cfg, paths, trainer = trained_run(tmp_path)
    out = tmp_path / "hf"
    done = reflow("export", str(paths.root), str(out), check=True)
    assert done.stdout.strip() == f"exported to {out}"
    assert {"config.json", "model.safetensors", "tokenizer.json", "reflow_export.json"} <= {
        f.name for f in out.iterdir()
    }
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[BOS, 7, 14, 9, 17, 5]])
    with torch.no_grad():
        exported, trained = model(ids).logits, trainer.model(ids).logits
        base = AutoModelForCausalLM.from_pretrained(resolve_model_path(cfg.model.path))(ids).logits
    assert torch.allclose(exported, trained, atol=1e-5)
    assert not torch.allclose(exported, base, atol=1e-3)  # trained, not the base model
    assert AutoTokenizer.from_pretrained(out)("S3+4=").input_ids[0] == 21

    from runtime.engines.vllm.engine import VLLMEngine
    from runtime.engines.vllm.settings import VLLMEngineConfig

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    engine = VLLMEngine(
        str(out),
        VLLMEngineConfig.from_config(
            load_recipe(REPO / "recipes" / "demo.yaml", ["algorithm.temperature=1.0"])
        ),
    )

    def run(coro, timeout=300):
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout)

    try:
        run(engine.start(0))
        prompt = [BOS, 7, 14, 9, 17]
        tokens, logprobs, _, _ = run(engine.generate("x", prompt, 12, ignore_eos=True))
    finally:
        engine.shutdown()
        loop.call_soon_threadsafe(loop.stop)
    expected = hf_logprobs(out, prompt, tokens)
    assert max(abs(a - b) for a, b in zip(logprobs, expected, strict=True)) < 2e-3


def test_export_errors_are_one_line(tmp_path):
    _, paths, trainer = trained_run(tmp_path)
    out = tmp_path / "busy"
    out.mkdir()
    (out / "x").write_text("keep me")
    done = reflow("export", str(paths.root), str(out))
    assert done.returncode == 2 and done.stderr.strip() == f"reflow: {out}: exists and is not empty"
    done = reflow("export", str(paths.root), str(tmp_path / "o"), "--step", "99")
    assert done.returncode == 2
    assert done.stderr.strip().endswith(f"has weights of step {trainer.version}")
    assert not (tmp_path / "o").exists() and (out / "x").read_text() == "keep me"
