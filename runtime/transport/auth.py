"""CurveZMQ keys of a run and the authenticated sockets built from them.

The launcher creates two key pairs per run in ``<run>/keys`` (files 0600, folder 0700):
the coordinator's (server) and one shared by every rank and the ``reflow`` CLI (client).
The coordinator's ZAP handler accepts only that client public key, so a peer without the
run's secret key gets no answer at all.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth.thread

SERVER = "server"
CLIENT = "client"
ZAP_DOMAIN = "reflow"
# Labels the one use of the server secret that is not CURVE: a derived key used for nothing
# else, so a MAC never doubles as anything CURVE would accept.
_CHECKPOINT_LABEL = b"reflow checkpoint manifest v1"


class KeyFileError(RuntimeError):
    """Missing or unreadable key files."""


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes


def _write_secret(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)  # O_CREAT's mode is filtered by the umask; be explicit


def create_run_keys(keys_dir: Path) -> None:
    keys_dir.mkdir(mode=0o700, parents=True, exist_ok=False)
    os.chmod(keys_dir, 0o700)
    for name in (SERVER, CLIENT):
        public, secret = zmq.curve_keypair()
        _write_secret(keys_dir / f"{name}.public", public)
        _write_secret(keys_dir / f"{name}.secret", secret)


def load_keypair(keys_dir: Path, name: str) -> KeyPair:
    try:
        public = (keys_dir / f"{name}.public").read_bytes().strip()
        secret = (keys_dir / f"{name}.secret").read_bytes().strip()
    except OSError as exc:
        raise KeyFileError(
            f"{keys_dir}: cannot read the {name} key pair ({exc.strerror})"
        ) from None
    if len(public) != 40 or len(secret) != 40:
        raise KeyFileError(f"{keys_dir}: the {name} key pair is not a Z85 CURVE key pair")
    return KeyPair(public, secret)


def checkpoint_key(keys_dir: Path) -> bytes:
    """The run's key for checkpoint manifests: HMAC-SHA256 of a fixed label under the
    coordinator's secret key. Derived, not stored, so a run folder holds no new secret and a
    resumed run (same folder, same keys) verifies its own checkpoints."""
    server = load_keypair(keys_dir, SERVER)
    return hmac.new(server.secret, _CHECKPOINT_LABEL, hashlib.sha256).digest()


def secure_server(sock: zmq.Socket, server: KeyPair) -> None:
    sock.curve_server = True
    sock.curve_publickey = server.public
    sock.curve_secretkey = server.secret
    sock.zap_domain = ZAP_DOMAIN.encode()


def secure_client(sock: zmq.Socket, client: KeyPair, server_public: bytes) -> None:
    sock.curve_publickey = client.public
    sock.curve_secretkey = client.secret
    sock.curve_serverkey = server_public


def start_authenticator(
    ctx: zmq.Context, allowed_client_public: bytes
) -> zmq.auth.thread.ThreadAuthenticator:
    """A ZAP handler (thread) that admits exactly one client public key."""
    auth = zmq.auth.thread.ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve_callback(
        domain=ZAP_DOMAIN, credentials_provider=_OneKey(allowed_client_public)
    )
    return auth


class _OneKey:
    def __init__(self, key: bytes) -> None:
        self._key = key
        self.rejected = 0

    def callback(self, domain: str, key: bytes) -> bool:
        # pyzmq hands the client's public key z85-encoded, the form the key files use.
        ok = key == self._key
        if not ok:
            self.rejected += 1
        return ok
