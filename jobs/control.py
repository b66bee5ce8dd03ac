"""A short-lived, authenticated client of a run's coordinator (used by the CLI and tests)."""

from __future__ import annotations

import os
import secrets

import zmq

from jobs.errors import UserError
from runtime.store.run_dir import RunPaths, read_json
from runtime.transport import protocol as p
from runtime.transport.auth import CLIENT, KeyFileError, load_keypair, secure_client


class ControlUnavailable(UserError):
    """The coordinator did not answer (run ended, not started yet, or unreachable)."""


class ControlClient:
    def __init__(self, paths: RunPaths, timeout_s: float = 5.0) -> None:
        self.paths = paths
        self.timeout_ms = int(timeout_s * 1000)
        try:
            control = read_json(paths.control)
        except (OSError, ValueError):
            raise ControlUnavailable(
                f"{paths.control}: no coordinator address yet (has rank 0 started?)"
            ) from None
        if not isinstance(control.get("address"), str):
            # rank 0 wrote why it could not start instead (runtime/entry.py)
            why = control.get("failed") or "no coordinator address (has rank 0 started?)"
            raise ControlUnavailable(f"run {paths.name}: {why}")
        try:
            self._keys = load_keypair(paths.keys, CLIENT)
        except KeyFileError as exc:
            raise UserError(str(exc)) from None
        self.address: str = control["address"]
        self._server_public = control["server_public"].encode()

    def request(self, msg: p.Message) -> p.Message:
        ctx = zmq.Context.instance()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, f"cli-{os.getpid()}-{secrets.token_hex(4)}".encode())
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, self.timeout_ms)  # no peer yet: fail, do not hang
        secure_client(sock, self._keys, self._server_public)
        sock.connect(self.address)
        try:
            try:
                sock.send_multipart(p.encode(msg))
            except zmq.Again:
                raise ControlUnavailable(
                    f"run {self.paths.name}: cannot reach the coordinator at {self.address}"
                ) from None
            if not sock.poll(self.timeout_ms):
                raise ControlUnavailable(
                    f"run {self.paths.name}: the coordinator at {self.address} did not answer "
                    f"within {self.timeout_ms / 1000:.0f} s"
                )
            return p.decode(sock.recv_multipart())
        finally:
            sock.close()

    def status(self) -> dict:
        reply = self.request(p.StatusRequest())
        if not isinstance(reply, p.StatusReply):
            raise ControlUnavailable(f"unexpected answer {reply.TYPE} to a status request")
        return reply.status

    def command(self, msg: p.Message) -> p.Reply:
        reply = self.request(msg)
        if not isinstance(reply, p.Reply):
            raise ControlUnavailable(f"unexpected answer {reply.TYPE} to {msg.TYPE}")
        return reply
