"""``reflow export``: a run's policy as a Hugging Face folder that transformers and vLLM
load unchanged: the base model's config, generation config and tokenizer files, the run's
trained weights, and ``reflow_export.json`` saying where they came from. The weights are
either a published version (``weights/v<N>/model.safetensors``, copied) or a checkpoint's
sharded trainer state (``checkpoints/step-<N>/trainer/``, verified first, then streamed
into one ``model.safetensors`` a tensor at a time by
:func:`runtime.engines.torch.sharded_state.export_hf`). Written to a temporary folder and
renamed, so a failed export leaves nothing half-written.

A LoRA run (``model.lora.rank`` > 0 in the run's config) trains adapters on a frozen base,
and its published versions are peft adapter folders. Its export is a peft adapter folder
(``adapter_config.json``, ``adapter_model.safetensors``, the base's tokenizer files; peft,
transformers' ``load_adapter`` and vLLM's ``LoRARequest`` load it onto the base named in
``reflow_export.json``), or with ``merged`` a plain Hugging Face model folder with
``W + alpha/r * B @ A`` merged into the base's weights (transformers loads it with no
peft). From a checkpoint only the adapter tensors are read out of the DCP state. The
merged weights are streamed: every adapter (``r * (in + out)`` numbers a layer) is held,
and one base tensor (with its merged copy) at a time, read from the base model's
safetensors and written straight into the output file."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from jobs.errors import UserError
from runtime.config.recipe import RecipeError, load_recipe
from runtime.store.run_dir import RunPaths

# Files of a model folder that are weights (replaced by the run's), not configuration.
_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.safetensors.index.json", "*.bin.index.json")
# The base's files an adapter folder leaves out: with them it would pass for a whole model.
_MODEL_CONFIG_FILES = ("config.json", "generation_config.json")


def _is_version(folder: Path) -> bool:
    """A whole published version: full weights, or a LoRA run's adapter (whose config is
    written last)."""
    from runtime.weights.lora_format import ADAPTER_CONFIG, ADAPTER_FILE

    if (folder / "model.safetensors").is_file():
        return True
    return (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_FILE).is_file()


def available_versions(paths: RunPaths) -> list[int]:
    weights = paths.root / "weights"
    found = [int(d.name[1:]) for d in weights.glob("v*") if d.name[1:].isdigit()]
    return sorted(v for v in found if _is_version(weights / f"v{v}"))


def export(
    paths: RunPaths,
    out: Path,
    version: int | None = None,
    checkpoint: str | None = None,
    merged: bool = False,
) -> Path:
    """Write ``out``: the published weights of ``version`` (default: the latest), or those
    of checkpoint folder ``checkpoint`` (``step-00000010``), which must verify. A LoRA
    run's are its adapter, or with ``merged`` the base with the adapter merged in."""
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
    lora = cfg.model.lora
    if merged and not lora.enabled:
        raise UserError(
            f"export --merged: {paths.name} is not a LoRA run (model.lora.rank is 0 in "
            f"{paths.config}); its export is the whole model already"
        )
    from runtime.embedded.resolve import resolve_model_path

    base = Path(resolve_model_path(cfg.model.path))
    if not (base / "config.json").is_file():
        raise UserError(f"{base}: no config.json (model.path of {paths.name})")
    version_dir = paths.root / "weights" / f"v{version}"
    if info is None:
        _check_version_kind(version_dir, lora.rank, paths.config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        skip = {p for pattern in _WEIGHT_FILES for p in base.glob(pattern)}
        if lora.enabled and not merged:
            skip |= {base / name for name in _MODEL_CONFIG_FILES}
        for f in base.iterdir():
            if f.is_file() and f not in skip:
                shutil.copy2(f, tmp / f.name)
        if info is None:
            source: dict[str, object] = {"step": version}
        else:
            source = {
                "checkpoint": info.name,
                "step": info.step,
                "policy_version": info.policy_version,
            }
        if not lora.enabled:
            if info is None:
                shutil.copy2(version_dir / "model.safetensors", tmp)
            else:
                _export_checkpoint(info.path, base, tmp / "model.safetensors")
        else:
            adapter = (
                _published_adapter(version_dir, lora.rank, lora.alpha, paths.config)
                if info is None
                else _checkpoint_adapter(info.path, lora.rank, paths.config)
            )
            if merged:
                import torch

                dtype = getattr(torch, cfg.model.dtype)
                _write_merged(base, adapter, lora.scale, dtype, tmp / "model.safetensors")
            else:
                from runtime.weights.lora_format import to_peft, write_adapter

                write_adapter(tmp, to_peft(adapter), lora, str(base))
            source["lora"] = "merged" if merged else "adapter"
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
    from runtime.engines.torch.sharded_state import export_hf
    from runtime.store.checkpoint import CheckpointError, trainer_dir

    try:
        export_hf(trainer_dir(folder), out_file, tied_lm_head=_tied(base))
    except CheckpointError as exc:
        raise UserError(f"export: {exc}") from None


def _tied(base: Path) -> bool:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(base)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", False)))


# --- LoRA --------------------------------------------------------------------------------


def _check_version_kind(folder: Path, rank: int, config: Path) -> None:
    """A LoRA run's version must be an adapter folder, another run's full weights."""
    from runtime.weights.lora_format import ADAPTER_CONFIG

    has_adapter = (folder / ADAPTER_CONFIG).is_file()
    if rank and not has_adapter:
        raise UserError(
            f"{folder}: no {ADAPTER_CONFIG}, but model.lora.rank is {rank} in {config} "
            "(a LoRA run publishes adapters)"
        )
    if not rank and has_adapter:
        raise UserError(f"{folder}: a LoRA adapter, but model.lora.rank is 0 in {config}")


def _published_adapter(folder: Path, rank: int, alpha: float, config: Path) -> dict[str, Any]:
    """A published adapter's tensors under the model's names, checked against the run's
    ``model.lora``."""
    from runtime.weights.lora_format import ADAPTER_CONFIG, from_peft, read_adapter

    try:
        adapter_cfg, tensors = read_adapter(folder)
        named = from_peft(tensors)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    except Exception as exc:  # a truncated or foreign file
        raise UserError(f"{folder}: unreadable adapter ({type(exc).__name__}: {exc})") from None
    for field, key, want in (("rank", "r", rank), ("alpha", "lora_alpha", alpha)):
        if float(adapter_cfg.get(key, -1)) != float(want):
            raise UserError(
                f"{folder / ADAPTER_CONFIG}: {key} {adapter_cfg.get(key)!r}, but "
                f"model.lora.{field} is {want} in {config}"
            )
    if not named:
        raise UserError(f"{folder}: an adapter with no tensors")
    return named


def _checkpoint_adapter(folder: Path, rank: int, config: Path) -> dict[str, Any]:
    """The LoRA tensors of a checkpoint's DCP state (model names), each read whole; the
    frozen base and the optimizer state are not read."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from runtime.engines.torch import sharded_state as ss
    from runtime.store.checkpoint import CheckpointError, trainer_dir
    from runtime.weights.lora_format import is_adapter_name

    where = trainer_dir(folder)
    try:
        metadata = ss.read_metadata(where)
        planner = metadata.planner_data if isinstance(metadata.planner_data, dict) else {}
        reader = ss.SafeReader(where, metadata)
        out = {}
        for fqn, meta in metadata.state_dict_metadata.items():
            name = ss.hf_name(fqn, planner.get(fqn))
            if name and is_adapter_name(name) and isinstance(meta, TensorStorageMetadata):
                out[name] = ss.load_tensor(reader, fqn, meta)
    except CheckpointError as exc:
        raise UserError(f"export: {exc}") from None
    if not out:
        raise UserError(
            f"export: {folder.name}/{where.name}: no LoRA tensors, but model.lora.rank is "
            f"{rank} in {config}"
        )
    for name, t in out.items():
        r = t.shape[0] if name.endswith(".lora_A.weight") else t.shape[-1]
        if t.dim() != 2 or r != rank:
            raise UserError(
                f"export: {folder.name}/{where.name}: {name} has shape {tuple(t.shape)}, but "
                f"model.lora.rank is {rank} in {config}"
            )
    return out


@contextmanager
def _base_tensors(base: Path) -> Iterator[dict[str, tuple[Any, str]]]:
    """name -> (open safetensors file, dtype name) for every tensor of the base model's
    safetensors weights (one file, or the shards its index lists); nothing loaded yet."""
    from safetensors import safe_open

    index = base / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{index}: unreadable ({type(exc).__name__}: {exc})") from None
        files = sorted(set(weight_map.values()))
    elif (base / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise UserError(
            f"{base}: no model.safetensors (or its index); --merged reads the base's weights "
            "from safetensors"
        )
    with ExitStack() as stack:
        found: dict[str, tuple[Any, str]] = {}
        for name in files:
            path = base / name
            if Path(name).name != name or not path.is_file():
                raise UserError(f"{index}: names a weight file {name!r} the folder lacks")
            try:
                fh = stack.enter_context(safe_open(str(path), framework="pt"))
            except Exception as exc:
                raise UserError(f"{path}: unreadable ({exc})") from None
            for key in fh.keys():  # noqa: SIM118 (a safe_open handle, not a dict)
                found[key] = (fh, fh.get_slice(key).get_dtype())
        yield found


def _write_merged(
    base: Path, adapter: dict[str, Any], scale: float, dtype: Any, out_file: Path
) -> None:
    """The base model's tensors with the adapter merged in (``W + scale * B @ A``, in
    float32), floating-point ones in ``dtype`` (``model.dtype``, what rollout runs), as
    one safetensors file written a tensor at a time; a tied ``lm_head`` left out."""
    import torch

    from runtime.engines.torch.sharded_state import SAFETENSORS_DTYPES, stream_safetensors
    from runtime.weights.lora_format import base_name, merged_weight

    by_name = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    tied = _tied(base)
    with _base_tensors(base) as tensors:
        pairs: dict[str, tuple[Any, Any]] = {}
        for name in adapter:
            stem = name.rsplit(".lora_", 1)[0]
            a_name, b_name = stem + ".lora_A.weight", stem + ".lora_B.weight"
            lacking = next((n for n in (a_name, b_name) if n not in adapter), None)
            if lacking is not None:
                raise UserError(f"export --merged: {name} has no {lacking} beside it")
            w = base_name(name)
            if w not in tensors:
                raise UserError(f"export --merged: {w} (adapted by {name}) is not in {base}")
            a, b = adapter[a_name], adapter[b_name]
            shape = tuple(tensors[w][0].get_slice(w).get_shape())
            if shape != (b.shape[0], a.shape[1]):
                raise UserError(
                    f"export --merged: {w} of {base} has shape {shape}, the adapter's "
                    f"B @ A {(b.shape[0], a.shape[1])}"
                )
            pairs[w] = (a, b)

        entries: list[tuple[str, torch.dtype, list[int]]] = []
        for name, (fh, dt) in tensors.items():
            if tied and name == "lm_head.weight":
                continue
            if dt not in by_name:
                raise UserError(f"{base}: {name}: dtype {dt} is not supported by export")
            stored = by_name[dt]
            entries.append(
                (
                    name,
                    dtype if stored.is_floating_point else stored,
                    fh.get_slice(name).get_shape(),
                )
            )

        def load(name: str) -> torch.Tensor:
            t = tensors[name][0].get_tensor(name)
            if name in pairs:
                t = merged_weight(t, *pairs[name], scale, dtype=torch.float32)
            return t.to(dtype) if t.is_floating_point() else t

        stream_safetensors(out_file, entries, load)
