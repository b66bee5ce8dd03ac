"""How a rank joins the run's world process group: the store, its address, the wait.

Rendezvous: rank 0 hosts a ``TCPStore``. On Slurm its address comes from submitit's
``TorchDistributedEnvironment`` (the job's first node, a port derived from the job id,
``MASTER_PORT`` to override), which every rank computes alike. A local run (unless
``MASTER_PORT`` is set) and a rank outside submitit use ``<run>/dist.json``: rank 0 takes a
free port and publishes ``host:port`` there and the other ranks wait for that file (a derived
port can be some other socket's on a busy host). Rank 0 publishes the file on Slurm too,
for a rank started again outside the job: ``reflow rejoin``, which joins the world group
anew and the groups of the next epoch (tested on gloo).

What is not authenticated: the store and gloo's and NCCL's peer connections take no key and
are not encrypted; CURVE covers only the control plane (runtime/rank/control_server.py). Anyone
who can reach the store's port while the run is up can read and write its keys, and
anyone who can reach a gloo or NCCL listening socket can connect to it. So the store listens
on one address, the one the other ranks connect to (:func:`store_listen_address`), never on
every interface: torch's own server binds ``[::]`` whatever host it is given, so rank 0
binds the socket itself and hands it over (``master_listen_fd``). gloo binds its listening
sockets to its device's address (``GLOO_SOCKET_IFNAME``'s, else what this host's name
resolves to); NCCL to the interface ``NCCL_SOCKET_IFNAME`` selects. The cluster network
between the nodes is trusted.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from runtime.rank.groups import CollectiveError
from runtime.store.run_dir import read_json, write_json_atomic

log = logging.getLogger(__name__)


def join_world(
    *,
    rank: int,
    world_size: int,
    rendezvous: Path,
    bind_host: str,
    advertise_host: str,
    backend: str,
    timeout_s: float,
    endpoint: tuple[str, int] | None = None,
) -> None:
    """Join the world group as ``rank`` (rank 0 hosts the store; see the module
    docstring for where its address comes from)."""
    timeout = timedelta(seconds=timeout_s)
    if endpoint is not None:  # known to every rank (TorchDistributedEnvironment)
        host, port = endpoint
        if rank == 0:
            store = _master_store(store_listen_address(bind_host, host), port, world_size, timeout)
            # for a rank started again outside the job (`reflow rejoin`)
            write_json_atomic(rendezvous, {"host": host, "port": port})
        else:
            store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    elif rank == 0:
        listen = store_listen_address(bind_host, advertise_host)
        store = _master_store(listen, 0, world_size, timeout)
        write_json_atomic(rendezvous, {"host": advertise_host, "port": store.port})
    else:
        host, port = _wait_for_rendezvous(rendezvous, timeout_s)
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    # gloo connects a group's pairs on first use, not all at its creation: a rank
    # started again (`reflow rejoin`) can then join the world group, whose other ranks
    # made theirs long ago, and the next epoch's groups (without it, its init waits
    # for them forever: measured)
    os.environ.setdefault("TORCH_GLOO_LAZY_INIT", "1")
    log.info("rank %d: the store answers; joining the process group", rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    log.info("joined the %s process group as rank %d of %d", backend, rank, world_size)


_WILDCARDS = ("", "0.0.0.0", "::", "*")


def store_listen_address(bind_host: str, connect_host: str) -> str:
    """The one IP address rank 0's store listens on.

    ``bind_host`` when it names an address (a local run's loopback, ``REFLOW_BIND_HOST``);
    when it is a wildcard (a Slurm run's default), the address ``connect_host`` resolves to
    here: the name the other ranks connect to, so they reach it and nothing else is opened.
    """
    host = connect_host if bind_host in _WILDCARDS else bind_host
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise CollectiveError(f"cannot resolve {host!r} to listen on ({exc})") from None
    address = str(infos[0][4][0])
    if ipaddress.ip_address(address).is_loopback and not _is_loopback_name(host):
        # e.g. a Debian-style /etc/hosts maps this node's name to 127.0.1.1: fine on one
        # node, but ranks on other nodes resolve it elsewhere and will time out.
        log.warning(
            "%s resolves to %s here: ranks on other nodes cannot reach the store; "
            "set REFLOW_BIND_HOST to this node's cluster address",
            host,
            address,
        )
    return address


def _is_loopback_name(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _master_store(address: str, port: int, world_size: int, timeout: timedelta) -> Any:
    """Rank 0's TCPStore, listening on ``address`` only.

    ``dist.TCPStore(host, ...)`` with ``is_master=True`` uses ``host`` only to connect its
    own client; its server binds every interface. A socket bound here and passed as
    ``master_listen_fd`` is the one it listens on instead.
    """
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # a requeued job reuses its port (derived from the job id) within TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(socket.SOMAXCONN)
    except OSError as exc:
        sock.close()
        raise CollectiveError(f"the store cannot listen on {address}:{port} ({exc})") from None
    bound_port = sock.getsockname()[1]
    # detach: the store owns the descriptor from here (closing it is the store's business)
    fd = sock.detach()
    return dist.TCPStore(
        address,
        bound_port,
        world_size,
        is_master=True,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=fd,
    )


def _wait_for_rendezvous(path: Path, timeout_s: float) -> tuple[str, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            info = read_json(path)
            return str(info["host"]), int(info["port"])
        except (FileNotFoundError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise CollectiveError(
                    f"{path}: rank 0 did not publish its process-group address "
                    f"within {timeout_s:.0f} s"
                ) from None
            time.sleep(0.1)
