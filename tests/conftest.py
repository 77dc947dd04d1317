"""Fixtures shared by every test directory."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import pytest

# Hermetic: the suite starts from pycoll's defaults, whatever the shell or the machine holds, and the
# ranks the tests start inherit this environment. Dropped: the shell's pycoll settings (PYCOLL_TRANSPORT,
# slot sizes, a timeout...), but logging and the build's own switches. Ignored: a calibration of this
# machine (~/.cache/pycoll/tuning.json), which would steer algorithm="auto"; tests of calibration files
# name their own with PYCOLL_TUNING_FILE.
_KEPT = ("PYCOLL_DEBUG", "PYCOLL_CUDA", "PYCOLL_CUDA_ARCHS", "PYCOLL_BUILD_TYPE")
for _name in [n for n in os.environ if n.startswith("PYCOLL_") and n not in _KEPT]:
    del os.environ[_name]
os.environ["PYCOLL_TUNING_FILE"] = "none"


@contextlib.contextmanager
def one_rank_communicator() -> Iterator[object]:
    """A one-rank communicator over an in-process store (no processes, no launcher)."""
    import pycoll
    from pycoll.bootstrap import TCPStoreServer
    from pycoll.bootstrap.store import TCPStoreClient

    server = TCPStoreServer("127.0.0.1", 0)
    client = TCPStoreClient("127.0.0.1", server.port, timeout=60)
    comm = pycoll.init(store=client, rank=0, world_size=1, timeout=60, set_default=False)
    try:
        yield comm
    finally:
        pycoll.finalize(comm)
        client.close()
        server.close()


@pytest.fixture
def one_rank_comm():
    with one_rank_communicator() as comm:
        yield comm


@pytest.fixture(scope="module")
def one_rank_comm_for_module():
    """One communicator for a whole test module (where forming it is costly, as NCCL's init is)."""
    with one_rank_communicator() as comm:
        yield comm
