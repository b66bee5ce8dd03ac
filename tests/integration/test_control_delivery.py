"""The control plane over real ZeroMQ sockets: a bad message never ends rank 0's control
thread, a reply with no pipe to take it is not silently dropped, and a rank keeps its
results until rank 0 has acknowledged them."""

from __future__ import annotations

import itertools
import json
import logging
import time

import msgpack
import pytest
import zmq

from jobs.control import ControlClient
from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.data.sample import Sample
from runtime.rank.control_server import ControlServer
from runtime.rank.coordinator_link import CoordinatorLink
from runtime.store.run_dir import RunPaths
from runtime.transport import frames as wire
from runtime.transport import protocol as p
from runtime.transport.auth import CLIENT, SERVER, create_run_keys, load_keypair, secure_client

pytestmark = pytest.mark.integration

RAW = {
    "resources": {"gpus_per_node": 4, "initial_ratio": "2:2"},
    "engine": {"rollout": "synthetic", "trainer": "synthetic"},
    "control": {"stop_grace_s": 1},
    "logging": {"samples": True},
}


def _prompts():
    return ({"prompt_ids": [1, 2], "text": f"p{i}"} for i in itertools.count())


@pytest.fixture
def served(tmp_path):
    paths = RunPaths(tmp_path)
    create_run_keys(paths.keys)
    cfg = build_config(RAW)
    srv = ControlServer(
        Coordinator(cfg, run="delivery", prompts=_prompts(), vocab_size=64),
        paths,
        load_keypair(paths.keys, SERVER),
        load_keypair(paths.keys, CLIENT).public,
    )
    srv.start()
    socks = [_rank_socket(srv, r) for r in range(4)]
    for r, sock in enumerate(socks):
        sock.send_multipart(p.encode(p.Hello(rank=r, world_size=4, node="n", pid=1000 + r)))
        welcome = _recv(sock, p.Welcome)
        sock.send_multipart(p.encode(p.Ready(rank=r, role=welcome.role, layout_epoch=0)))
    _wait(lambda: ControlClient(paths).status()["state"] == "RUNNING")
    yield srv, socks
    srv.request_stop("test over")
    for r, sock in enumerate(socks):  # the ranks leave when told, as real ones do
        sock.send_multipart(p.encode(p.Bye(rank=r, reason="test over")))
    assert srv.join(10)
    for sock in socks:
        sock.close()


def _rank_socket(srv: ControlServer, rank: int) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, f"rank-{rank}".encode())
    keys = load_keypair(srv.paths.keys, CLIENT)
    secure_client(sock, keys, load_keypair(srv.paths.keys, SERVER).public)
    sock.connect(srv.address)
    return sock


def _recv(sock: zmq.Socket, kind: type, timeout_s: float = 10.0) -> p.Message:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sock.poll(200):
            msg = p.decode(sock.recv_multipart())
            if isinstance(msg, kind):
                return msg
    raise AssertionError(f"no {kind.__name__} within {timeout_s} s")


