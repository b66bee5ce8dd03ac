"""The coordinator's ZeroMQ edge: a ROUTER socket with CURVE auth, run in a thread of rank 0.

Like vLLM's ``EngineCoreProc`` around ``EngineCore``: this class owns the socket, the
clock and the files; every decision is taken by :class:`runtime.control.coordinator.Coordinator`.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import socket
import threading
import time

import zmq

from runtime.config.recipe import config_to_dict
from runtime.control.coordinator import Coordinator, Outgoing
from runtime.rank.bounded_log import BoundedLog
from runtime.store.metrics_sinks import MetricsWriter
from runtime.store.run_dir import RunPaths, write_json_atomic
from runtime.transport.auth import KeyPair, secure_server, start_authenticator
from runtime.transport.protocol import encode

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 << 20
SNAPSHOT_PERIOD_S = 1.0


class ControlServer:
    def __init__(
        self,
        coordinator: Coordinator,
        paths: RunPaths,
        server_keys: KeyPair,
        client_public: bytes,
        *,
        bind_host: str = "127.0.0.1",
        advertise_host: str | None = None,
        publish: dict | None = None,
    ) -> None:
        self.coordinator = coordinator
        self._publish = dict(publish or {})  # extra control.json keys: attempt, resume
        self.paths = paths
        self._server_keys = server_keys
        self._client_public = client_public
        self._bind_host = bind_host
        self._advertise_host = advertise_host or bind_host
        self._commands: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        cfg = coordinator.cfg
        self._metrics = MetricsWriter(cfg.logging, paths, config_to_dict(cfg))
        self._bounded = BoundedLog(log)  # refusals and handler errors: a line per period
        self.address = ""

    def start(self) -> str:
        """Bind, publish ``control.json`` and serve in a background thread."""
        self._bind()
        self._thread = threading.Thread(target=self._serve, name="reflow-control", daemon=True)
        self._thread.start()
        log.info("coordinator listening on %s", self.address)
        return self.address

    def _bind(self) -> None:
        self._ctx = zmq.Context()
        self._auth = start_authenticator(self._ctx, self._client_public)
        sock = self._ctx.socket(zmq.ROUTER)
        secure_server(sock, self._server_keys)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a rank that reconnects keeps its identity
        # A reply to a peer with no pipe raises instead of vanishing: the coordinator hears
        # of it (work in it is requeued at once) rather than finding out by a timeout.
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 1000)
        port = sock.bind_to_random_port(f"tcp://{self._bind_host}")
        self._sock = sock
        self.address = f"tcp://{self._advertise_host}:{port}"
        write_json_atomic(
            self.paths.control,
            {
                "address": self.address,
                "server_public": self._server_keys.public.decode(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "run": self.paths.name,
                **self._publish,
            },
        )

    def request_stop(self, reason: str) -> None:
        """Graceful stop. Thread-safe (signal handlers call it)."""
        self._commands.put(("stop", reason))

    def fail(self, reason: str) -> None:
        """Rank 0's own worker cannot go on: the run fails with this reason. Thread-safe."""
        self._commands.put(("fail", reason))

    def join(self, timeout: float | None = None) -> bool:
        assert self._thread is not None
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def amend_reason(self, note: str) -> None:
        """After the run ended: add to its reason (e.g. a restart) in status and summary."""
        self.coordinator.amend_reason(note)
        self._snapshot()
        write_json_atomic(self.paths.summary, self.coordinator.summary())

    def _send(self, out: list[Outgoing]) -> None:
        for identity, msg in out:
            try:
                self._sock.send_multipart([identity, *encode(msg)], flags=zmq.NOBLOCK)
            except zmq.ZMQError as exc:  # no pipe to the peer (gone), or its queue is full
                log.debug("cannot deliver %s to %r: %s", msg.TYPE, identity, exc)
                self.coordinator.undelivered(identity, msg)

    def _serve(self) -> None:
        coord = self.coordinator
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        last_snapshot, last_state = 0.0, None
        try:
            while True:
                while not self._commands.empty():
                    kind, reason = self._commands.get()
                    if kind == "fail":
                        self._send(coord.fail(reason))
                    else:
                        self._send(coord.request_stop(reason))
                for _ in range(100):  # drain a burst, but keep ticking under load
                    if not poller.poll(0 if _ else 50):
                        break
                    frames = self._sock.recv_multipart(copy=True)
                    if len(frames) < 2:
                        coord.messages.reject("malformed", "no frames after the identity")
                        continue
                    refused = coord.messages.rejected.total()
                    try:
                        out = coord.on_frames(frames[0], frames[1:])
                    except Exception:  # a bug must not take rank 0 down; count and go on
                        coord.messages.reject("handler_error")
                        self._bounded(logging.ERROR, "error", "handler failed", exc_info=True)
                        continue
                    if (
                        coord.messages.rejected.total() > refused
                    ):  # counted by reason; a line at times
                        why = f"refused a message: {coord.messages.last_rejected[:200]}"
                        self._bounded(logging.WARNING, "refused", why)
                    self._send(out)
                self._send(coord.tick())
                try:
                    self._flush_metrics()
                except Exception:  # a line that cannot be written must not end rank 0
                    log.exception("writing metrics failed")
                    coord.messages.reject("metrics_write_error")
                now = time.monotonic()
                if coord.state != last_state or now - last_snapshot > SNAPSHOT_PERIOD_S:
                    if coord.state != last_state:
                        log.info("run state %s %s", coord.state, coord.reason)
                    self._snapshot()
                    last_snapshot, last_state = now, coord.state
                if coord.finished:
                    break
        finally:
            try:
                self._flush_metrics()
            except Exception:
                log.exception("writing metrics failed")
            # status and summary first: closing a metrics backend may wait on the network
            # (wandb's finish), and the run's record must not wait for it
            self._snapshot()
            write_json_atomic(self.paths.summary, self.coordinator.summary())
            try:
                self._metrics.close()
            except Exception:  # the run is over; its record is written: say why, go on
                log.exception("closing the metrics backends failed")
            self._sock.close(linger=500)
            self._auth.stop()
            self._ctx.term()

    def _flush_metrics(self) -> None:
        lines, samples = self.coordinator.reports.drain()
        self._metrics.write(lines)
        if samples:
            with (self.paths.root / "samples.jsonl").open("a") as fh:
                for row in samples:
                    fh.write(json.dumps(row) + "\n")

    def _snapshot(self) -> None:
        try:
            write_json_atomic(self.paths.status, self.coordinator.status())
        except (OSError, TypeError, ValueError) as exc:
            log.warning("cannot write %s: %s", self.paths.status, exc)
