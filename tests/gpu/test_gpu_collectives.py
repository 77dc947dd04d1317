"""pycoll's collectives on GPU memory at world size 1 (one GPU; NCCL refuses two ranks on one device).

Every algorithm (NCCL's own, and pycoll's plans run as grouped programs over NCCL with pycoll's kernels)
and every built-in codec, on torch CUDA tensors, against closed forms (one rank: the reduction of one
input is the input; avg divides by 1) and against the CPU path bitwise. The multi-rank data path of the
grouped programs is checked on CPUs (tests/distributed/test_grouped_programs.py); the kernels against
the CPU loops bitwise (test_kernels.py). Skipped with the reason where there is no GPU (conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import pycoll
from pycoll.compression import BF16, FP16, Int4, Int8

pytestmark = pytest.mark.gpu

ALGORITHMS = ("nccl", "ring", "tree", "direct")
SIZES = (0, 1, 7, 1000, 1 << 20 | 3)


@pytest.fixture
def comm(one_rank_comm_for_module):
    return one_rank_comm_for_module


def _tensor(n, dtype, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed + n)
    if dtype.is_floating_point:
        x = torch.randn(n, generator=g)
    else:
        x = torch.randint(-100, 100, (n,), generator=g)
    return x.to(dtype).cuda()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "int8"]
)
def test_allreduce_of_one_rank_is_its_input(comm, algorithm, dtype):
    import torch

    dt = getattr(torch, dtype)
    for n in SIZES:
        for op in ("sum", "max", "min", "prod") + (("avg",) if dt.is_floating_point else ()):
            x = _tensor(n, dt)
            want = x.clone()
            out = pycoll.allreduce(x, op, algorithm=algorithm, comm=comm)
            assert out is x
            torch.cuda.synchronize()
            assert torch.equal(x, want), f"{algorithm} {dtype} {op} n={n}"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_other_collectives_of_one_rank(comm, algorithm):
    import torch

    x = _tensor(4099, torch.float32)
    if algorithm in ("nccl", "ring", "direct"):
        out = torch.full_like(x, float("nan"))
        pycoll.reduce_scatter(x, out, algorithm=algorithm, comm=comm)
        pycoll.all_gather(x, out, algorithm=algorithm, comm=comm)
        torch.cuda.synchronize()
        assert torch.equal(out, x)
    if algorithm in ("nccl", "ring", "tree"):
        y = x.clone()
        pycoll.broadcast(y, 0, algorithm=algorithm, comm=comm)
        torch.cuda.synchronize()
        assert torch.equal(y, x)


CODECS = [FP16(), BF16(), Int8(), Int4(), Int8(block=32, rounding="stochastic", seed=5), Int4(block=16)]


@pytest.mark.parametrize("codec", CODECS, ids=repr)
@pytest.mark.parametrize("algorithm", ("direct", "ring", "tree"))
def test_compressed_allreduce_matches_the_cpu_path_bitwise(comm, codec, algorithm):
    import torch

    for n in (0, 1, 33, 5000, 1 << 20 | 5):
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            x = _tensor(n, dtype, seed=3)
            host = x.cpu()
            res_gpu = torch.full((n,), 1e-3, device="cuda")
            res_cpu = res_gpu.cpu()
            pycoll.allreduce(x, "avg", algorithm=algorithm, compression=codec, residual=res_gpu, comm=comm)
            pycoll.allreduce(host, "avg", algorithm=algorithm, compression=codec, residual=res_cpu, comm=comm)
            torch.cuda.synchronize()
            assert torch.equal(x.cpu(), host), f"{codec!r} {algorithm} {dtype} n={n}"
            assert torch.equal(res_gpu.cpu(), res_cpu), f"residual of {codec!r} {algorithm} {dtype} n={n}"


def test_async_work_waits_on_the_gpu_and_gives_a_stream_aware_future(comm):
    import torch

    x = _tensor(1 << 22, torch.float32)
    want = x.clone()
    work = pycoll.allreduce(x, algorithm="ring", comm=comm, async_op=True)
    assert work.wait() is True and work.is_completed() and work.exception() is None
    assert work.result() is x
    fut = work.get_future()
    assert torch.equal(fut.wait(), want)


def test_a_future_taken_later_under_another_stream_is_ordered_after_the_collective(comm):
    import torch

    x = _tensor(1024, torch.float32)
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        torch.cuda._sleep(1 << 30)  # about half a second of GPU time before the collective runs
        work = pycoll.allreduce(x, algorithm="ring", comm=comm, async_op=True)
    main = torch.cuda.current_stream()
    work.get_future().wait()  # makes the current stream wait for the future's events
    assert not main.query(), "the future's event was recorded on a stream not ordered after the collective"
    torch.cuda.synchronize()
    assert work.is_completed()


def test_tensor_on_another_device_is_refused(comm):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to put a tensor on a device other than the communicator's")
    x = torch.ones(4, device="cuda:1")
    with pytest.raises(pycoll.InvalidUsageError, match="is on cuda:1 but the communicator is on cuda:0"):
        pycoll.allreduce(x, comm=comm)


def test_user_codecs_are_refused_on_gpus(comm):
    import torch

    x = torch.ones(64, device="cuda")

    class NotBuiltin(FP16):  # what a user codec (numba cfuncs, pycoll.compression.user) looks like here
        kind = "user"

    with pytest.raises(pycoll.InvalidUsageError, match="user codec"):
        pycoll.allreduce(x, compression=NotBuiltin(), comm=comm)


def test_missing_nccl_raises_nccl_error_on_first_gpu_collective(tmp_path):
    script = textwrap.dedent(
        """
        import torch, pycoll
        from pycoll.bootstrap import TCPStoreServer
        from pycoll.bootstrap.store import TCPStoreClient
        server = TCPStoreServer("127.0.0.1", 0)
        c = pycoll.init(store=TCPStoreClient("127.0.0.1", server.port, timeout=30), rank=0, world_size=1,
                        timeout=30, set_default=False)
        try:
            pycoll.allreduce(torch.ones(8, device="cuda"), comm=c)
        except pycoll.NcclError as e:
            print("NcclError:", e)
        """
    )
    env = dict(os.environ, NCCL_LIBRARY=str(tmp_path / "libnccl-missing.so.2"))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert "NcclError:" in out.stdout and "libnccl-missing" in out.stdout, out.stdout + out.stderr