def _wait(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_result_with_bytes_in_its_info_does_not_end_the_control_thread(served):
    srv, socks = served
    socks[2].send_multipart(p.encode(p.WorkRequest(rank=2, slots=1)))
    work = _recv(socks[2], p.Work)
    (req,) = work.requests
    t = Sample(
        sample_id=req["sample_id"],
        group_id=req["group_id"],
        prompt_id=req["prompt_id"],
        versions=[(0, 0, 3)],
        token_ids=[3, 4, 5],
        logprobs=[-1.0] * 3,
        reward=1.0,
        n_valid=3,
        worker=2,
        prompt_token_ids=[1, 2],
        info={"blob": b"\x00\xff"},
    )
    socks[2].send_multipart(p.encode(wire.sample_done(t, 2)))
    _wait(lambda: ControlClient(srv.paths).status()["control"]["rejected"] >= 1)
    # a line the writer cannot serialise is counted; rank 0 goes on serving
    srv.coordinator.reports.new_samples.append({"not json": object()})
    _wait(lambda: "metrics_write_error" in _rejected(srv))
    assert srv._thread.is_alive()
    assert ControlClient(srv.paths).status()["state"] == "RUNNING"


def _rejected(srv: ControlServer) -> dict:
    return ControlClient(srv.paths).status()["control"]["rejected_by_reason"]


def test_hostile_headers_are_refused_counted_and_logged_at_a_bounded_rate(served, caplog):
    # A rank holding the key sends header shapes that raised out of the decoder (a list or
    # a map as the type, keys mixing bytes and str): each was a handler error with a
    # 12-line traceback in rank 0's log. Now: refused by the decoder, counted, a line at
    # most every 10 s.
    srv, socks = served
    version = p.PROTOCOL_VERSION
    shapes = [
        {"v": version, "type": ["heartbeat"]},
        {"v": version, "type": {"a": 1}},
        {"v": version, "type": "work_request", b"rank": 2, "slots": 1},
    ]
    n = 300
    with caplog.at_level(logging.WARNING, logger="runtime.rank.control_server"):
        for i in range(n):
            socks[2].send_multipart([msgpack.packb(shapes[i % 3], use_bin_type=True)])
        _wait(lambda: _rejected(srv).get("malformed", 0) >= n)
    assert "handler_error" not in _rejected(srv)
    lines = [r for r in caplog.records if r.name == "runtime.rank.control_server"]
    assert 1 <= len(lines) <= 3, [r.getMessage() for r in lines]
    assert "refused a message: malformed: " in lines[0].getMessage()
    assert not any(r.exc_info for r in lines)  # no traceback per message
    assert ControlClient(srv.paths).status()["state"] == "RUNNING"


def test_a_reply_to_a_peer_with_no_pipe_reaches_the_coordinator(tmp_path):
    paths = RunPaths(tmp_path)
    create_run_keys(paths.keys)
    coord = Coordinator(build_config(RAW), run="ghost", prompts=_prompts(), vocab_size=64)
    for r in range(4):  # registered as if their sockets had been there
        coord.handle(f"rank-{r}".encode(), p.Hello(rank=r, world_size=4, node="n", pid=1 + r))
        role = coord.layout.role_of(r).value
        coord.handle(f"rank-{r}".encode(), p.Ready(rank=r, role=role, layout_epoch=0))
    ((_, work),) = coord.handle(b"rank-2", p.WorkRequest(rank=2, slots=2))
    assert len(coord.data.dispatcher.outstanding) == 2
    srv = ControlServer(
        coord, paths, load_keypair(paths.keys, SERVER), load_keypair(paths.keys, CLIENT).public
    )
    srv._bind()  # the real socket, no serving thread: rank 2 never connected
    try:
        srv._send([(b"rank-2", work)])
    finally:
        srv._sock.close(linger=0)
        srv._auth.stop()
        srv._ctx.term()
    assert coord.messages.undeliverable["work"] == 1
    assert coord.data.dispatcher.outstanding == {}
    assert coord.data.dispatcher.requeue_reasons["undelivered"] == 2


class _FlakySocket:
    """A DEALER stand-in whose sends fail with zmq.Again while ``down``."""

    def __init__(self) -> None:
        self.down = True
        self.sent: list[p.Message] = []

    def send_multipart(self, frames, flags=0) -> None:
        if self.down:
            raise zmq.Again()
        self.sent.append(p.decode(frames))


def test_a_rank_keeps_results_until_rank_0_acknowledges_them():
    link = CoordinatorLink(resend_after_s=5.0)  # a rank's (runtime/rank/coordinator_link.py)
    link.sock = _FlakySocket()
    t = Sample(
        sample_id=7,
        group_id=3,
        prompt_id=3,
        versions=[(0, 0, 2)],
        token_ids=[1, 2],
        logprobs=[-1.0, -1.0],
        reward=0.0,
        n_valid=2,
        worker=2,
        prompt_token_ids=[1, 2],
    )
    # no connection: the result is not dropped (the side is told it will go out)
    assert link.send(wire.sample_done(t, 2)) is True
    assert link.send(p.StepDone(rank=2, step=4, policy_version=4, batch_id=3, metrics={}))
    link.sock.down = False
    now = time.monotonic()
    link.resend_unacked(now)  # not overdue yet
    assert link.sock.sent == []
    link.resend_unacked(now + link.resend_after_s + 1)
    assert sorted(m.TYPE for m in link.sock.sent) == ["sample_done", "step_done"]
    # an ack for other ids and an older step keeps both; the right ones release them
    link.on_ack(p.HeartbeatAck(step=3, policy_version=3, acked=[99]))
    link.resend_unacked(now + 2 * (link.resend_after_s + 1))
    assert len(link.sock.sent) == 4
    link.on_ack(p.HeartbeatAck(step=4, policy_version=4, acked=[7]))
    link.resend_unacked(now + 3 * (link.resend_after_s + 1))
    assert len(link.sock.sent) == 4 and link.resent == 4 and link.unsent == 2


def test_a_metrics_backend_that_fails_to_close_does_not_cost_the_run_its_summary(served):
    srv, socks = served
    summary = srv.paths.summary

    def close() -> None:  # e.g. wandb's finish, on the network
        raise RuntimeError("the metrics service hung up")

    srv._metrics.close = close
    assert not summary.exists()
    srv.request_stop("test over")
    _wait(lambda: ControlClient(srv.paths).status()["state"] == "STOPPING")
    for r, sock in enumerate(socks):  # the ranks leave when told
        sock.send_multipart(p.encode(p.Bye(rank=r, reason="test over")))
    assert srv.join(10)  # the failing close did not end the thread early or hang it
    done = json.loads(summary.read_text())
    assert done["state"] == "STOPPED", done["reason"]
