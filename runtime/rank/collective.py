"""The ``torch.distributed`` edge of a rank: one process group per run, regrouped per layout.

Every rank of a run with real engines joins one world group (gloo on CPU, NCCL on GPU),
which is used for nothing but making the others. At each layout epoch the live ranks build,
in the same order, the epoch's subgroups; each group is made by its members only, under a
name of the epoch's own (:func:`epoch_group`), so a rank that has left the run (dead, hung:
``"gone"`` in the layout's roles) is never waited for:

- the **trainer group**: the trainer ranks, for data-parallel gradient all-reduce and for
  initialising a new trainer replica from the leader's model and optimizer state;
- the **sync group**: the trainer leader (global rank 0, where the trainer pool starts)
  plus the rollout rank driving each rollout replica's engine, for the weights of each
  sync point: sent by the leader to each receiver point to point, so a receiver that dies
  or hangs during a sync is dropped after ``peer_timeout_s`` (reported, see
  :meth:`Collective.take_lost_peers`) and the others still get the weights.

A trainer group whose ranks do not change (a rollout rank lost) is kept as it is: the
trainer's model is built over its mesh.

What travels over the sync group, and in what format, is the weight path's
(runtime/weights/: ``p2p.py`` sends through :meth:`Collective.send_to_receivers` and
:meth:`Collective.receive_from_leader`); this module forms the groups and moves tensors.

Rendezvous: rank 0 hosts a ``TCPStore``. Under submitit (Slurm or local) its address comes
from submitit's ``TorchDistributedEnvironment`` (the job's first node, a port derived from
the job id, ``MASTER_PORT`` to override), which every rank computes alike. Outside submitit
rank 0 takes a free port and publishes ``host:port`` in ``<run>/dist.json``; the other
ranks wait for that file (rank 0 publishes it under submitit too, for a rank started again
outside the job: ``reflow rejoin``, which joins the world group anew and the groups of the
next epoch; tested on gloo).

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
from collections.abc import Iterable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from runtime.config.layout import ranks_with, rollout_drivers
from runtime.store.run_dir import read_json, write_json_atomic

log = logging.getLogger(__name__)

LEADER = 0  # global rank of the trainer leader: the trainer pool starts at rank 0


class CollectiveError(RuntimeError):
    """The process group could not be formed or a transfer was malformed."""


def bucket_indices(items: Sequence[tuple[torch.dtype, int]], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``(dtype, nbytes)`` items grouped into consecutive buckets of one dtype and
    at most ``bucket_bytes`` (an item larger than a bucket gets one of its own)."""
    out: list[list[int]] = []
    size = 0
    for i, (dtype, nbytes) in enumerate(items):
        if out and items[out[-1][0]][0] == dtype and size + nbytes <= bucket_bytes:
            out[-1].append(i)
            size += nbytes
        else:
            out.append([i])
            size = nbytes
    return out


