"""The metrics writer: metrics.jsonl always, optional backends that may fail alone."""

import json
import logging

import pytest

from runtime.config import feasibility
from runtime.config.recipe import RecipeError, build_config
from runtime.config.schema import Config
from runtime.store import metrics_sinks
from runtime.store.metrics_sinks import MetricsWriter, scalars
from runtime.store.run_dir import RunPaths

pytestmark = pytest.mark.unit


def test_scalars_flatten_numbers_and_leave_the_rest():
    row = {
        "step": 3,
        "reward_mean": 0.5,
        "tokens": 120,
        "resumed": True,
        "layout": "2:2",
        "checkpoints": [{"step": 2}],
        "placement": {"coverage": 1.2, "ratio": "3:1", "inf": float("inf")},
    }
    assert scalars(row) == {
        "reward_mean": 0.5,
        "tokens": 120.0,
        "resumed": 1.0,
        "placement/coverage": 1.2,
    }


class Broken:
    name = "broken"

    def __init__(self, *_):
        self.calls = 0

    def write(self, rows):
        self.calls += 1
        raise OSError("disk full")

    def close(self):
        raise OSError("still full")


def test_a_failing_backend_is_dropped_and_the_record_goes_on(tmp_path, monkeypatch, caplog):
    broken = Broken()
    monkeypatch.setitem(metrics_sinks.BACKENDS, "tensorboard", lambda logging, paths, run: broken)
    monkeypatch.setitem(feasibility.METRIC_PACKAGES, "tensorboard", "json")
    cfg = build_config({"logging": {"tensorboard": True}})
    writer = MetricsWriter(cfg.logging, RunPaths(tmp_path), {})
    with caplog.at_level(logging.WARNING, "reflow.metrics"):
        writer.write([{"step": 1, "x": 1.0}])
        writer.write([{"step": 2, "x": 2.0}])
        writer.close()
    assert broken.calls == 1  # dropped after its first failure
    assert "broken failed, dropped: disk full" in caplog.text
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2]


def test_a_backend_that_cannot_start_does_not_stop_the_run(tmp_path, monkeypatch, caplog):
    def refuse(logging, paths, run):
        raise RuntimeError("no service")

    monkeypatch.setitem(metrics_sinks.BACKENDS, "wandb", refuse)
    monkeypatch.setitem(feasibility.METRIC_PACKAGES, "wandb", "json")
    cfg = build_config({"logging": {"wandb": True}})
    with caplog.at_level(logging.WARNING, "reflow.metrics"):
        writer = MetricsWriter(cfg.logging, RunPaths(tmp_path), {})
    assert [s.name for s in writer.sinks] == ["jsonl"]
    assert "wandb not started: no service" in caplog.text


def test_a_backend_without_its_package_is_a_recipe_error(monkeypatch):
    monkeypatch.setitem(metrics_sinks.BACKENDS, "wandb", lambda logging, paths, run: None)
    monkeypatch.setitem(feasibility.METRIC_PACKAGES, "wandb", "no_such_package_for_reflow")
    with pytest.raises(RecipeError, match=r"^<recipe>: logging\.wandb: true needs the .no_such"):
        build_config({"logging": {"wandb": True}})
    assert isinstance(build_config({}), Config)  # off: no package needed
