"""Several ranks on one GPU: pycoll's plans on GPU memory, the kernels on the device, the messages
through host shared memory (PYCOLL_GPU_TRANSPORT=shm; NCCL refuses two ranks on one GPU).

Every rank runs each collective twice from the same rank-dependent inputs, on CUDA tensors and on CPU
tensors, and the two results must be bitwise identical (the CPU path is checked against closed forms
and float64 bounds in tests/distributed); integer sums are also checked against the closed form here.
Compressed all-reduces compare results and error-feedback residuals bitwise too.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "distributed"))
from harness import RankPool  # noqa: E402

import pycoll  # noqa: E402
from pycoll.compression import BF16, FP16, Int4, Int8  # noqa: E402

pytestmark = pytest.mark.gpu


def _input(rank, n, dtype, seed):
    import torch

    g = torch.Generator().manual_seed(seed * 1000 + rank * 10 + n)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype)
    return torch.randint(-1000, 1000, (n,), generator=g).to(dtype)


def _both(fn, x, *rest):
    """fn on CUDA copies and on CPU copies of the tensors; both results on the CPU."""
    gpu = fn(*(t.cuda() for t in (x, *rest)))
    cpu = fn(*(t.clone() for t in (x, *rest)))
    import torch

    torch.cuda.synchronize()
    return [t.cpu() for t in gpu], list(cpu)


def _plain_body(comm, rank, world):
    import torch

    torch.cuda.set_device(0)
    failures = []
    for n in (0, 1, 7, 1000, (1 << 18) + 3):
        for dtype, op in (
            (torch.int32, "sum"),
            (torch.float32, "sum"),
            (torch.float16, "avg"),
            (torch.bfloat16, "max"),
            (torch.float64, "prod"),
            (torch.int8, "min"),
        ):
            x = _input(rank, n, dtype, 1)
            for algorithm in ("ring", "tree", "direct"):

                def call(t, op=op, a=algorithm):
                    return [pycoll.allreduce(t, op, algorithm=a, comm=comm)]

                (g,), (c,) = _both(call, x)
                if not torch.equal(g, c):
                    failures.append(f"allreduce {algorithm} {dtype} {op} n={n}: GPU and CPU differ")
                if dtype == torch.int32:
                    want = sum(_input(r, n, dtype, 1) for r in range(world))
                    if not torch.equal(g, want.to(dtype)):
                        failures.append(f"allreduce {algorithm} int32 sum n={n}: not the closed form")
        x = _input(rank, n, torch.float32, 2)
        for algorithm in ("ring", "direct"):
            (g,), (c,) = _both(
                lambda t, o, a=algorithm: [pycoll.reduce_scatter(t, o, algorithm=a, comm=comm)],
                torch.cat([x] * world),
                torch.zeros(n),
            )
            if not torch.equal(g, c):
                failures.append(f"reduce_scatter {algorithm} n={n}: GPU and CPU differ")
            (g,), (c,) = _both(
                lambda t, o, a=algorithm: [pycoll.all_gather(t, o, algorithm=a, comm=comm)],
                x,
                torch.zeros(world * n),
            )
            if not torch.equal(g, c):
                failures.append(f"all_gather {algorithm} n={n}: GPU and CPU differ")
        for algorithm in ("ring", "tree"):
            (g,), _ = _both(
                lambda t, a=algorithm: [pycoll.broadcast(t, world - 1, algorithm=a, comm=comm)], x
            )
            if not torch.equal(g, _input(world - 1, n, torch.float32, 2)):
                failures.append(f"broadcast {algorithm} n={n}: not root's data")
    return failures


CODECS = [FP16(), BF16(), Int8(), Int4(), Int4(block=16)]


def _compressed_body(comm, rank, world):
    import torch

    torch.cuda.set_device(0)
    failures, digest = [], hashlib.sha256()
    for n in (0, 1, 33, 5000, (1 << 18) + 5):
        for codec in CODECS:
            for algorithm in ("direct", "ring", "tree"):
                for dtype in (torch.float32, torch.bfloat16):
                    x = _input(rank, n, dtype, 3)
                    res = torch.full((n,), 1e-3)

                    def call(t, r, a=algorithm, c=codec):
                        return [
                            pycoll.allreduce(t, "avg", algorithm=a, compression=c, residual=r, comm=comm),
                            r,
                        ]

                    g, c = _both(call, x, res)
                    if not (torch.equal(g[0], c[0]) and torch.equal(g[1], c[1])):
                        failures.append(f"{codec!r} {algorithm} {dtype} n={n}: GPU and CPU differ")
                    digest.update(
                        g[0].numpy().tobytes() if dtype == torch.float32 else g[0].float().numpy().tobytes()
                    )
    return failures, digest.hexdigest()


@pytest.mark.parametrize("world", [2, 4])
def test_plain_collectives_on_one_gpu_match_the_cpu_path(world):
    with RankPool(world, env={"PYCOLL_GPU_TRANSPORT": "shm"}, comm_timeout=120) as pool:
        assert pool.run(_plain_body, timeout=600) == [[]] * world


@pytest.mark.parametrize("world", [2, 3])
def test_compressed_allreduce_on_one_gpu_matches_the_cpu_path_bitwise(world):
    with RankPool(world, env={"PYCOLL_GPU_TRANSPORT": "shm"}, comm_timeout=120) as pool:
        results = pool.run(_compressed_body, timeout=600)
    assert [f for f, _ in results] == [[]] * world
    assert len({d for _, d in results}) == 1, "ranks ended with different bits"
