"""The torch.distributed "pycoll" backend on CUDA tensors, world size 1 (one GPU: NCCL refuses two ranks
on one device). Each op on a CUDA tensor against its closed form at one rank, and against the same op on
a CPU copy bitwise: the backend hands CUDA tensors to pycoll's GPU path on torch's current stream.
Skipped with the reason where there is no GPU (conftest.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def group():
    import torch.distributed as dist

    import pycoll.torch as pt

    group = pt.ProcessGroupPycoll(dist.HashStore(), 0, 1, timedelta(seconds=60))
    yield group
    group.shutdown()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32"])
def test_all_reduce_broadcast_gather_on_cuda(group, dtype):
    import torch

    dt = getattr(torch, dtype)
    x = (torch.arange(1 << 16) % 97).to(dt).cuda()
    before = x.clone()
    group.allreduce([x]).wait()
    group.broadcast([x]).wait()
    out = torch.empty_like(x)
    group.all_gather_single(out, x).wait()
    torch.cuda.synchronize()
    assert torch.equal(x, before) and torch.equal(out, before)  # one rank: every op is the identity


def test_int8_group_on_cuda_within_bound():
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt

    group = pt.ProcessGroupPycoll(dist.HashStore(), 0, 1, timedelta(seconds=60), pt.Options("int8"))
    try:
        x = torch.randn(1 << 16, device="cuda")
        y = x.clone()
        group.allreduce([y]).wait()
        torch.cuda.synchronize()
        block = 2.0 * x.abs().max() / 127  # int8: at most half a step of the block's scale, twice (direct)
        assert float((y - x).abs().max()) <= float(block)
        assert len(group._residuals) == 1
    finally:
        group.shutdown()
