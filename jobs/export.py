"""``reflow export``: a run's policy as a Hugging Face folder that transformers and vLLM
load unchanged: the base model's config, generation config and tokenizer files, the run's
trained weights (``weights/v<N>/model.safetensors``), and ``reflow_export.json`` saying
where they came from. Written to a temporary folder and renamed, so a failed export
leaves nothing half-written."""

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


def export(paths: RunPaths, out: Path, version: int | None = None) -> Path:
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
        shutil.copy2(paths.root / "weights" / f"v{version}" / "model.safetensors", tmp)
        (tmp / "reflow_export.json").write_text(
            json.dumps({"run": paths.name, "step": version, "base_model": str(base)}, indent=1)
        )
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
