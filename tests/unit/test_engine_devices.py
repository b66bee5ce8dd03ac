"""The GPUs a rollout replica's engine is shown (CUDA_VISIBLE_DEVICES while it starts)."""

from __future__ import annotations

import os

import pytest

from runtime.engines.vllm.devices import replica_devices, visible_devices

pytestmark = pytest.mark.unit


def test_a_driver_gets_its_replicas_local_gpus():
    # 8 GPUs a node, TP 2: rank 10 is local rank 2 of the second node, its replica 2..3
    assert replica_devices(10, 2, 8, {}) == "2,3"
    assert replica_devices(10, 2, 8, {"SLURM_LOCALID": "4"}) == "4,5"
    assert replica_devices(3, 1, 8, {"LOCAL_RANK": "3"}) == "3"  # TP 1: its own GPU only
    # a job's own device list: the entries at those local indices
    assert replica_devices(2, 2, 4, {"CUDA_VISIBLE_DEVICES": "7,5,3,1"}) == "3,1"


def test_a_replica_off_the_end_of_the_node_is_an_error():
    with pytest.raises(ValueError, match="does not fit a node of 8"):
        replica_devices(7, 2, 8, {})
    with pytest.raises(ValueError, match="lists 2 GPUs"):
        replica_devices(2, 2, 8, {"CUDA_VISIBLE_DEVICES": "0,1"})


def test_the_variable_is_put_back_after_the_engine_starts(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    with visible_devices("2,3"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with visible_devices("1"):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with visible_devices(None):  # CPU: nothing set
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
