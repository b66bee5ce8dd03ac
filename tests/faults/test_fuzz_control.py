"""Bad input on the control plane: fuzzed messages at rank 0's coordinator, raw garbage and
a flood over the real authenticated socket. Rank 0 stays up, counts every one as
rejected, and its state does not change."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import time
import typing

import msgpack
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.control import ControlClient
from runtime.data.sample import Sample
from runtime.transport import envelope
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.auth import CLIENT, SERVER, load_keypair, secure_client
from tests.integration.test_control_security import server  # noqa: F401 - a fixture
from tests.unit.test_coordinator import Clock, ident, make, register_all
from tests.unit.test_protocol import EXAMPLES

# Client commands a run's own key may legitimately send (and that would change state):
# fuzzing sends only malformed versions of them.
COMMANDS = (p.StopRequest, p.RebalanceRequest, p.AllocatorRequest, p.StatusRequest)


def snapshot(c) -> dict:
    s = c.status()
    for key in ("control", "uptime_s", "updated_at"):
        s.pop(key)
    for w in s["workers"]:
        w.pop("heartbeat_age_s")
    return s


junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=3),
)


@st.composite
def fuzzed_frames(draw) -> list[bytes]:
    example = draw(st.sampled_from(EXAMPLES))
    header = {"v": p.PROTOCOL_VERSION, "type": example.TYPE}
    header.update({f.name: getattr(example, f.name) for f in dataclasses.fields(example)
                   if f.name != "blobs"})  # fmt: skip
    fields = [k for k in header if k not in ("v", "type")]
    how = draw(st.sampled_from(["drop", "extra", "retype", "type", "version", "blobs", "raw"]))
    if how == "drop" and fields:
        del header[draw(st.sampled_from(fields))]
    elif how == "retype" and fields:
        name = draw(st.sampled_from(fields))
        hint = typing.get_type_hints(type(example))[name]
        # a value of a type the field does not take (random junk may happen to fit)
        candidates = [draw(junk), b"\x00", [[b"x"]], {"k": b"v"}]
        header[name] = next(v for v in candidates if not envelope._conforms(hint, v))
    elif how == "type":
        header["type"] = draw(st.text(max_size=12).filter(lambda t: t not in p.message_types()))
    elif how == "version":
        header["v"] = draw(st.integers().filter(lambda v: v != p.PROTOCOL_VERSION))
    elif how == "blobs":  # frame counts no message type accepts
        return [msgpack.packb(header, use_bin_type=True)] + [b"\x00"] * draw(
            st.integers(p.MAX_FRAMES, p.MAX_FRAMES + 3)
        )
    elif how == "raw":
        return [draw(st.binary(max_size=64))] * draw(st.integers(1, 3))
    else:  # extra field
        header[draw(st.text(min_size=1, max_size=8).filter(lambda k: k not in header))] = 1
    try:
        head = msgpack.packb(header, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        head = b"\xc1"  # msgpack cannot even encode it: garbage bytes instead
    return [head, *getattr(example, "blobs", ())]


@pytest.fixture(scope="module")
def running():
    clock = Clock()
    c = make(clock)
    register_all(c)
    assert c.state == "RUNNING"
    return c, snapshot(c)


@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
@given(frames=fuzzed_frames(), sender=st.sampled_from([b"stranger", ident(1), b"cli"]))
def test_ten_thousand_fuzzed_messages_are_rejected_without_a_state_change(running, frames, sender):
    c, before = running
    rejected = sum(c.messages.rejected.values())
    out = c.on_frames(sender, frames)
    assert out == []
    assert sum(c.messages.rejected.values()) == rejected + 1
    assert snapshot(c) == before


def _client(server):  # noqa: F811
    keys = load_keypair(server.paths.keys, CLIENT)
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    secure_client(sock, keys, load_keypair(server.paths.keys, SERVER).public)
    sock.connect(server.address)
    return sock


def _wait_rejected(server, n: int, timeout: float) -> dict:  # noqa: F811
    deadline = time.monotonic() + timeout
    while True:
        status = ControlClient(server.paths).status()
        if status["control"]["rejected"] >= n or time.monotonic() > deadline:
            return status
        time.sleep(0.2)


def test_raw_garbage_frames_and_a_flood_over_the_socket(server):  # noqa: F811
    rng = random.Random(11)
    sock = _client(server)
    before = ControlClient(server.paths).status()
    for _ in range(1000):  # raw garbage: random multi-frame messages
        sock.send_multipart([rng.randbytes(rng.randint(0, 200)) for _ in range(rng.randint(1, 4))])
    status = _wait_rejected(server, 1000, 30)
    assert status["control"]["rejected"] == 1000
    # A flood from loopback (bounded): 20,000 forged messages as fast as they go; the
    # coordinator is still answering right after, and counts every one.
    forged = p.encode(p.Bye(rank=3, reason="forged"))
    start = time.monotonic()
    for _ in range(20_000):
        sock.send_multipart(forged)
    status = _wait_rejected(server, 21_000, 120)
    assert status["control"]["rejected"] == 21_000
    assert time.monotonic() - start < 120
    for key in ("state", "step", "layout", "workers"):
        assert status[key] == before[key]
    assert server._thread.is_alive()
    sock.close()


# --- valid-shaped, hostile content -----------------------------------------------------

ints = st.integers(-(2**40), 2**40)
plain = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=8,
)


@st.composite
def hostile_messages(draw) -> tuple[int, p.Message]:
    """Messages that decode (right types, protocol checks pass) but lie: ids that were
    never dispatched or belong to another rank, tokens outside the vocabulary, NaN-free
    but absurd log-probs, forged steps, versions from the future."""
    rank = draw(st.integers(0, 3))
    kind = draw(st.sampled_from(["sample", "step", "beat", "failed", "batch", "switch"]))
    if kind == "sample":
        n = draw(st.integers(1, 40))
        tokens = draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n))
        logprobs = draw(st.lists(st.floats(width=32), min_size=n, max_size=n))
        cut = draw(st.integers(0, n))
        v1 = draw(st.integers(0, 2**40))
        versions = [[v1, 0, cut], [v1 + draw(st.integers(0, 5)), cut, n]]
        prompt = draw(st.one_of(st.just([1, 2, 3]), st.lists(st.integers(-5, 70), max_size=5)))
        mask = draw(st.one_of(st.none(), st.lists(st.integers(0, 1), min_size=n, max_size=n)))
        t = Sample(
            sample_id=draw(st.integers(0, 64)),
            group_id=draw(st.integers(0, 64)),
            prompt_id=draw(st.integers(0, 64)),
            versions=versions,
            token_ids=tokens,
            logprobs=logprobs,
            reward=draw(st.floats(allow_nan=False, allow_infinity=False)),
            n_valid=draw(st.integers(0, n)),
            worker=rank,
            prompt_token_ids=prompt,
            loss_mask=mask,
            info=draw(st.dictionaries(st.sampled_from(["reward_error", "x"]), plain)),
        )
        return rank, wire.sample_done(t, rank)
    if kind == "step":
        return rank, p.StepDone(
            rank=rank,
            step=draw(st.integers(1, 2**40)),
            policy_version=draw(st.integers(0, 2**40)),
            batch_id=draw(st.integers(-1, 2**40)),
            metrics=draw(st.dictionaries(st.text(max_size=6), st.floats(allow_nan=False,
                                                                        allow_infinity=False))),
        )  # fmt: skip
    if kind == "beat":
        return rank, p.Heartbeat(
            rank=rank,
            role=draw(st.sampled_from(p.ROLES)),
            state=draw(st.sampled_from(p.WORKER_STATES)),
            layout_epoch=draw(ints),
            rollout_active_s=draw(st.floats(0, 1e12)),
            rollout_busy_s=draw(st.floats(0, 1e12)),
            engine=draw(st.dictionaries(st.text(max_size=6), st.floats(0, 1e12), max_size=4)),
        )
    if kind == "failed":
        return rank, p.SampleFailed(
            rank=rank, sample_id=draw(st.integers(0, 2**40)), reason=draw(st.text(max_size=20))
        )
    if kind == "batch":
        return rank, p.BatchRequest(rank=rank, last_batch_id=draw(st.integers(-1, 2**40)))
    return rank, p.RoleSwitchDone(
        rank=rank,
        role=draw(st.sampled_from(p.ROLES)),
        layout_epoch=draw(ints),
        duration_s=draw(st.floats(0, 1e6)),
    )


@settings(max_examples=3000, deadline=None, suppress_health_check=list(HealthCheck))
@given(stream=st.lists(hostile_messages(), min_size=1, max_size=30))
def test_hostile_content_from_registered_ranks_never_breaks_rank_0(stream):
    clock = Clock()
    prompts = ({"prompt_ids": [1, 2, 3], "text": f"p{i}"} for i in itertools.count())
    c = make(clock, prompts=prompts, vocab_size=64, logging={"samples": True})
    register_all(c)
    c.handle(ident(2), p.WorkRequest(rank=2, slots=8))  # real requests for lies to aim at
    for rank, msg in stream:
        clock.t += 0.1
        c.on_frames(ident(rank), p.encode(msg))
        c.tick()
    assert c.state in ("RUNNING", "FAILED")  # never COMPLETED, never a crash
    assert c.step == 0  # no forged step was taken: no batch was ever trained
    assert c.data.ledger_problems() == []
    for t in c.data.buffer.samples():  # what entered the buffer is what the run could make
        assert min(t.token_ids) >= 0 and max(t.token_ids) < 64
        assert list(t.prompt_token_ids) == [1, 2, 3]
    json.dumps(c.status())
    json.dumps(c.reports.new_lines)
    json.dumps(c.reports.new_samples)
