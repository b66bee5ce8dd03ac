"""The control plane over real ZeroMQ sockets: CURVE auth and hostile input."""

import os
import random
import socket
import time

import pytest
import zmq

from jobs.control import ControlClient, ControlUnavailable
from runtime.config.recipe import build_config
from runtime.control.coordinator import Coordinator
from runtime.rank.control_server import ControlServer
from runtime.store.run_dir import RunPaths, read_json
from runtime.transport import protocol as p
from runtime.transport.auth import CLIENT, SERVER, create_run_keys, load_keypair, secure_client


@pytest.fixture
def server(tmp_path):
    paths = RunPaths(tmp_path)
    create_run_keys(paths.keys)
    cfg = build_config({"resources": {"gpus_per_node": 4}, "control": {"stop_grace_s": 1}})
    srv = ControlServer(
        Coordinator(cfg, run="sec"),
        paths,
        load_keypair(paths.keys, SERVER),
        load_keypair(paths.keys, CLIENT).public,
    )
    srv.start()
    yield srv
    srv.request_stop("test over")
    assert srv.join(10)


def test_keys_are_private_files(server):
    keys = server.paths.keys
    assert oct(keys.stat().st_mode & 0o777) == "0o700"
    for f in keys.iterdir():
        assert oct(f.stat().st_mode & 0o777) == "0o600", f
    control = read_json(server.paths.control)
    assert control["address"] == server.address
    assert control["server_public"] == load_keypair(keys, SERVER).public.decode()


def test_the_runs_client_key_gets_answers(server):
    assert ControlClient(server.paths).status()["state"] == "STARTING"


def test_a_wrong_client_key_gets_no_answer(server):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    public, secret = zmq.curve_keypair()
    secure_client(
        sock,
        type("K", (), {"public": public, "secret": secret})(),
        load_keypair(server.paths.keys, SERVER).public,
    )
    sock.connect(server.address)
    if sock.poll(500, zmq.POLLOUT):  # the handshake is refused, so usually never writable
        sock.send_multipart(p.encode(p.StatusRequest()), flags=zmq.NOBLOCK)
    assert sock.poll(2000) == 0, "a client with a foreign key must get no answer"
    sock.close()
    plain = ctx.socket(zmq.DEALER)  # no CURVE at all
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(server.address)
    if plain.poll(500, zmq.POLLOUT):
        plain.send_multipart(p.encode(p.StatusRequest()), flags=zmq.NOBLOCK)
    assert plain.poll(1000) == 0
    plain.close()
    assert ControlClient(server.paths).status()["state"] == "STARTING"  # still serving


def test_a_client_without_a_server_gets_a_clear_error(tmp_path):
    paths = RunPaths(tmp_path)
    with pytest.raises(ControlUnavailable, match="no coordinator address yet"):
        ControlClient(paths)


def test_garbage_frames_are_counted_and_survived(server):
    rng = random.Random(7)
    keys = load_keypair(server.paths.keys, CLIENT)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    secure_client(sock, keys, load_keypair(server.paths.keys, SERVER).public)
    sock.connect(server.address)
    sent = 0
    for i in range(100):
        kind = i % 4
        if kind == 0:
            frames = [rng.randbytes(rng.randint(0, 64))]
        elif kind == 1:
            frames = [rng.randbytes(8) for _ in range(rng.randint(2, 5))]
        elif kind == 2:  # valid msgpack, wrong schema
            frames = [p.encode(p.StatusRequest())[0][:-1] + b"\x01"]
        else:  # a message only the coordinator may send
            frames = p.encode(p.Stop(reason="forged"))
        sock.send_multipart(frames)
        sent += 1
    # Raw TCP garbage from a peer that does not even speak ZMTP.
    host, port = server.address.removeprefix("tcp://").rsplit(":", 1)
    for _ in range(5):
        with socket.create_connection((host, int(port)), timeout=2) as raw:
            raw.sendall(os.urandom(512))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = ControlClient(server.paths).status()
        if status["control"]["rejected"] >= sent:
            break
        time.sleep(0.2)
    assert status["control"]["rejected"] == sent
    assert status["state"] == "STARTING"
    assert server._thread.is_alive()
    sock.close()
