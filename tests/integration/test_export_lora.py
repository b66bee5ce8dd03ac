"""``reflow export`` of a LoRA run (model.lora): a peft adapter folder that peft loads onto
the base, or with ``--merged`` a plain Hugging Face folder with the adapter merged in, both
giving the trainer's logits, from a published version or a sharded checkpoint alike."""

import json
import shutil

import pytest
import torch
import yaml
from safetensors.torch import load_file

from jobs.errors import UserError
from jobs.export import available_versions, export
from runtime.config.recipe import build_config, dump_config
from runtime.embedded.tiny_qwen3 import BOS, build_model, build_tokenizer, save_pretrained
from runtime.engines.torch import sharded_state
from runtime.engines.torch.settings import TorchTrainerConfig
from runtime.engines.torch.trainer import TorchTrainer
from runtime.store import checkpoint as ck
from runtime.store.run_dir import RunPaths
from runtime.transport.auth import create_run_keys
from runtime.weights import lora_format
from tests.helpers import reflow
from tests.unit.test_trainer import batch

LORA = {"rank": 4, "alpha": 8.0}
IDS = torch.tensor([[BOS, 7, 14, 9, 17, 5, 11]])


def make_run(root, base, lora, name):
    """A run folder as a finished run leaves it: config.yaml, keys, the final policy in
    weights/ and a sealed checkpoint of the same state."""
    cfg = build_config({"train": {"lr": 1e-2}, "model": {"path": str(base), "lora": lora}})
    paths = RunPaths(root / "runs" / name)
    paths.root.mkdir(parents=True)
    create_run_keys(paths.keys)
    dump_config(cfg, paths.config)
    trainer = TorchTrainer(TorchTrainerConfig.from_config(cfg), str(base))
    for seed in range(2):
        trainer.train_step(batch(seed))
    trainer.publish(paths.root / "weights")
    staging = ck.start(paths.checkpoints, trainer.step)
    trainer.save_state(ck.trainer_dir(staging))
    ck.coordinator_writer(paths.checkpoints, keep=3)(trainer.step, trainer.version, {"format": 1})
    trainer.model.eval()
    return paths, trainer


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_pretrained(build_model(seed=3), build_tokenizer(), tmp_path_factory.mktemp("base"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, base):
    return make_run(tmp_path_factory.mktemp("lora"), base, LORA, "lora-1")


def trained_logits(trainer):
    with torch.no_grad():
        return trainer.model(IDS).logits


def base_logits(base):
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(IDS).logits


def test_available_versions_sees_adapter_versions(run):
    paths, trainer = run
    folder = paths.root / "weights" / f"v{trainer.version}"
    assert not (folder / "model.safetensors").exists()  # a peft folder, as published
    assert available_versions(paths) == [trainer.version]


def test_the_export_is_a_peft_adapter_that_peft_loads_onto_the_base(run, base, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths, trainer = run
    out = tmp_path / "adapter"
    done = reflow("export", str(paths.root), str(out), check=True)
    assert done.stdout.strip() == f"exported to {out}"
    names = {f.name for f in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= names
    assert not names & {"config.json", "model.safetensors"}  # not a whole model
    assert json.loads((out / "reflow_export.json").read_text()) == {
        "run": "lora-1",
        "step": trainer.version,
        "lora": "adapter",
        "base_model": str(base),
    }
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert config["base_model_name_or_path"] == str(base)

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), out
    ).eval()
    with torch.no_grad():
        exported = model(IDS).logits
    trained = trained_logits(trainer)
    assert torch.allclose(exported, trained, atol=1e-5, rtol=0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.load_adapter(str(out))  # transformers' own entry point (peft underneath)
    with torch.no_grad():
        assert torch.allclose(model.eval()(IDS).logits, trained, atol=1e-5, rtol=0)
    assert not torch.allclose(exported, base_logits(base), atol=1e-3)  # B is not zero
    assert AutoTokenizer.from_pretrained(out)("S3+4=").input_ids[0] == 21


def test_merged_is_a_plain_model_that_transformers_loads_without_peft(run, base, tmp_path):
    from transformers import AutoModelForCausalLM

    paths, trainer = run
    out = tmp_path / "merged"
    reflow("export", str(paths.root), str(out), "--merged", check=True)
    names = {f.name for f in out.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= names
    assert not names & {"adapter_config.json", "adapter_model.safetensors"}
    assert json.loads((out / "reflow_export.json").read_text())["lora"] == "merged"
    tensors = load_file(str(out / "model.safetensors"))
    # the base's names exactly: no adapter tensors, the tied lm_head left out as HF saves it
    assert tensors.keys() == load_file(str(base / "model.safetensors")).keys()
    assert "lm_head.weight" not in tensors

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert not hasattr(model, "peft_config")
    with torch.no_grad():
        exported = model(IDS).logits
    assert torch.allclose(exported, trained_logits(trainer), atol=1e-5, rtol=0)
    assert not torch.allclose(exported, base_logits(base), atol=1e-3)


def test_a_checkpoint_exports_the_same_tensors_reading_only_the_adapters(
    run, tmp_path, monkeypatch
):
    paths, trainer = run
    name = ck.folder_name(trainer.step)
    read: list[str] = []
    load = sharded_state.load_tensor

    def tracked(reader, fqn, meta):
        read.append(fqn)
        return load(reader, fqn, meta)

    monkeypatch.setattr(sharded_state, "load_tensor", tracked)
    for merged, file in ((False, "adapter_model.safetensors"), (True, "model.safetensors")):
        published = export(paths, tmp_path / f"v-{merged}", merged=merged)
        saved = export(paths, tmp_path / f"ck-{merged}", checkpoint=name, merged=merged)
        meta = json.loads((saved / "reflow_export.json").read_text())
        assert (meta["checkpoint"], meta["step"]) == (name, trainer.step)
        assert (meta["policy_version"], meta["lora"]) == (
            trainer.version,
            "merged" if merged else "adapter",
        )
        got, want = load_file(str(saved / file)), load_file(str(published / file))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
        assert {f.name for f in saved.iterdir()} == {f.name for f in published.iterdir()}
        if not merged:
            config = json.loads((saved / "adapter_config.json").read_text())
            assert config == json.loads((published / "adapter_config.json").read_text())
    # the frozen base and AdamW's state stay on disk: only lora_A/lora_B are read, each once
    adapted = 2 * 7  # two blocks, every linear layer of each
    assert len(read) == 2 * 2 * adapted  # two exports from the checkpoint, A and B each
    assert all(lora_format.is_adapter_name(f) for f in read)


def edited_run(paths, tmp_path, lora=None, **model):
    """A copy of the run folder with fields of its config's ``model`` changed."""
    copy = RunPaths(tmp_path / "runs" / paths.name)
    shutil.copytree(paths.root, copy.root)
    cfg = yaml.safe_load(copy.config.read_text())
    cfg["model"].update(model)
    cfg["model"]["lora"].update(lora or {})
    copy.config.write_text(yaml.safe_dump(cfg))
    return copy


def one_line(call) -> str:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_export_errors_are_one_line_naming_the_file_or_field(run, base, tmp_path):
    paths, trainer = run
    plain, full = make_run(tmp_path / "p", base, {"rank": 0}, "plain-1")
    for source in ((), ("--checkpoint", ck.folder_name(full.step))):
        done = reflow("export", str(plain.root), str(tmp_path / "o"), "--merged", *source)
        assert done.returncode == 2
        assert done.stderr.strip() == (
            f"reflow: export --merged: plain-1 is not a LoRA run (model.lora.rank is 0 in "
            f"{plain.config}); its export is the whole model already"
        )

    name = ck.folder_name(trainer.step)
    version = paths.root / "weights" / f"v{trainer.version}"
    wrong = edited_run(paths, tmp_path / "rank", lora={"rank": 8})
    assert one_line(lambda: export(wrong, tmp_path / "o")) == (
        f"{wrong.root}/weights/v{trainer.version}/adapter_config.json: r 4, but "
        f"model.lora.rank is 8 in {wrong.config}"
    )
    message = one_line(lambda: export(wrong, tmp_path / "o", checkpoint=name))
    assert message.startswith(f"export: {name}/trainer: model.layers.0.")
    assert message.endswith(f"but model.lora.rank is 8 in {wrong.config}")
    wrong = edited_run(paths, tmp_path / "alpha", lora={"alpha": 16.0})
    assert one_line(lambda: export(wrong, tmp_path / "o", merged=True)) == (
        f"{wrong.root}/weights/v{trainer.version}/adapter_config.json: lora_alpha 8.0, but "
        f"model.lora.alpha is 16.0 in {wrong.config}"
    )
    small = save_pretrained(build_model(seed=3, hidden=64), build_tokenizer(), tmp_path / "small")
    wrong = edited_run(paths, tmp_path / "base", path=str(small))
    message = one_line(lambda: export(wrong, tmp_path / "o", merged=True))
    assert (
        message.startswith("export --merged: model.layers.") and f"of {small} has shape" in message
    )
    wrong = edited_run(paths, tmp_path / "full")
    folder = wrong.root / "weights" / version.name
    (folder / "adapter_config.json").unlink()
    shutil.copy2(base / "model.safetensors", folder)
    assert one_line(lambda: export(wrong, tmp_path / "o")) == (
        f"{folder}: no adapter_config.json, but model.lora.rank is 4 in {wrong.config} "
        "(a LoRA run publishes adapters)"
    )
    assert not (tmp_path / "o").exists()  # nothing half-written
