"""pycoll's NCCL binding on a real GPU (pycoll._C.nccl, pycoll/nccl.py), at world size 1 in this process.

With one rank every reduction (sum, prod, min, max, avg) returns its input, reduce-scatter / all-gather /
broadcast copy it, and a send to oneself inside a group arrives; each is checked for every dtype, in
place and out of place, on awkward sizes. One test forms a communicator of two ranks with only one rank
present, to see the non-blocking init give up at its deadline instead of hanging.

Skips (with the reason) without torch built with CUDA, a GPU, a CUDA build of pycoll, or an NCCL.
The device is the launcher's local rank (LOCAL_RANK, default 0), as pycoll.nccl documents.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests use torch CUDA tensors; torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU (or torch was built without CUDA)", allow_module_level=True)

from pycoll import _C, libraries  # noqa: E402
from pycoll.arrays import DTYPE_CODES, OP_CODES  # noqa: E402
from pycoll.bootstrap import TCPStoreClient, TCPStoreServer  # noqa: E402
from pycoll.errors import CommunicatorBrokenError  # noqa: E402
from pycoll.nccl import create_nccl_comm, load_nccl, nccl_version  # noqa: E402

if not _C.nccl.built():
    pytest.skip("pycoll was built without CUDA: no NCCL binding", allow_module_level=True)
if not libraries.find_nccl(load=False).usable:
    pytest.skip(
        "no NCCL installed (pip install nvidia-nccl-cu13, or set NCCL_LIBRARY)", allow_module_level=True
    )

TORCH_DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "int8": torch.int8,
}
REPO = Path(__file__).resolve().parents[2]
# Empty, one element, odd, just past a power of two, and large enough for several NCCL chunks.
SIZES = [0, 1, 7, 1025, 1_000_003]


@pytest.fixture(scope="module")
def store() -> Iterator[TCPStoreClient]:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    server = TCPStoreServer("127.0.0.1", 0)
    client = TCPStoreClient("127.0.0.1", server.port, timeout=60)
    yield client
    client.close()
    server.close()


@pytest.fixture(scope="module")
def comm(store: TCPStoreClient) -> Iterator[Any]:
    load_nccl()
    c = create_nccl_comm(store, 0, 1, timeout=120)
    yield c
    if not c.aborted:
        c.destroy()


def stream() -> int:
    return int(torch.cuda.current_stream().cuda_stream)


def make_input(dtype_name: str, n: int) -> Any:
    """Rank-free values every dtype holds exactly, at least one element (NCCL gets count n, possibly 0)."""
    dtype = TORCH_DTYPES[dtype_name]
    g = torch.Generator(device="cpu").manual_seed(n * 31 + len(dtype_name))
    if dtype.is_floating_point:
        x = torch.randint(-64, 64, (max(n, 1),), generator=g).to(dtype) / 4
    elif dtype == torch.uint8:
        x = torch.randint(0, 256, (max(n, 1),), generator=g).to(dtype)
    else:
        x = torch.randint(-100, 100, (max(n, 1),), generator=g).to(dtype)
    return x.cuda()


def test_version_string_matches_the_library(comm: Any) -> None:
    v = nccl_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    assert v == libraries.nccl_version(_C.nccl.loaded_path())
    assert comm.world == 1 and comm.rank == 0
    assert comm.device == torch.cuda.current_device()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
def test_all_reduce_one_rank_returns_input(comm: Any, dtype_name: str, n: int) -> None:
    x = make_input(dtype_name, n)
    for op, code in OP_CODES.items():
        out = torch.full_like(x, 3)
        comm.all_reduce(x.data_ptr(), out.data_ptr(), n, DTYPE_CODES[dtype_name], code, stream())
        inplace = x.clone()
        comm.all_reduce(inplace.data_ptr(), inplace.data_ptr(), n, DTYPE_CODES[dtype_name], code, stream())
        torch.cuda.current_stream().synchronize()
        assert torch.equal(out[:n], x[:n]), f"{op} out of place"
        assert torch.equal(inplace, x), f"{op} in place"
        if n == 0:
            assert torch.equal(out, torch.full_like(x, 3)), f"{op} wrote with count 0"
    comm.check_async()


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype_name", list(TORCH_DTYPES))
def test_reduce_scatter_all_gather_broadcast_one_rank(comm: Any, dtype_name: str, n: int) -> None:
    x = make_input(dtype_name, n)
    code = DTYPE_CODES[dtype_name]
    rs = torch.zeros_like(x)
    comm.reduce_scatter(x.data_ptr(), rs.data_ptr(), n, code, OP_CODES["sum"], stream())
    ag = torch.zeros_like(x)
    comm.all_gather(x.data_ptr(), ag.data_ptr(), n, code, stream())
    bc = torch.zeros_like(x)
    comm.broadcast(x.data_ptr(), bc.data_ptr(), n, code, 0, stream())
    torch.cuda.current_stream().synchronize()
    assert torch.equal(rs[:n], x[:n])
    assert torch.equal(ag[:n], x[:n])
    assert torch.equal(bc[:n], x[:n])
    comm.check_async()


@pytest.mark.parametrize("n", [1, 4097, 1_000_003])
def test_send_recv_to_self_in_a_group(comm: Any, n: int) -> None:
    x = make_input("float32", n)
    y = torch.zeros_like(x)
    _C.nccl.group_start()
    comm.send(x.data_ptr(), x.numel() * x.element_size(), 0, stream())
    comm.recv(y.data_ptr(), y.numel() * y.element_size(), 0, stream())
    _C.nccl.group_end()
    torch.cuda.current_stream().synchronize()
    assert torch.equal(y, x)
    comm.check_async()


def test_abort_then_calls_raise(store: TCPStoreClient) -> None:
    c = create_nccl_comm(store, 0, 1, timeout=120)
    x = make_input("float32", 16)
    c.all_reduce(x.data_ptr(), x.data_ptr(), 16, DTYPE_CODES["float32"], OP_CODES["sum"], stream())
    torch.cuda.current_stream().synchronize()
    c.abort()
    assert c.aborted
    with pytest.raises(CommunicatorBrokenError, match="aborted"):
        c.all_reduce(x.data_ptr(), x.data_ptr(), 16, DTYPE_CODES["float32"], OP_CODES["sum"], stream())
    with pytest.raises(CommunicatorBrokenError):
        c.check_async()


def test_destroy_then_calls_raise(store: TCPStoreClient) -> None:
    c = create_nccl_comm(store, 0, 1, timeout=120)
    c.destroy()
    assert c.destroyed and not c.aborted
    with pytest.raises(CommunicatorBrokenError, match="destroyed"):
        c.check_async()


def test_init_with_a_missing_rank_times_out() -> None:
    """Rank 0 of two, and rank 1 never comes: the non-blocking init must give up at its deadline (5 s) and
    abort. In a child process, so that a hang (NCCL not honouring the abort) fails this test instead of
    hanging the session, and NCCL's bootstrap thread waiting for rank 1 goes away with the child."""
    code = textwrap.dedent(
        """
        import os, time, torch
        from pycoll import _C
        from pycoll.errors import CollectiveTimeoutError
        from pycoll.nccl import load_nccl
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        load_nccl()
        t = time.monotonic()
        try:
            _C.nccl.Comm(_C.nccl.unique_id(), 2, 0, 5.0)
        except CollectiveTimeoutError as exc:
            print(f"{time.monotonic() - t:.1f}", exc)
        """
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(REPO), env.get("PYTHONPATH", "")] if p)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    secs, _, text = proc.stdout.strip().partition(" ")
    assert "rank 0 of a communicator of 2 ranks" in text, proc.stdout + proc.stderr
    assert 4.0 < float(secs) < 60
