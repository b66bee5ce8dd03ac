"""Where rank 0 writes each training step's metrics line.

``metrics.jsonl`` in the run folder always (the record every tool here reads); TensorBoard
event files under ``tensorboard/`` when ``logging.tensorboard`` is on; a Weights & Biases
run when ``logging.wandb`` is on (``logging.wandb_mode: offline`` keeps it in the run
folder, for machines without network). The backends come from a registry keyed by the
recipe switch that turns them on.

A backend that fails (a full disk under the event files, the W&B service gone) is dropped
with one warning: the run and ``metrics.jsonl`` go on, nothing is lost from the record.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from runtime.config.schema import LoggingConfig
from runtime.store.run_dir import RunPaths

log = logging.getLogger("reflow.metrics")


class MetricsSink(Protocol):
    name: str

    def write(self, rows: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric fields of a metrics line, nested keys joined by ``/`` (``checkpoints``
    and other lists, strings and the step itself are left to ``metrics.jsonl``)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(scalars(value, f"{name}/"))
        elif isinstance(value, int | float) and name != "step" and math.isfinite(value):
            out[name] = float(value)
    return out


class JsonlSink:
    name = "jsonl"

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, rows: list[dict[str, Any]]) -> None:
        with self.path.open("a") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")

    def close(self) -> None:
        """Nothing held open: each write opens and closes the file."""


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            step = int(row.get("step", 0))
            for key, value in scalars(row).items():
                self._writer.add_scalar(key, value, step)
        self._writer.flush()  # readable while the run goes on

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    name = "wandb"

    def __init__(
        self, settings: LoggingConfig, paths: RunPaths, run_config: dict[str, Any]
    ) -> None:
        import wandb

        self._run = wandb.init(
            project=settings.wandb_project,
            name=paths.name,
            id=paths.name,  # a resumed run (same folder) continues the same W&B run
            resume="allow",
            dir=str(paths.root),
            mode=settings.wandb_mode,
            config=run_config,
        )

    def write(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._run.log(scalars(row), step=int(row.get("step", 0)))

    def close(self) -> None:
        self._run.finish()


# recipe switch -> how to open it (the package each needs, which the recipe check asks
# for: runtime/config/feasibility.py METRIC_PACKAGES)
BACKENDS: dict[str, Callable[[LoggingConfig, RunPaths, dict[str, Any]], MetricsSink]] = {
    "tensorboard": lambda settings, paths, run_config: TensorBoardSink(paths.root / "tensorboard"),
    "wandb": WandbSink,
}


class MetricsWriter:
    """``metrics.jsonl`` plus the backends the recipe turns on, as one sink."""

    def __init__(
        self, settings: LoggingConfig, paths: RunPaths, run_config: dict[str, Any]
    ) -> None:
        """``settings``: the recipe's logging section; ``run_config``: the whole resolved
        config as plain data, which a backend records with the run (W&B's ``config``)."""
        self.sinks: list[MetricsSink] = [JsonlSink(paths.metrics)]
        for switch, opener in BACKENDS.items():
            if not getattr(settings, switch):
                continue
            try:
                self.sinks.append(opener(settings, paths, run_config))
            except Exception as exc:  # a backend must not stop the run
                log.warning("metrics backend %s not started: %s", switch, exc)

    def write(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        for sink in list(self.sinks):
            try:
                sink.write(rows)
            except Exception as exc:
                if sink.name == "jsonl":
                    raise  # the record itself: the caller reports it
                log.warning("metrics backend %s failed, dropped: %s", sink.name, exc)
                self.sinks.remove(sink)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:
                log.warning("metrics backend %s did not close cleanly: %s", sink.name, exc)
