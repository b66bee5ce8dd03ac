"""A rank's connection to rank 0: sends that never block, results kept until acknowledged.

Rank 0 acknowledges results (finished and failed samples) by id and the trainer's step
report by step, in the acks of its heartbeat replies; until then each is sent again every
``resend_after_s``, so a message lost on the wire (a reconnect, a dropped frame) costs a
delay, not a sample or a step. Everything else goes once: heartbeats repeat by nature,
and rank 0's timeouts cover what silence means.
"""

from __future__ import annotations

import logging
import time

import zmq

from runtime.transport import protocol as p

log = logging.getLogger(__name__)

# Results rank 0 must acknowledge; sent again while it has not.
RELIABLE = (p.SampleDone, p.SampleFailed)


class CoordinatorLink:
    """The rank's DEALER socket to rank 0 (CURVE-secured by the worker that opens it) and
    what it still owes rank 0."""

    def __init__(self, resend_after_s: float) -> None:
        self.sock: zmq.Socket | None = None
        self.resend_after_s = resend_after_s
        self.unsent = 0  # sends that found no live connection
        self.resent = 0  # results and step reports sent again
        # sample id -> [message, when last sent]; forgotten when rank 0 acks the id
        self._unacked: dict[int, list] = {}
        self._step_report: list | None = None  # [StepDone, when last sent] until acked

    def send(self, msg: p.Message) -> bool:
        """Send now if we can. Results and step reports are also kept until acknowledged
        (and so count as sent: they will reach rank 0)."""
        now = time.monotonic()
        if isinstance(msg, RELIABLE):
            self._unacked[msg.sample_id] = [msg, now]
        elif isinstance(msg, p.StepDone):
            self._step_report = [msg, now]
        sent = self._transmit(msg)
        return sent or isinstance(msg, (*RELIABLE, p.StepDone))

    def _transmit(self, msg: p.Message) -> bool:
        # Never block: with no live connection to rank 0 (not up yet, gone, or the CURVE
        # handshake refused) a DEALER send would wait forever. The heartbeat and HELLO
        # loops retry, and silence is what the coordinator's timeout is for.
        assert self.sock is not None
        try:
            self.sock.send_multipart(p.encode(msg), flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            self.unsent += 1
            return False

    def on_ack(self, ack: p.HeartbeatAck) -> None:
        """Rank 0 has these results and this step: forget them."""
        for sid in ack.acked:
            self._unacked.pop(sid, None)
        if self._step_report is not None and ack.step >= self._step_report[0].step:
            self._step_report = None

    def resend_unacked(self, now: float) -> None:
        """What rank 0 has not acknowledged in ``resend_after_s`` goes out again."""
        entries = list(self._unacked.values())
        if self._step_report is not None:
            entries.append(self._step_report)
        for entry in entries:
            if now - entry[1] > self.resend_after_s:
                self.resent += 1
                self._transmit(entry[0])
                entry[1] = now

    def recv(self, timeout_ms: int) -> p.Message | None:
        """A message from rank 0 within ``timeout_ms``, or None (none came, or it was
        invalid: dropped with a warning)."""
        assert self.sock is not None
        if not self.sock.poll(timeout_ms):
            return None
        frames = self.sock.recv_multipart()
        try:
            return p.decode(frames, max_header_bytes=p.MAX_HEADER_BYTES_FROM_COORDINATOR)
        except p.ProtocolError as exc:
            log.warning("dropping an invalid message from the coordinator: %s", exc)
            return None
