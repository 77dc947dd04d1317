"""Rendezvous: every rank of a job gets a connection to one key-value store.

Three ways to find the store, chosen from the ``LaunchInfo``:

launcher-hosted (``store_hosted_externally=True``, e.g. under ``pycoll run``)
    The store already listens at master_addr:master_port; every rank, rank 0 included, connects. Under
    ``pycoll run --nnodes M`` node 0's launcher hosts it and the ranks of the other nodes connect to it
    across the network, retrying until the deadline (a timeout names the address and node 0).
torchrun's agent store (``info.torch_agent_store``)
    torchrun already serves a torch TCPStore at master_addr:master_port; every rank connects to it with
    torch (imported only then) and pycoll's keys live under ``pycoll/attempt<restart count>/``.
master port known (torchrun, or MASTER_PORT set by hand)
    Rank 0 listens on master_port (all interfaces, or loopback when master_addr is a loopback
    address); the other ranks connect to master_addr:master_port, retrying until the deadline.
file (mpirun / srun on one host without MASTER_PORT)
    Rank 0 listens on a free port and atomically writes ``host:port`` to
    ``<tempdir>/pycoll-rdzv-<uid>-<job id>``; the others poll for the file until the deadline. Rank 0
    removes the file once every rank has joined, and again (if still its own) at close or exit.

Every way ends with a check that all ranks agree on the world size and a barrier, so ``rendezvous``
returns only when the whole job is there, and a rank that never comes is named in the timeout error.
A rank whose rendezvous fails once it has the store (a mismatched world size, Ctrl-C) says so there, and
the ranks waiting for it raise PeerFailedError naming it at once (``failfast.py``). A rank's n-th
rendezvous on a store keeps its keys under ``pycoll/rdzv/<n>/``, so a later one starts clean.

With a ``secret`` (PYCOLL_SECRET, passed in by ``pycoll.init``) every pycoll store connection, and the
store rank 0 hosts, authenticate with it: a rank with another secret, or none, fails at once with
InvalidUsageError. torchrun's agent store is torch's own and cannot check it (a warning says so).
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta

from pycoll.bootstrap.env import LaunchInfo
from pycoll.bootstrap.failfast import LINGER_S, FailFastStore
from pycoll.bootstrap.store import (
    DEFAULT_TIMEOUT,
    PrefixStore,
    Store,
    TCPStoreClient,
    TCPStoreServer,
    TorchStoreAdapter,
)
from pycoll.errors import CollectiveMismatchError, CollectiveTimeoutError, InvalidUsageError, ranks_text

__all__ = ["RDZV_PREFIX", "rendezvous", "rendezvous_file_path", "store_barrier"]

#: Keys written by ``rendezvous`` live under this prefix.
RDZV_PREFIX = "pycoll/rdzv"


logger = logging.getLogger("pycoll.bootstrap")


def _fmt(seconds: float) -> str:
    return f"{seconds:.2f} s"


def store_barrier(
    store: Store,
    key_prefix: str,
    rank: int,
    world: int,
    timeout: float | None = None,
    *,
    what: str = "barrier",
) -> None:
    """Block until all ``world`` ranks have called ``store_barrier`` with the same ``key_prefix``.

    Reusable: the n-th call on every rank forms generation n (arrivals are counted with ``add``). On
    timeout raises CollectiveTimeoutError naming the ranks that have not arrived (when the store has
    ``check``).
    """
    if not 0 <= rank < world:
        raise InvalidUsageError(f"{what}: rank must be in 0..{world - 1}, got {rank}")
    start = time.monotonic()
    arrival = store.add(f"{key_prefix}/arrivals", 1)
    generation = (arrival - 1) // world
    base = f"{key_prefix}/{generation}"
    store.set(f"{base}/rank/{rank}", b"1")
    if arrival == (generation + 1) * world:
        store.set(f"{base}/done", b"1")
        return  # the last to arrive knows everyone is here
    try:
        store.wait([f"{base}/done"], timeout)
    except CollectiveTimeoutError as exc:
        waited = time.monotonic() - start
        check: Callable[[list[str]], bool] | None = getattr(store, "check", None)
        missing: list[int] | None = None
        if check is not None:
            try:
                missing = [r for r in range(world) if not check([f"{base}/rank/{r}"])]
            except Exception:  # noqa: BLE001 - the timeout is the error to report
                missing = None
        if missing:
            who = f"rank {missing[0]}" if len(missing) == 1 else f"ranks {ranks_text(missing)}"
            verb = "has" if len(missing) == 1 else "have"
            detail = f"{who} of {world} {verb} not arrived"
        else:
            detail = f"not all {world} ranks arrived"
        raise CollectiveTimeoutError(
            f"{what} timed out on rank {rank} after {_fmt(waited)}: {detail} ({exc})"
        ) from None


def rendezvous_file_path(job_id: str, directory: str | None = None) -> str:
    """Where the file rendezvous of ``job_id`` is written (per user, so users never collide)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:80]
    digest = hashlib.sha1(job_id.encode("utf-8")).hexdigest()[:8]
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(directory or tempfile.gettempdir(), f"pycoll-rdzv-{uid}-{safe}-{digest}")


