"""Host identity: PYCOLL_HOST_ID, where a rank sits among the ranks of its host, and the error when the
ranks span several hosts (which needs the TCP transport), raised on every rank without a hang."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest

from pycoll.bootstrap import TCPStoreServer
from pycoll.bootstrap.store import TCPStoreClient
from pycoll.comm import Communicator, host_id, host_layout
from pycoll.env import Settings
from pycoll.errors import InvalidUsageError

DEADLINE = 20.0


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["a"], [(0, 1, 0, 1)]),
        (["a", "a", "a"], [(0, 3, 0, 1), (1, 3, 0, 1), (2, 3, 0, 1)]),
        (["a", "a", "b", "b"], [(0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]),
        # round-robin placement: nodes are ordered by their lowest rank, so rank 0's host is node 0
        (["b", "a", "b", "a"], [(0, 2, 0, 2), (0, 2, 1, 2), (1, 2, 0, 2), (1, 2, 1, 2)]),
        # uneven
        (["x", "y", "y", "y", "z"], [(0, 1, 0, 3), (0, 3, 1, 3), (1, 3, 1, 3), (2, 3, 1, 3), (0, 1, 2, 3)]),
    ],
)
def test_host_layout(hosts, expected):
    assert [host_layout(hosts, r) for r in range(len(hosts))] == expected


def test_host_id_default_and_override():
    default = host_id(Settings())
    assert default.startswith(socket.gethostname() + "/") and len(default) > len(socket.gethostname()) + 1
    assert host_id(Settings(host_id="rack1-node3")) == "rack1-node3"
    assert host_id(Settings.from_environ({"PYCOLL_HOST_ID": "n7"})) == "n7"


def test_one_rank_communicator_knows_its_host(one_rank_comm):
    comm = one_rank_comm
    assert comm.hosts == [host_id(comm.settings)]
    assert (comm.local_rank, comm.local_world_size, comm.node_rank, comm.num_nodes) == (0, 1, 0, 1)


def test_ranks_on_two_hosts_with_shared_memory_only_fail_alike_on_every_rank():
    """4 ranks (threads), PYCOLL_HOST_ID differing on 2 of them, PYCOLL_TRANSPORT=shm. Rank 0 hosts the
    store and closes it as soon as its Communicator raises, as pycoll.init does: the others must still get
    the same error (not a lost store), and nothing may wait past the deadline."""
    world = 4
    server = TCPStoreServer("127.0.0.1", 0)
    results: list[Any] = [None] * world

    def rank_main(rank: int) -> None:
        client = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
        owned: tuple[Any, ...] = (client, server) if rank == 0 else (client,)
        settings = Settings(host_id="hostA" if rank < 2 else "hostB", transport="shm")
        if rank == 3:
            time.sleep(0.2)  # the last rank comes late: rank 0 must not close the store under it
        try:
            Communicator(client, rank, world, timeout=DEADLINE, settings=settings, owned=owned)
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            results[rank] = exc
        finally:
            for obj in owned:
                obj.close()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, start + DEADLINE - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "a rank was still in set-up past the deadline"
    server.close()
    for rank, exc in enumerate(results):
        assert isinstance(exc, InvalidUsageError), f"rank {rank}: {exc!r}"
        text = str(exc)
        assert text.startswith(f"rank {rank}: the 4 ranks run on 2 hosts")
        assert "host 'hostA': ranks 0, 1; host 'hostB': ranks 2, 3" in text
        assert "PYCOLL_TRANSPORT=shm" in text and "PYCOLL_HOST_ID" in text
    assert time.monotonic() - start < 10.0


def test_ranks_on_two_hosts_connect_over_shared_memory_and_tcp():
    """The same layout with the default transport: shared memory within each host, TCP between them."""
    import numpy as np

    import pycoll

    world = 4
    server = TCPStoreServer("127.0.0.1", 0)
    results: list[Any] = [None] * world

    def rank_main(rank: int) -> None:
        client = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
        try:
            comm = Communicator(
                client,
                rank,
                world,
                timeout=DEADLINE,
                settings=Settings(host_id="hostA" if rank < 2 else "hostB"),
            )
            x = np.full(100_003, rank + 1, dtype=np.int64)
            pycoll.allreduce(x, comm=comm)
            results[rank] = (comm.transport, comm.node_rank, comm.local_rank, bool((x == 10).all()))
            comm.finalize()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            results[rank] = exc
        finally:
            client.close()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    server.close()
    assert results == [
        ("mixed", 0, 0, True),
        ("mixed", 0, 1, True),
        ("mixed", 1, 0, True),
        ("mixed", 1, 1, True),
    ]


def test_host_id_setting_rejects_bad_values():
    with pytest.raises(InvalidUsageError, match="PYCOLL_HOST_ID"):
        Settings.from_environ({"PYCOLL_HOST_ID": "bad\nid"})
