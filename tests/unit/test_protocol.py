import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.transport import protocol as p

EXAMPLES = [
    p.Hello(rank=1, world_size=4, node="n1", pid=123),
    p.Ready(rank=1, role="trainer", layout_epoch=0),
    p.Heartbeat(
        rank=2,
        role="rollout",
        state="idle",
        layout_epoch=3,
        rollout_active_s=1.0,
        rollout_busy_s=0.5,
        engine={},
    ),
    p.HeartbeatAck(step=4, policy_version=4),
    p.RoleSwitchDone(rank=0, role="rollout", layout_epoch=1, duration_s=0.5),
    p.StepDone(
        rank=0, step=3, policy_version=3, batch_id=-1, metrics={"loss": 0.1}, blobs=(b"\x00" * 8,)
    ),
    p.Bye(rank=3, reason="done"),
    p.WorkRequest(rank=2, slots=4),
    p.SampleDone(
        rank=2,
        sample_id=5,
        group_id=1,
        prompt_id=1,
        versions=[[0, 0, 1], [1, 1, 2]],
        reward=1.0,
        n_valid=2,
        started_at=0.0,
        finished_at=1.0,
        extra={"k": "v"},
        blobs=(b"\x01\x00\x00\x00" * 2, b"\x00\x00\x80\xbf" * 2),
    ),
    p.BatchRequest(rank=0),
    p.SampleFailed(rank=2, sample_id=3, reason="boom"),
    p.Work(
        policy_version=0, requests=[{"sample_id": 1, "group_id": 0, "prompt_id": 0, "prompt": {}}]
    ),
    p.Batch(batch_id=0, policy_version=0, samples=[{"sample_id": 1}], blobs=(b"", b"")),
    p.BatchWait(reason="waiting"),
    p.Welcome(
        rank=1,
        role="rollout",
        layout_epoch=0,
        heartbeat_interval_s=1.0,
        roles=["trainer", "rollout"],
    ),
    p.WeightSync(policy_version=3, layout_epoch=1),
    p.RoleSwitch(layout_epoch=2, roles=["trainer", "rollout"]),
    p.Stop(reason="x"),
    p.StatusRequest(),
    p.StatusReply(status={"state": "RUNNING", "workers": [{"rank": 0}]}),
    p.RebalanceRequest(rollout=3, trainer=1),
    p.AllocatorRequest(auto=False),
    p.StopRequest(reason="reflow stop"),
    p.Reply(ok=True, text="fine"),
    p.Checkpoint(step=10),
    p.CheckpointSaved(rank=0, step=10, ok=False, error="disk full"),
]


def test_every_registered_type_has_an_example():
    assert {type(m) for m in EXAMPLES} == set(p.message_types().values())


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.TYPE)
def test_round_trip(msg):
    back = p.decode(p.encode(msg))
    assert back == msg and back.blobs == msg.blobs


def header(**fields):
    return msgpack.packb(fields, use_bin_type=True)


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "0 frames"),
        ([b"\xc1garbage"], "not msgpack"),
        ([header(a=1)], "protocol version"),
        ([msgpack.packb([1, 2])], "not a map"),
        ([header(v=99, type="hello")], "protocol version 99"),
        ([header(v=p.PROTOCOL_VERSION, type="nope")], "unknown message type"),
        ([header(v=p.PROTOCOL_VERSION, type="hello", rank=1, world_size=4, node="n")], "fields"),
        (
            [
                header(
                    v=p.PROTOCOL_VERSION, type="hello", rank=1, world_size=4, node="n", pid=1, x=2
                )
            ],
            "fields",
        ),
        (
            [header(v=p.PROTOCOL_VERSION, type="hello", rank="1", world_size=4, node="n", pid=1)],
            "wrong type",
        ),
        (
            [header(v=p.PROTOCOL_VERSION, type="hello", rank=True, world_size=4, node="n", pid=1)],
            "wrong type",
        ),
        (
            [header(v=p.PROTOCOL_VERSION, type="hello", rank=7, world_size=4, node="n", pid=1)],
            "rank outside",
        ),
        (
            [
                header(
                    v=p.PROTOCOL_VERSION,
                    type="heartbeat",
                    rank=0,
                    role="chef",
                    state="idle",
                    layout_epoch=0,
                    rollout_active_s=0.0,
                    rollout_busy_s=0.0,
                    engine={},
                )
            ],
            "unknown role",
        ),
        (
            [
                header(
                    v=p.PROTOCOL_VERSION,
                    type="role_switch_done",
                    rank=0,
                    role="rollout",
                    layout_epoch=0,
                    duration_s=float("nan"),
                )
            ],
            "wrong type",
        ),
        ([header(v=p.PROTOCOL_VERSION, type="status_request")] + [b""] * 20000, "frames"),
    ],
)
def test_invalid_frames_are_rejected(frames, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode(frames)


def sample_done(**over):
    fields = dict(
        v=p.PROTOCOL_VERSION,
        type="sample_done",
        rank=2,
        sample_id=5,
        group_id=1,
        prompt_id=1,
        versions=[[0, 0, 2]],
        reward=1.0,
        n_valid=2,
        started_at=0.0,
        finished_at=1.0,
        extra={},
    )
    fields.update(over)
    return header(**fields)


@pytest.mark.parametrize(
    ("over", "blobs", "reason"),
    [
        ({}, [b"\0" * 8], "needs token and log-prob frames"),
        ({}, [b"\0" * 8, b"\0" * 4], "frame sizes differ"),
        ({"n_valid": 3}, [b"\0" * 8, b"\0" * 8], "n_valid exceeds"),
        ({"versions": [[0, 0, 1]]}, [b"\0" * 8, b"\0" * 8], "do not cover"),
        ({"versions": [[0, 0, 1], [1, 0, 2]]}, [b"\0" * 8, b"\0" * 8], "bad spans"),
        ({"versions": []}, [b"\0" * 8, b"\0" * 8], "no version spans"),
    ],
)
def test_invalid_trajectories_are_rejected(over, blobs, reason):
    with pytest.raises(p.ProtocolError, match=reason):
        p.decode([sample_done(**over), *blobs])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=256), min_size=0, max_size=4))
def test_random_bytes_never_raise_anything_but_protocol_error(frames):
    with contextlib.suppress(p.ProtocolError):  # anything else escapes and fails the test
        p.decode(frames)


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(p.message_types())), st.dictionaries(st.text(max_size=12), json_like))
def test_random_fields_for_a_real_type_never_crash(kind, fields):
    try:
        msg = p.decode([header(**{**fields, "v": 1, "type": kind})])
    except p.ProtocolError:
        return
    assert kind == msg.TYPE  # only possible when the random fields happened to be valid