def _is_loopback(addr: str) -> bool:
    return addr == "localhost" or addr.startswith("127.") or addr == "::1"


def _write_atomic(path: str, content: str) -> None:
    directory = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(prefix=".pycoll-rdzv-", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _remove_if_ours(path: str, content: str) -> None:
    try:
        with open(path) as f:
            if f.read() != content:
                return  # a later job with the same id has taken the file over
        os.unlink(path)
    except OSError:
        pass


def _parse_address(text: str) -> tuple[str, int] | None:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]"), int(port)


def _connect_via_file(
    info: LaunchInfo, path: str, deadline: float, timeout: float, secret: bytes | None
) -> TCPStoreClient:
    start = time.monotonic()
    delay = 0.01
    last = "the file does not exist yet"
    while True:
        try:
            with open(path) as f:
                address = _parse_address(f.read())
        except FileNotFoundError:
            address = None
        except OSError as exc:
            address, last = None, f"cannot read it: {exc}"
        if address is not None:
            remaining = deadline - time.monotonic()
            try:
                return TCPStoreClient(
                    address[0],
                    address[1],
                    timeout,
                    connect_timeout=max(0.0, min(remaining, 0.5)),
                    secret=secret,
                )
            except CollectiveTimeoutError:
                # Not listening (yet, or any more: a file left by a killed earlier run). Read it again.
                last = f"it names {address[0]}:{address[1]}, where no pycoll store answers"
        now = time.monotonic()
        if now >= deadline:
            raise CollectiveTimeoutError(
                f"rendezvous timed out on rank {info.rank} after {_fmt(now - start)}: rank 0 of job "
                f"{info.job_id!r} has not published its store in {path} ({last}); is rank 0 running on "
                "this host? Ranks on several hosts need MASTER_ADDR and MASTER_PORT instead"
            )
        time.sleep(min(delay, max(0.0, deadline - now)))
        delay = min(delay * 2, 0.25)


def _connect_torch_agent_store(info: LaunchInfo, timeout: float) -> PrefixStore:
    try:
        from torch.distributed import TCPStore  # optional dependency: only under torchrun's agent store
    except ImportError as exc:
        raise InvalidUsageError(
            "torchrun hosts the rendezvous store (TORCHELASTIC_USE_AGENT_STORE is set) but torch cannot be "
            f"imported to reach it ({exc})"
        ) from exc
    assert info.master_port is not None
    address = f"{info.master_addr}:{info.master_port}"
    try:
        torch_store = TCPStore(
            info.master_addr, info.master_port, info.world_size, False, timeout=timedelta(seconds=timeout)
        )
    except Exception as exc:  # noqa: BLE001 - torch's errors vary by version; report ours
        raise CollectiveTimeoutError(
            f"could not connect to torchrun's store at {address} within {_fmt(timeout)}: {exc}"
        ) from exc
    adapter = TorchStoreAdapter(torch_store, name=f"torch TCPStore at {address}")
    return PrefixStore(adapter, f"pycoll/attempt{info.restart_count}", close_underlying=True)


