"""Every step's metrics line reaches TensorBoard event files and an offline W&B run, in a
real run (rank 0's control server, synthetic engines), and matches ``metrics.jsonl``."""

import json
import struct

import pytest

from tests.helpers import launch_recipe_text
from tests.helpers import wait_for_status as wait_for

RECIPE = """
name: logged
data: {train: "embedded:synthetic"}
workload: {max_response_tokens: 32}
algorithm: {group_size: 2}
train: {steps: 12, batch_size: 4}
resources: {nodes: 1, gpus_per_node: 2, initial_ratio: "1:1", device: cpu}
engine: {rollout: synthetic, trainer: synthetic}
control: {heartbeat_interval_s: 0.5, heartbeat_timeout_s: 20}
logging: {tensorboard: true, wandb: true, wandb_mode: offline, wandb_project: reflow-test}
"""


@pytest.mark.integration
def test_tensorboard_and_wandb_get_every_step(tmp_path, runs_dir, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir, run = launch_recipe_text(tmp_path, RECIPE, runs_dir)
    final = wait_for(run, lambda s: s["state"] in ("COMPLETED", "FAILED", "STOPPED"), 240)
    assert final["state"] == "COMPLETED", final.get("reason")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == list(range(1, 13))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    for key in ("reward_mean", "tokens", "trainer_idle_s"):
        scalars = events.Scalars(key)
        assert [e.step for e in scalars] == [x["step"] for x in lines], key
        assert [e.value for e in scalars] == pytest.approx([x[key] for x in lines], rel=1e-5)

    offline = list((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    assert len(offline) == 1, offline
    records = list(wandb_records(offline[0]))
    history = [
        {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in r.history.item}
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]
    assert [h["_step"] for h in history] == [x["step"] for x in lines]
    assert [h["reward_mean"] for h in history] == pytest.approx([x["reward_mean"] for x in lines])
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.project == "reflow-test" and run.display_name == run_dir.name
    assert any(r.WhichOneof("record_type") == "exit" for r in records), "run not finished"


def wandb_records(path):
    """The records of an offline W&B run file (wandb ships no reader for it): a 7-byte
    header, then LevelDB-log framing in 32 KiB blocks around protobuf ``Record``s."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, chunks = 7, 32768, []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0:
            continue
        chunks.append(payload)
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(b"".join(chunks))
            chunks = []
            yield record
