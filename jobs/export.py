"""``reflow export``: a run's policy as a Hugging Face folder that transformers and vLLM
load unchanged: the base model's config, generation config and tokenizer files, the run's
trained weights, and ``reflow_export.json`` saying where they came from. The weights are
either a published version (``weights/v<N>/model.safetensors``, copied) or a checkpoint's
sharded trainer state (``checkpoints/step-<N>/trainer/``, verified first, then streamed
into one ``model.safetensors`` a tensor at a time by
:func:`runtime.engines.torch.sharded_state.export_hf`). Written to a temporary folder and
renamed, so a failed export leaves nothing half-written."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from jobs.errors import UserError
from runtime.config.recipe import RecipeError, load_recipe
from runtime.store.run_dir import RunPaths

# Files of a model folder that are weights (replaced by the run's), not configuration.
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "*.bin.index.json")


def available_versions(paths: RunPaths) -> list[int]:
    weights = paths.root / "weights"
    found = [int(d.name[1:]) for d in weights.glob("v*") if d.name[1:].isdigit()]
    return sorted(v for v in found if (weights / f"v{v}" / "model.safetensors").is_file())


def export(
    paths: RunPaths, out: Path, version: int | None = None, checkpoint: str | None = None
) -> Path:
    """Write ``out``: the published weights of ``version`` (default: the latest), or those
    of checkpoint folder ``checkpoint`` (``step-00000010``), which must verify."""
    info = None
    if checkpoint is not None:
        if version is not None:
            raise UserError("export: --step and --checkpoint name two sources; give one")
        from runtime.store.checkpoint import CheckpointError, find

        try:
            info = find(paths.checkpoints, checkpoint)
        except CheckpointError as exc:
            raise UserError(f"export --checkpoint {checkpoint}: {exc}") from None
    else:
        versions = available_versions(paths)
        if not versions:
            raise UserError(f"{paths.root}: no trained weights in weights/ (has the run trained?)")
        if version is None:
            version = versions[-1]
        elif version not in versions:
            listed = ", ".join(map(str, versions))
            raise UserError(f"export --step {version}: {paths.name} has weights of step {listed}")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out}: exists and is not empty")
    try:
        cfg = load_recipe(paths.config)
    except RecipeError as exc:
        raise UserError(f"{paths.config}: {exc.message}") from None
    from runtime.embedded.resolve import resolve_model_path

    base = Path(resolve_model_path(cfg))
    if not (base / "config.json").is_file():
        raise UserError(f"{base}: no config.json (model.path of {paths.name})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        skip = {p for pattern in _WEIGHT_FILES for p in base.glob(pattern)}
        for f in base.iterdir():
            if f.is_file() and f not in skip:
                shutil.copy2(f, tmp / f.name)
        if info is None:
            shutil.copy2(paths.root / "weights" / f"v{version}" / "model.safetensors", tmp)
            source: dict[str, object] = {"step": version}
        else:
            _export_checkpoint(info.path, base, tmp / "model.safetensors")
            source = {
                "checkpoint": info.name,
                "step": info.step,
                "policy_version": info.policy_version,
            }
        (tmp / "reflow_export.json").write_text(
            json.dumps({"run": paths.name, **source, "base_model": str(base)}, indent=1)
        )
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _export_checkpoint(folder: Path, base: Path, out_file: Path) -> None:
    """The checkpoint's trainer tensors as ``out_file``; ``lm_head.weight`` left out where
    the base model ties it to the embeddings (transformers re-ties it on load)."""
    from transformers import AutoConfig

    from runtime.engines.torch.sharded_state import export_hf
    from runtime.store.checkpoint import CheckpointError, trainer_dir

    config = AutoConfig.from_pretrained(base)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    tied = bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))
    try:
        export_hf(trainer_dir(folder), out_file, tied_lm_head=tied)
    except CheckpointError as exc:
        raise UserError(f"export: {exc}") from None
