"""A rollout driver pinned to an eval round's version takes part in a weight sync and keeps
its weights (``WeightSync.hold``): the transfer is received and dropped, on the gloo path as
an engine that has the version already does, and it loads again once no longer held."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from runtime.config.lora_config import LoraConfig
from runtime.weights import p2p
from runtime.weights.receive import PolicyReceiver
from runtime.weights.settings import WeightPathConfig

pytestmark = pytest.mark.unit


class Engine:
    serves_adapter = False
    weights_valid = True
    model_path = "unused"

    def __init__(self) -> None:
        self.version = 1
        self.loaded: list[int] = []

    async def update_weights(self, path: str, version: int) -> float:
        self.loaded.append(version)
        self.version = version
        return 0.0


def test_a_held_sync_is_received_and_dropped_then_the_next_one_loads(tmp_path, monkeypatch):
    sent = {"w": torch.ones(2)}
    version = {"v": 2}
    monkeypatch.setattr(
        p2p,
        "receive_weights_header",
        lambda group: SimpleNamespace(transport="gloo", version=version["v"]),
    )
    monkeypatch.setattr(p2p, "receive_all", lambda group, header: dict(sent))
    config = WeightPathConfig("float32", 1 << 20, LoraConfig(), False, 1)
    engine = Engine()
    receiver = PolicyReceiver(config, 1, engine, object(), tmp_path, 10.0)

    assert receiver.receive(lambda: None, hold=True) is None  # held: nothing to load
    assert engine.loaded == [] and engine.version == 1
    assert receiver.records[-1]["loaded"] == 0.0 and receiver.records[-1]["version"] == 2.0

    version["v"] = 3
    update = receiver.receive(lambda: None)  # no longer held: the newest version loads
    assert update is not None
    asyncio.run(update)
    assert engine.loaded == [3] and engine.version == 3