def tensor_buckets(tensors: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """:func:`bucket_indices` of tensors (gradients, broadcast state)."""
    return bucket_indices([(t.dtype, t.numel() * t.element_size()) for t in tensors], bucket_bytes)


def epoch_group(ranks: Sequence[int], name: str, timeout: timedelta) -> Any:
    """The process group of ``ranks``, made by its members only (None elsewhere).

    ``new_group`` over the world group waits for every rank of the world, a dead one
    included; with ``use_local_synchronization`` only the members take part, but torch
    then names the group by a hash of its ranks, so the same ranks in a later epoch would
    find the earlier group's rendezvous keys in the store. The group gets ``name`` (the
    epoch's) instead: its keys live under that prefix. torch offers no argument for it,
    so its naming function is replaced for the call (torch is pinned; the tests make
    groups of the same ranks in successive epochs)."""
    import torch.distributed.distributed_c10d as c10d

    if dist.get_rank() not in ranks:
        return None
    hashed = c10d._process_group_name
    c10d._process_group_name = lambda ranks, use_hashed_name: c10d.GroupName(name)
    try:
        return dist.new_group(list(ranks), timeout=timeout, use_local_synchronization=True)
    finally:
        c10d._process_group_name = hashed


def _destroy(groups: Iterable[Any]) -> None:
    for group in groups:
        if group is not None and group != dist.GroupMember.NON_GROUP_MEMBER:
            dist.destroy_process_group(group)


class Collective:
    """A rank's membership of the run's process group and of the current layout's
    subgroups. Methods are collective: every member of the group named must call them."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        bucket_bytes: int,
        timeout_s: float,
        trainer_group_size: int = 1,
        rollout_group_size: int = 1,
        peer_timeout_s: float | None = None,
    ) -> None:
        self.rank = rank
        self.trainer_group_size = trainer_group_size
        self.rollout_group_size = rollout_group_size
        self.world_size = world_size
        self.bucket_bytes = bucket_bytes
        self.timeout = timedelta(seconds=timeout_s)
        # how long the leader waits for one receiver to take a header or a bucket
        self.peer_timeout = timedelta(seconds=peer_timeout_s or timeout_s)
        self.epoch = -1
        self.sync_ranks: list[int] = []
        self.lost_peers: dict[int, str] = {}  # receivers dropped this epoch, and why
        self._reported: set[int] = set()
        # sends given up on (a hung receiver): kept, with their buffers, until the group
        # they belong to is destroyed
        self._abandoned: list[Any] = []
        self.roles: tuple[str, ...] = ()
        self.trainer_group: Any = None
        # the sync group as one 2-rank group per receiver (leader, receiver): gloo runs a
        # group's sends on shared threads, so one receiver that stops taking data (hung)
        # would stall the sends to all the others; apart, it stalls only its own
        self.sync_pairs: dict[int, Any] = {}
        # FSDP2's mesh dimensions: this rank's replica group (shard) and the ranks holding
        # the same shard in the other replica groups (replicate); None off the trainer
        self.shard_group: Any = None
        self.replicate_group: Any = None
        self._mesh_groups: list[Any] = []

    # --- set-up ------------------------------------------------------------------------

    @classmethod
    def join(
        cls,
        *,
        rank: int,
        world_size: int,
        rendezvous: Path,
        bind_host: str,
        advertise_host: str,
        backend: str,
        bucket_bytes: int,
        timeout_s: float,
        endpoint: tuple[str, int] | None = None,
        trainer_group_size: int = 1,
        rollout_group_size: int = 1,
        peer_timeout_s: float | None = None,
    ) -> Collective:
        timeout = timedelta(seconds=timeout_s)
        if endpoint is not None:  # known to every rank (TorchDistributedEnvironment)
            host, port = endpoint
            if rank == 0:
                store = _master_store(
                    store_listen_address(bind_host, host), port, world_size, timeout
                )
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
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timeout
        )
        log.info("joined the %s process group as rank %d of %d", backend, rank, world_size)
        return cls(
            rank,
            world_size,
            bucket_bytes=bucket_bytes,
            timeout_s=timeout_s,
            trainer_group_size=trainer_group_size,
            rollout_group_size=rollout_group_size,
            peer_timeout_s=peer_timeout_s,
        )

    def regroup(self, epoch: int, roles: Sequence[str]) -> None:
        """Build this epoch's trainer and sync groups. Every live rank calls it, in epoch
        order; a ``"gone"`` rank is in no group."""
        if epoch <= self.epoch:
            return
        trainers = ranks_with(roles, "trainer")
        if LEADER not in trainers:
            raise CollectiveError(f"layout {list(roles)}: rank {LEADER} must be a trainer")
        size = self.trainer_group_size
        if len(trainers) % size:
            raise CollectiveError(
                f"layout {list(roles)}: {len(trainers)} trainer ranks are not whole replica "
                f"groups of {size}"
            )
        # a tensor-parallel rollout replica receives through its driver's engine
        sync = [LEADER, *rollout_drivers(roles, self.rollout_group_size)]
        keep_trainer = self.trainer_group is not None and trainers == self.trainer_ranks
        old_pairs = list(self.sync_pairs.values())
        _destroy(old_pairs if keep_trainer else [*old_pairs, *self._all_trainer()])
        self._abandoned = []
        tag = f"reflow-e{epoch}"
        self.sync_pairs = {}
        self.sync_ranks, self.lost_peers, self._reported = sync, {}, set()
        for peer in sync[1:]:  # the leader makes every pair, each receiver its own
            if self.rank == peer:
                self.sync_pairs[peer] = epoch_group(
                    [LEADER, peer], f"{tag}-sync{peer}", self.timeout
                )
            elif self.rank == LEADER:
                # a receiver that died before rank 0 knew (it is still in this epoch's
                # roles) never comes: dropped after the peer timeout, not the group's
                try:
                    self.sync_pairs[peer] = epoch_group(
                        [LEADER, peer], f"{tag}-sync{peer}", self.peer_timeout
                    )
                except RuntimeError as exc:
                    self._lose(peer, f"pair group: {exc}")
        if not keep_trainer:
            self._trainer_groups(trainers, size, tag)
        self.epoch, self.roles = epoch, tuple(roles)

    def _all_trainer(self) -> list[Any]:
        return [self.trainer_group, *self._mesh_groups]

    def _trainer_groups(self, trainers: list[int], size: int, tag: str) -> None:
        self.trainer_group = epoch_group(trainers, f"{tag}-trainer", self.timeout)
        grid = trainer_grid(trainers, size)
        self._mesh_groups = []
        self.shard_group = self.replicate_group = None
        for i, row in enumerate(grid):  # replica groups: FSDP2 shards within each
            g = epoch_group(row, f"{tag}-shard{i}", self.timeout)
            self._mesh_groups.append(g)
            if self.rank in row:
                self.shard_group = g
        for i, col in enumerate(zip(*grid, strict=True)):  # one shard across the replicas
            g = epoch_group(list(col), f"{tag}-replicate{i}", self.timeout)
            self._mesh_groups.append(g)
            if self.rank in col:
                self.replicate_group = g

    def trainer_mesh(self, device_type: str) -> Any:
        """This epoch's 2-D device mesh of the trainer ranks, ``("replicate", "shard")``:
        a row per replica group. Built from the groups every rank made in
        :meth:`regroup`, so no rank outside the trainer takes part."""
        from torch.distributed.device_mesh import DeviceMesh

        if self.shard_group is None or self.replicate_group is None:
            raise CollectiveError(f"rank {self.rank} is not a trainer rank in this layout")
        grid = trainer_grid(self.trainer_ranks, self.trainer_group_size)
        return DeviceMesh.from_group(
            [self.replicate_group, self.shard_group],
            device_type,
            mesh=torch.tensor(grid, dtype=torch.int),
            mesh_dim_names=("replicate", "shard"),
        )

    @property
    def trainer_ranks(self) -> list[int]:
        return ranks_with(self.roles, "trainer")

    @property
    def is_leader(self) -> bool:
        return self.rank == LEADER

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    # --- the leader's receivers --------------------------------------------------------

    def receivers(self) -> list[int]:
        """The sync group's receivers still reachable this epoch."""
        return [r for r in self.sync_ranks if r != LEADER and r not in self.lost_peers]

    def take_lost_peers(self) -> dict[int, str]:
        """Receivers dropped since the last call, and why (the leader reports them)."""
        new = {r: why for r, why in self.lost_peers.items() if r not in self._reported}
        self._reported |= set(new)
        return new

    def send_to_receivers(self, tensor: torch.Tensor, what: str) -> None:
        """Leader: ``tensor`` to every reachable receiver at once. One that fails, or does
        not take it within ``peer_timeout``, is dropped for the rest of the epoch; the
        others go on (a dead or hung receiver never holds up the sync)."""
        works = []
        for peer in self.receivers():
            try:
                works.append((peer, dist.isend(tensor, dst=peer, group=self.sync_pairs[peer])))
            except RuntimeError as exc:
                self._lose(peer, f"{what}: {exc}")
        for peer, work in works:
            try:
                work.wait(self.peer_timeout)
            except RuntimeError as exc:
                self._abandoned.append((work, tensor))
                self._lose(peer, f"{what}: {exc}")

    def _lose(self, peer: int, why: str) -> None:
        log.warning("weight sync: receiver rank %d dropped (%s)", peer, why[:300])
        self.lost_peers[peer] = why[:1000]

    def receive_from_leader(self, tensor: torch.Tensor) -> None:
        """Receiver: ``tensor`` from the leader, within the group's timeout."""
        try:
            group = self.sync_pairs[self.rank]
            dist.irecv(tensor, src=LEADER, group=group).wait(self.timeout)
        except RuntimeError as exc:
            raise CollectiveError(f"weights from rank {LEADER}: {exc}") from None

    # --- data parallelism --------------------------------------------------------------

    def all_reduce_grads(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum gradients over the trainer group, bucket by bucket (DDP without overlap).

        Each replica's loss is already normalised by the whole batch, so the sum is the
        gradient of the whole batch's loss and every replica ends up with the same one.
        """
        if len(self.trainer_ranks) <= 1:
            return
        grads = [p.grad for p in params if p.grad is not None]
        for idx in tensor_buckets(grads, self.bucket_bytes):
            flat = torch.cat([grads[i].reshape(-1) for i in idx])
            dist.all_reduce(flat, group=self.trainer_group)
            self._unflatten(flat, [grads[i] for i in idx])

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Sum a few floats over the trainer group (per-shard loss statistics)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if len(self.trainer_ranks) > 1:
            dist.all_reduce(t, group=self.trainer_group)
        return t.tolist()

    def all_reduce_max(self, values: Sequence[float]) -> list[float]:
        """The maximum of a few floats over the trainer group (min is max of negatives)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        if len(self.trainer_ranks) > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.trainer_group)
        return t.tolist()

    def replica_spread(self, checksum: float) -> float:
        """max - min of a per-replica checksum over the trainer group (0 = in agreement)."""
        if len(self.trainer_ranks) <= 1:
            return 0.0
        hi = torch.tensor([checksum], dtype=torch.float64)
        lo = -hi.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.trainer_group)
        dist.all_reduce(lo, op=dist.ReduceOp.MAX, group=self.trainer_group)
        return float(hi + lo)

    # --- broadcasts --------------------------------------------------------------------

    def broadcast_tensors(self, tensors: Sequence[torch.Tensor], *, group: Any) -> None:
        """Broadcast ``tensors`` from the leader in place (receivers pass tensors of the same
        shapes and dtypes, in the same order)."""
        for idx in tensor_buckets(tensors, self.bucket_bytes):
            if self.is_leader:
                flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
            else:
                flat = torch.empty(
                    sum(tensors[i].numel() for i in idx), dtype=tensors[idx[0]].dtype
                )
            dist.broadcast(flat, src=LEADER, group=group)
            if not self.is_leader:
                self._unflatten(flat, [tensors[i] for i in idx])

    @staticmethod
    def _unflatten(flat: torch.Tensor, targets: Sequence[torch.Tensor]) -> None:
        offset = 0
        with torch.no_grad():  # targets may be parameters
            for t in targets:
                n = t.numel()
                t.copy_(flat[offset : offset + n].view_as(t))
                offset += n


_WILDCARDS = ("", "0.0.0.0", "::", "*")


def trainer_grid(trainers: Sequence[int], group_size: int) -> list[list[int]]:
    """The trainer ranks as rows of replica groups (consecutive ranks, as layouts place
    whole groups)."""
    ranks = list(trainers)
    return [ranks[i : i + group_size] for i in range(0, len(ranks), group_size)]


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