def rendezvous(
    info: LaunchInfo,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    store_hosted_externally: bool = False,
    wait_for_all: bool = True,
    rdzv_dir: str | None = None,
    secret: bytes | None = None,
) -> tuple[Store, TCPStoreServer | None]:
    """Connect this rank to the job's store; rank 0 hosts it unless ``store_hosted_externally``.

    Returns ``(store, server)``: ``server`` is the TCPStoreServer this process hosts (rank 0) or None.
    The caller closes both when done: the store first, then ``server.close(drain_timeout=...)`` so the
    other ranks' last requests are answered before the server goes. The store's default timeout is
    ``timeout``.
    With ``wait_for_all`` (default) it returns only after every rank has joined; otherwise it returns
    as soon as this rank is connected (and, in file mode, rank 0's file then stays until close).

    ``timeout`` bounds the whole call. ``rdzv_dir`` overrides the directory of the file rendezvous.
    ``secret`` (the job's PYCOLL_SECRET) authenticates every connection to a pycoll store, and the
    store this rank hosts requires it.
    """
    if not timeout >= 0:
        raise InvalidUsageError(f"rendezvous timeout must be >= 0 seconds, got {timeout}")
    deadline = time.monotonic() + timeout
    rank, world = info.rank, info.world_size
    server: TCPStoreServer | None = None
    store: TCPStoreClient | PrefixStore | None = None
    watched: FailFastStore | None = None  # the store, its waits ended by a peer's failure report
    rdzv_file: tuple[str, str] | None = None  # (path, content) while rank 0's file exists

    def remaining() -> float:
        return max(0.0, deadline - time.monotonic())

    try:
        if info.torch_agent_store and not store_hosted_externally:
            if secret is not None:
                logger.warning(
                    "PYCOLL_SECRET is set, but the rendezvous store is torchrun's agent store (a torch "
                    "TCPStore), which cannot check it; its connections are not authenticated"
                )
            store = _connect_torch_agent_store(info, remaining())
        elif store_hosted_externally:
            if info.master_port is None:
                raise InvalidUsageError(
                    "the rendezvous store is said to be hosted by the launcher, but MASTER_PORT is not "
                    "set; set MASTER_ADDR and MASTER_PORT to the launcher's store"
                )
            try:
                store = TCPStoreClient(
                    info.master_addr, info.master_port, timeout, connect_timeout=remaining(), secret=secret
                )
            except CollectiveTimeoutError as exc:
                if info.num_nodes is None or info.num_nodes < 2:
                    raise
                raise CollectiveTimeoutError(
                    f"rendezvous on rank {rank} (node {info.node_rank} of {info.num_nodes}): node 0's "
                    f"launcher did not answer at {info.master_addr}:{info.master_port} ({exc}). Is `pycoll "
                    "run --node-rank 0` running there with the same --master-port, is that address "
                    "reachable from this node, and does no firewall block the port?"
                ) from None
        elif info.master_port is not None:
            if rank == 0:
                v6 = ":" in info.master_addr
                loopback = _is_loopback(info.master_addr)
                bind = ("::1" if v6 else "127.0.0.1") if loopback else ("::" if v6 else "0.0.0.0")
                server = TCPStoreServer(bind, info.master_port, secret=secret)
                host = "::1" if v6 else "127.0.0.1"
                store = TCPStoreClient(host, server.port, timeout, connect_timeout=remaining(), secret=secret)
            else:
                store = TCPStoreClient(
                    info.master_addr, info.master_port, timeout, connect_timeout=remaining(), secret=secret
                )
        elif world == 1:
            server = TCPStoreServer("127.0.0.1", 0, secret=secret)
            store = TCPStoreClient(
                "127.0.0.1", server.port, timeout, connect_timeout=remaining(), secret=secret
            )
        else:
            if info.job_id is None:
                raise InvalidUsageError(
                    f"cannot rendezvous {world} ranks ({info.launcher} launch): MASTER_PORT is not set and "
                    "there is no job id for a file rendezvous. Set MASTER_ADDR and MASTER_PORT (a free "
                    "port on rank 0's host), or launch with `pycoll run`, torchrun, mpirun "
                    "(OMPI_MCA_ess_base_jobid / PMIX_NAMESPACE) or srun (SLURM_JOB_ID)"
                )
            if not info.single_host:
                raise InvalidUsageError(
                    f"the {world} ranks span several hosts ({info.local_world_size} on this one), so they "
                    "cannot meet through a local file; set MASTER_ADDR (rank 0's host) and MASTER_PORT"
                )
            path = rendezvous_file_path(info.job_id, rdzv_dir)
            if rank == 0:
                server = TCPStoreServer("127.0.0.1", 0, secret=secret)
                store = TCPStoreClient(
                    "127.0.0.1", server.port, timeout, connect_timeout=remaining(), secret=secret
                )
                content = f"127.0.0.1:{server.port}\n"
                _write_atomic(path, content)
                rdzv_file = (path, content)

                def cleanup(path: str = path, content: str = content) -> None:
                    _remove_if_ours(path, content)
                    atexit.unregister(cleanup)

                atexit.register(cleanup)
                server.add_close_callback(cleanup)
            else:
                store = _connect_via_file(info, path, deadline, timeout, secret)

        # This rank's n-th rendezvous on this store: its keys, failure reports included, are its own.
        n = store.add(f"{RDZV_PREFIX}/count/{rank}", 1)
        attempt = f"{RDZV_PREFIX}/{n}"
        watched = FailFastStore(store, f"{attempt}/failure", rank=rank, timeout=timeout, what="rendezvous")
        world_key = f"{attempt}/world_size"
        if rank == 0:
            store.set(world_key, str(world).encode())
        else:
            try:
                world0 = int(watched.get(world_key, remaining()))
            except CollectiveTimeoutError as exc:
                raise CollectiveTimeoutError(
                    f"rendezvous timed out on rank {rank}: rank 0 has not joined the store at "
                    f"{getattr(store, 'address', store)} ({exc})"
                ) from None
            if world0 != world:
                raise CollectiveMismatchError(
                    f"rendezvous: rank {rank} was started with world size {world} but rank 0 with "
                    f"{world0}; every rank must be launched with the same world size"
                )
        if wait_for_all:
            store_barrier(watched, f"{attempt}/join", rank, world, remaining(), what="rendezvous")
            if rdzv_file is not None:
                _remove_if_ours(*rdzv_file)
        return store, server
    except BaseException as exc:
        if watched is not None:  # tell the others; a rank hosting the store keeps it up for them to read
            watched.announce(exc, world, linger=LINGER_S if server is not None else 0.0)
        if store is not None:
            store.close()
        if server is not None:
            server.close()
        raise
