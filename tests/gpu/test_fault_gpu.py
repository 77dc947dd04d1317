"""Shrink on GPU memory, world size 1 (one GPU: NCCL refuses two ranks on one device): the communicator
made by a shrink gets a new NCCL communicator at its first GPU collective (through the new control
plane's store), and the old one's is aborted when it is revoked. Skipped with the reason where there is
no GPU (conftest.py)."""

from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.gpu


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("algorithm", ["nccl", "ring"])
def test_shrunk_communicator_runs_gpu_collectives(algorithm):
    import torch

    import pycoll

    comm = pycoll.init(
        rank=0, world_size=1, master_addr="127.0.0.1", master_port=_free_port(), set_default=False
    )
    try:
        x = (torch.arange(1 << 20, device="cuda") % 251).float()
        want = x.clone()
        pycoll.allreduce(x, algorithm=algorithm, comm=comm)
        torch.cuda.synchronize()
        assert torch.equal(x, want)
        comm.revoke()
        with pytest.raises(pycoll.CommunicatorRevokedError):
            pycoll.allreduce(x, algorithm=algorithm, comm=comm)
        new = comm.shrink(timeout=60)
        assert (new.epoch, new.world_size, new.parent_ranks) == (1, 1, (0,))
        pycoll.allreduce(x, algorithm=algorithm, comm=new)
        torch.cuda.synchronize()
        assert torch.equal(x, want)
        new.finalize()
    finally:
        comm.finalize()
