"""Rank 0's torch.distributed store listens on the one address the other ranks connect to,
not on every interface: the store takes no key, so what cannot reach it cannot use it.

Each case forms a real two-rank gloo group in two processes and reads, from
``/proc/net/tcp*``, the TCP sockets each process listens on.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# One rank: join, report this process's listening sockets (address, port), leave.
RANK = """
import json, os, sys
from pathlib import Path
from runtime.rank.collective import Collective

rank, out, bind, endpoint = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
host, _, port = endpoint.rpartition(":")
c = Collective.join(
    rank=rank, world_size=2, rendezvous=out / "dist.json", bind_host=bind,
    advertise_host=host or "127.0.0.1", backend="gloo", bucket_bytes=1 << 20, timeout_s=60,
    endpoint=(host, int(port)) if host else None,
)

def listening():
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in mine:  # 0A: LISTEN
                addr, p = f[1].split(":")
                raw = bytes.fromhex(addr)
                if len(raw) == 4:
                    ip = ".".join(str(b) for b in raw[::-1])
                else:  # four little-endian 32-bit words
                    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
                    import ipaddress
                    ip = str(ipaddress.IPv6Address(words))
                found.append([ip, int(p, 16)])
    return found

import torch.distributed as dist
dist.barrier()  # both ranks are in: every socket gloo opens is open now
(out / f"rank{rank}.json").write_text(json.dumps({"listen": listening()}))
dist.barrier()
c.close()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def form_group(tmp_path: Path, bind: str, endpoint: str, env: dict[str, str]) -> list[dict]:
    full = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **env}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(r), str(tmp_path), bind, endpoint],
            env=full,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def store_sockets(reports: list[dict], port: int) -> list[str]:
    return [ip for ip, p in reports[0]["listen"] if p == port]


def test_the_store_listens_on_loopback_only_in_a_local_run(tmp_path):
    reports = form_group(tmp_path, "127.0.0.1", "", {"GLOO_SOCKET_IFNAME": "lo"})
    port = json.loads((tmp_path / "dist.json").read_text())["port"]
    assert store_sockets(reports, port) == ["127.0.0.1"]
    # gloo's own pair sockets, on both ranks, follow GLOO_SOCKET_IFNAME=lo
    others = [ip for r in reports for ip, p in r["listen"] if p != port]
    assert others and all(ip == "127.0.0.1" for ip in others), reports


def test_a_wildcard_bind_listens_on_the_address_the_ranks_connect_to(tmp_path):
    """The Slurm case: bind_host 0.0.0.0, the submitit endpoint names rank 0's node."""
    port = free_port()
    reports = form_group(tmp_path, "0.0.0.0", f"127.0.0.1:{port}", {"GLOO_SOCKET_IFNAME": "lo"})
    assert store_sockets(reports, port) == ["127.0.0.1"]


def outward_address() -> str | None:
    """An address of this host other than loopback, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        ip = s.getsockname()[0]
    return None if ip.startswith("127.") else ip


def test_a_cluster_address_is_the_only_one_the_store_listens_on(tmp_path):
    ip = outward_address()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address")
    port = free_port()
    reports = form_group(tmp_path, "0.0.0.0", f"{ip}:{port}", {"GLOO_SOCKET_IFNAME": "lo"})
    assert store_sockets(reports, port) == [ip]


def test_the_listen_address_is_an_address_not_a_wildcard():
    from runtime.rank.rendezvous import store_listen_address

    assert store_listen_address("127.0.0.1", "elsewhere.invalid") == "127.0.0.1"
    assert store_listen_address("0.0.0.0", "127.0.0.1") == "127.0.0.1"
    assert store_listen_address("::", "localhost") in ("127.0.0.1", "::1")
