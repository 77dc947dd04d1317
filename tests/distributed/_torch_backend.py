"""Rank-side bodies of test_torch_backend.py: torch.distributed with ``backend="pycoll"``.

Each worker process initializes torch.distributed once (``init``): the default group on the pycoll
backend, through a FileStore (no ports), plus a gloo group over the same ranks to compare with. Inputs
depend on the rank and the element index in closed form; bodies return what they got (as plain lists or
bytes) and the test process checks it against float64 / int64 arithmetic.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

_STATE: dict[str, Any] = {}


def init(_comm: Any, rank: int, world: int, path: str) -> str:
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401 - registers the backend

    if "gloo" not in _STATE:
        store = dist.FileStore(path, world)
        timeout = timedelta(seconds=60)
        dist.init_process_group("pycoll", store=store, rank=rank, world_size=world, timeout=timeout)
        _STATE["gloo"] = dist.new_group(backend="gloo")
    return dist.get_backend()


def value(rank: int, n: int, mod: int = 11) -> list[int]:
    """The closed-form input of rank ``rank``: small positive integers, exact in every dtype."""
    return [((i * 7 + rank * 3) % mod) + 1 for i in range(n)]


def prod_value(rank: int, n: int) -> list[int]:
    """Inputs for PRODUCT: 1s and 2s, so a product over 4 ranks (at most 16) is exact in float16."""
    return [1 + ((i + rank) % 2) for i in range(n)]


def bits_value(rank: int, n: int) -> list[int]:
    return [(i * 5 + rank * 3 + 1) & 0x7F for i in range(n)]


def _as_list(t: Any) -> list:
    import torch

    if t.dtype.is_complex:
        return torch.view_as_real(t).reshape(-1).tolist()
    if t.dtype == torch.bfloat16 or t.dtype == torch.float16:
        return t.double().reshape(-1).tolist()
    return t.reshape(-1).tolist()


def all_reduce_cases(_comm: Any, rank: int, world: int, cases: list[tuple[str, str, int, bool]]) -> list:
    """For each (dtype, op, n, non_contiguous): the all-reduced rank input, and its bytes."""
    import torch
    import torch.distributed as dist

    out = []
    for dtype_name, op_name, n, strided in cases:
        dtype = getattr(torch, dtype_name)
        raw = {"product": prod_value, "band": bits_value, "bor": bits_value, "bxor": bits_value}
        values = raw.get(op_name, value)(rank, n)
        if dtype == torch.bool:
            t = torch.tensor([v % 3 == 0 for v in values])
        elif dtype.is_complex:
            t = torch.tensor([complex(v, -v) for v in values], dtype=dtype)
        else:
            t = torch.tensor(values, dtype=torch.int64).to(dtype)
        if strided:  # every other element of a wider tensor, written back in place
            wide = torch.zeros(2 * n, dtype=dtype)
            wide[::2] = t
            t = wide[::2]
        if op_name == "premul_sum":
            op = dist._make_nccl_premul_sum(0.5)
        else:
            op = getattr(dist.ReduceOp, op_name.upper())
        dist.all_reduce(t, op=op)
        out.append((_as_list(t), t.contiguous().reshape(-1).view(torch.uint8).tolist() if n else []))
    return out


def bad_reductions(_comm: Any, rank: int, world: int) -> list[str]:
    """Reductions the backend must refuse (on every rank, before anything is sent); then the group still
    works."""
    import torch
    import torch.distributed as dist

    errors = []
    for t, op in [
        (torch.ones(4), dist.ReduceOp.BAND),
        (torch.ones(4, dtype=torch.int32), dist.ReduceOp.AVG),
        (torch.ones(4, dtype=torch.float8_e4m3fn), dist.ReduceOp.SUM),
    ]:
        try:
            dist.all_reduce(t, op=op)
            errors.append("no error")
        except Exception as e:  # noqa: BLE001 - the test checks the type
            errors.append(f"{type(e).__name__}: {e}")
    t = torch.ones(3)
    dist.all_reduce(t)
    errors.append(str(t.tolist()))
    return errors


def data_movement(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Broadcast, the gathers, scatter, all-to-all, send/recv, reduce: what every rank ended with."""
    import torch
    import torch.distributed as dist

    got: dict[str, Any] = {}
    for root in range(world):  # every root; a bool tensor and a strided one
        b = torch.tensor([rank * 10 + i for i in range(5)], dtype=torch.int16)
        flags = torch.tensor([rank == root, rank != root])
        base = torch.zeros(4, 3)
        base[:, 1] = rank + 0.5
        col = base[:, 1]
        for t in (b, flags, col):
            dist.broadcast(t, src=root)
        got[f"broadcast{root}"] = (b.tolist(), flags.tolist(), col.tolist(), base[:, 0].tolist())
    x = torch.tensor([rank, rank * rank], dtype=torch.float64)
    outs = [torch.empty(2, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(outs, x)
    got["all_gather"] = [o.tolist() for o in outs]
    big = torch.zeros(world * 3, dtype=torch.bfloat16)
    mine = big[rank * 3 : (rank + 1) * 3]  # in place, as FSDP2 gathers
    mine.copy_(torch.tensor([rank + 1.0, 2.0, 3.0]))
    dist.all_gather_into_tensor(big, mine)
    got["all_gather_into_tensor"] = big.float().tolist()
    objs: list[Any] = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    got["all_gather_object"] = objs
    got["reduce_scatter"] = _reduce_scatters(rank, world)
    got["all_to_all"] = _all_to_alls(rank, world)
    got["p2p"] = _point_to_point(rank, world)
    gathered = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([rank, -rank], dtype=torch.float32), gathered, dst=0)
    got["gather"] = None if gathered is None else [g.tolist() for g in gathered]
    piece = torch.zeros(2, dtype=torch.int64)
    pieces = [torch.tensor([r, 100 + r]) for r in range(world)] if rank == world - 1 else None
    dist.scatter(piece, pieces, src=world - 1)
    got["scatter"] = piece.tolist()
    red = torch.tensor([float(rank + 1)] * 3)
    dist.reduce(red, dst=1, op=dist.ReduceOp.PRODUCT)
    got["reduce"] = red.tolist()
    dist.barrier()
    return got


def _reduce_scatters(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    got = {}
    full = torch.tensor([float(rank * 100 + i) for i in range(world * 2)])
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, full)
    got["tensor_sum"] = out.tolist()
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.MAX)
    got["tensor_max"] = out.tolist()
    dist.reduce_scatter_tensor(out, full, op=dist.ReduceOp.AVG)
    got["tensor_avg"] = out.tolist()
    inputs = [torch.tensor([rank + j, 1], dtype=torch.int32) for j in range(world)]
    out_i = torch.empty(2, dtype=torch.int32)
    dist.reduce_scatter(out_i, inputs)
    got["list_sum"] = out_i.tolist()
    inplace = full.clone()  # the output is this rank's chunk of the input, as FSDP2 reduce-scatters
    dist.reduce_scatter_tensor(inplace[rank * 2 : rank * 2 + 2], inplace)
    got["in_place"] = inplace[rank * 2 : rank * 2 + 2].tolist()
    return got


def _all_to_alls(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    got = {}
    inp = torch.tensor([rank * 100 + j for j in range(world)], dtype=torch.float32)
    out = torch.empty(world)
    dist.all_to_all_single(out, inp)
    got["even"] = out.tolist()
    # uneven: rank r sends j+1 rows to rank j, each row [r, j, k]
    in_splits = [j + 1 for j in range(world)]
    out_splits = [rank + 1] * world
    rows = [[rank, j, k] for j in range(world) for k in range(j + 1)]
    inp2 = torch.tensor(rows, dtype=torch.int64)
    out2 = torch.empty((sum(out_splits), 3), dtype=torch.int64)
    dist.all_to_all_single(out2, inp2, out_splits, in_splits)
    got["uneven"] = out2.tolist()
    ins = [torch.full((j + 1,), rank * 10 + j, dtype=torch.int32) for j in range(world)]
    outs = [torch.empty(rank + 1, dtype=torch.int32) for _ in range(world)]
    dist.all_to_all(outs, ins)
    got["list"] = [o.tolist() for o in outs]
    return got


def _point_to_point(rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    got: dict[str, Any] = {}
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    if rank == 0:
        dist.send(torch.tensor([42.0, 43.0]), dst=1)
        dist.send(torch.tensor([44.0, 45.0]), dst=1)  # arrives after the first
    elif rank == 1:
        a, b = torch.empty(2), torch.empty(2)
        dist.recv(a, src=0)
        w = dist.irecv(b, src=0)
        w.wait()
        got["recv"] = (a.tolist(), b.tolist(), w.source_rank() if hasattr(w, "source_rank") else None)
    ring = torch.empty(3, dtype=torch.int64)
    ops = [
        dist.P2POp(dist.irecv, ring, prv),  # receives posted first on every rank: must not deadlock
        dist.P2POp(dist.isend, torch.tensor([rank, rank * 2, -rank]), nxt),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    got["ring"] = ring.tolist()
    return got


def async_work(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """An asynchronous all-reduce's Work as gloo's: wait, is_completed, exception, get_future."""
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt

    assert pt.init_from_process_group() is dist.group.WORLD.comm  # the hooks reuse the group's communicator
    t = torch.full((1 << 16,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    ok = work.wait()
    value = fut.wait()
    later = torch.ones(4)
    w2 = dist.all_reduce(later, async_op=True)
    chained = w2.get_future().then(lambda f: f.value()[0] * 2).wait()
    return {
        "wait": ok,
        "completed": work.is_completed(),
        "success": work.is_success(),
        "exception": work.exception(),
        "future_value": [type(value).__name__, value[0] is t, float(value[0][0])],
        "result_is_t": work.result()[0] is t,
        "t0": float(t[0]),
        "chained": chained.tolist(),
    }


def compare_with_gloo(_comm: Any, rank: int, world: int, n: int) -> dict[str, Any]:
    """The same random float32 all-reduce through pycoll and through gloo (same processes)."""
    import torch
    import torch.distributed as dist

    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(n, generator=g)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a)  # the default group: pycoll
    dist.all_reduce(b, group=_STATE["gloo"])
    exact = torch.zeros(n, dtype=torch.float64)
    for r in range(world):
        exact += torch.randn(n, generator=torch.Generator().manual_seed(1000 + r)).double()
    return {
        "pycoll_err": float((a.double() - exact).abs().max()),
        "gloo_err": float((b.double() - exact).abs().max()),
        "diff": float((a - b).abs().max()),
        "bytes": a.view(torch.uint8).numpy().tobytes(),
    }


def subgroups(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """new_group (each rank in one of two), a 2 x (world/2) DeviceMesh, a group this rank is not in."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    got: dict[str, Any] = {}
    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    g_even = dist.new_group(evens, backend="pycoll")
    g_odd = dist.new_group(odds, backend="pycoll")
    mine = g_even if rank % 2 == 0 else g_odd
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    got["parity_sum"] = t.item()
    b = torch.tensor([rank])
    dist.broadcast(b, src=(evens if rank % 2 == 0 else odds)[-1], group=mine)  # src is a global rank
    got["parity_bcast"] = b.item()
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    for dim in ("dp", "tp"):
        group = mesh.get_group(dim)
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=group)
        got[dim] = (t.item(), dist.get_backend(group), dist.get_process_group_ranks(group))
    return got


def compressed(_comm: Any, rank: int, world: int, n: int, steps: int) -> dict[str, Any]:
    """A group with int8 compression: what compresses, what does not, and error feedback over steps."""
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt

    group = dist.new_group(backend="pycoll", pg_options=pt.Options("int8"))
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(n, generator=g)
    once = x.clone()
    dist.all_reduce(once, group=group)
    small = torch.tensor([rank + 0.1] * 100)  # < min_numel: lossless
    dist.all_reduce(small, group=group)
    ints = torch.tensor(value(rank, 4096), dtype=torch.int32)
    dist.all_reduce(ints, group=group)
    doubles = torch.tensor(value(rank, 4096), dtype=torch.float64) / 3
    dist.all_reduce(doubles, group=group)
    maxed = x.clone()
    dist.all_reduce(maxed, op=dist.ReduceOp.MAX, group=group)
    # error feedback: the same storage reduced again and again; its running mean converges
    buf = torch.empty(n)
    total = torch.zeros(n, dtype=torch.float64)
    for _ in range(steps):
        buf.copy_(x)
        dist.all_reduce(buf, group=group)
        total += buf.double()
    residuals = len(group._residuals)
    rs_in = torch.randn(world * 2048, generator=g)
    rs_out = torch.empty(2048)
    dist.reduce_scatter_tensor(rs_out, rs_in, group=group)  # compressed: each element quantized once
    rs_first = rs_out.tolist()
    dist.reduce_scatter_tensor(rs_out, rs_in, group=group)  # the same input storage: its residual
    return {
        "rs_in": rs_in.tolist(),
        "rs": rs_first,
        "residuals_after_rs": len(group._residuals),
        "x": x.tolist(),
        "once": once.tolist(),
        "once_bytes": once.view(torch.uint8).numpy().tobytes(),
        "small": small.tolist(),
        "ints": ints.tolist(),
        "doubles": doubles.tolist(),
        "max": maxed.tolist(),
        "mean": (total / steps).tolist(),
        "residuals": residuals,
    }


def compressed_all_gather(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """A group with all_gather_compression="int8": all_gather_into_tensor of float32 weights compressed
    (in place too, as FSDP2 calls it), float64 and small tensors lossless."""
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt

    group = dist.new_group(backend="pycoll", pg_options=pt.Options(all_gather_compression="int8"))
    w = torch.randn(4096, generator=torch.Generator().manual_seed(3 + rank))
    out = torch.empty(world * 4096)
    dist.all_gather_into_tensor(out, w, group=group)
    inplace = torch.zeros(world * 4096)
    inplace[rank * 4096 : (rank + 1) * 4096] = w
    dist.all_gather_into_tensor(inplace, inplace[rank * 4096 : (rank + 1) * 4096], group=group)
    d = w.double()
    dout = torch.empty(world * 4096, dtype=torch.float64)
    dist.all_gather_into_tensor(dout, d, group=group)
    small = torch.full((100,), rank + 0.1)
    sout = torch.empty(world * 100)
    dist.all_gather_into_tensor(sout, small, group=group)
    return {"w": w.tolist(), "out": out.numpy().tobytes(), "inplace": inplace.numpy().tobytes(),
            "double_exact": bool(torch.equal(dout[rank * 4096 : (rank + 1) * 4096], d)),
            "small": sout.tolist()}


def compressed_all_to_all(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """A group with all_to_all_compression="int8": all_to_all_single of float32 rows (MoE dispatch: rank r
    sends (j + 1) * 300 rows of 8 to rank j) compressed, each part its sender's encoding decoded and the
    own part exact; int64 rows and the list all_to_all lossless."""
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt

    group = dist.new_group(backend="pycoll", pg_options=pt.Options(all_to_all_compression="int8"))
    in_splits = [(j + 1) * 300 for j in range(world)]
    out_splits = [(rank + 1) * 300] * world
    x = torch.randn(sum(in_splits), 8, generator=torch.Generator().manual_seed(7 + rank))
    out = torch.empty(sum(out_splits), 8)
    dist.all_to_all_single(out, x, out_splits, in_splits, group=group)
    ids = torch.arange(sum(in_splits) * 8, dtype=torch.int64).reshape(-1, 8) + 10**6 * rank
    ids_out = torch.empty(sum(out_splits), 8, dtype=torch.int64)
    dist.all_to_all_single(ids_out, ids, out_splits, in_splits, group=group)
    # rank 0 dispatches no tokens: its input has no rows, and it receives none from itself
    sends = [0 if rank == 0 else 10 * (j + 1) for j in range(world)]
    gets = [0 if q == 0 else 10 * (rank + 1) for q in range(world)]
    none = torch.full((sum(sends), 8), float(rank))
    got = torch.empty(sum(gets), 8)
    dist.all_to_all_single(got, none, gets, sends, group=group)
    return {"x": x.numpy().tobytes(), "out": out.numpy().tobytes(), "ids": ids_out.numpy().tobytes(),
            "empty": got.tolist()}


def refused_options(_comm: Any, rank: int, world: int) -> list[str]:
    import torch.distributed as dist

    errors = []
    for kwargs in [dict(backend="pycoll", pg_options="int8"), dict(backend="cpu:pycoll,cuda:gloo")]:
        try:
            dist.new_group(**kwargs)
            errors.append("no error")
        except Exception as e:  # noqa: BLE001
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def fresh_group_failure(_comm: Any, rank: int, world: int, kind: str, path: str) -> dict[str, Any]:
    """In fresh processes: the pycoll default group (timeout 3 s), then one failure of ``kind``."""
    import torch
    import torch.distributed as dist

    import pycoll.torch  # noqa: F401

    store = dist.FileStore(path, world)
    dist.init_process_group("pycoll", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=3))
    t = torch.ones(8)
    dist.all_reduce(t)  # the group works
    start = time.monotonic()
    try:
        if kind == "mismatch":
            dist.all_reduce(torch.ones(1000 + (rank == 1)))
        elif kind == "timeout":
            if rank != 1:
                dist.all_reduce(torch.ones(10))
        elif kind == "peer_lost":
            if rank == 1:
                os._exit(3)
            for _ in range(100):
                dist.all_reduce(torch.ones(1 << 16))
                time.sleep(0.01)
        elif kind == "monitored_lost":  # rank 1 exits; a long deadline: the loss must end the wait
            if rank == 1:
                os._exit(3)
            dist.monitored_barrier(timeout=timedelta(seconds=60))
        elif kind == "any_source_lost":  # rank 1 exits; the others wait for a message from any rank
            if rank == 1:
                os._exit(3)
            dist.recv(torch.empty(4))
        elif kind == "async_mismatch":
            odd = torch.ones(100, dtype=torch.float64 if rank == 0 else torch.float32)
            work = dist.all_reduce(odd, async_op=True)
            work.wait()
        return {"error": None}
    except Exception as e:  # noqa: BLE001
        return {"error": type(e).__name__, "message": str(e), "after_s": time.monotonic() - start}


def async_order(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Asynchronous ops chained without waiting in between, on non-contiguous views (which go through
    copies): each must see what the one before it wrote."""
    import torch
    import torch.distributed as dist

    t = torch.full((1 << 18, 2), float(rank + 1))
    w1 = dist.all_reduce(t, async_op=True)  # large: still running when the next ones are called
    col = t[:, 1]  # a strided view: gathered through a copy
    outs = [torch.empty(1 << 18) for _ in range(world)]
    w2 = dist.all_gather(outs, col, async_op=True)
    pieces = [t[j::world, 0] for j in range(world)]  # strided views, concatenated for the reduce-scatter
    mine = torch.empty(pieces[0].numel())
    w3 = dist.reduce_scatter(mine, pieces, async_op=True)
    for w in (w3, w2, w1):
        w.wait()
    return {"gathered": [float(o.min()) for o in outs] + [float(o.max()) for o in outs],
            "scattered": [float(mine.min()), float(mine.max())]}


def skew(_comm: Any, rank: int, world: int, delayed: int, delay_s: float, n: int) -> dict[str, Any]:
    """``n`` all-reduces on the pycoll group, rank ``delayed`` sleeping ``delay_s`` before every other
    one: the group's skew report over them (pycoll.torch.skew_report and group.skew agree), when this
    rank called each, and what a gloo group's report request raises."""
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt
    from pycoll.errors import InvalidUsageError

    t = torch.ones(256)
    entered = []  # when this rank called each all-reduce (one clock for every rank of this host), ms
    for i in range(n):
        if rank == delayed and i % 2 == 0:
            time.sleep(delay_s)
        entered.append(time.monotonic() * 1000)
        dist.all_reduce(t)
    report = pt.skew_report(window=n).to_dict()
    again = dist.group.WORLD.skew(window=n).to_dict()
    try:
        pt.skew_report(_STATE["gloo"])
        refused = ""
    except InvalidUsageError as e:
        refused = str(e)
    return {
        "report": report["window"],
        "again_ranks": len(again["window"]["ranks"]),
        "refused": refused,
        "entered_ms": entered,
    }


def any_source(_comm: Any, rank: int, world: int, per_sender: int) -> dict[str, Any]:
    """Receive from any source: rank 0 takes ``per_sender`` messages from every other rank without naming
    the sender (recv and irecv alternately), then one from rank 1 by name posted while one from any
    source waits. Every message holds (sender, its number); what rank 0 got is returned in its order."""
    import torch
    import torch.distributed as dist

    got: dict[str, Any] = {"order": [], "sources": []}
    if rank == 0:
        for k in range((world - 1) * per_sender):
            t = torch.full((2,), -1, dtype=torch.int64)
            if k % 2:
                w = dist.irecv(t)
                w.wait()
                src = w._source_rank()
            else:
                src = dist.recv(t)
            got["order"].append(t.tolist())
            got["sources"].append(src)
        # posted in this order: any source, then rank 1 by name; rank 1's first message is the only one
        # there at first, so the receive from any source must get it, and the named one its second
        first, second = torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
        w_any = dist.irecv(first)
        w_named = dist.irecv(second, src=1)
        dist.barrier()  # rank 1 sends only now, both receives being posted
        w_any.wait()
        w_named.wait()
        got["posted_order"] = (w_any._source_rank(), first.tolist(), second.tolist())
    else:
        for k in range(per_sender):
            dist.send(torch.tensor([rank, k]), dst=0)
        dist.barrier()
        if rank == 1:
            dist.send(torch.tensor([1, 100]), dst=0)
            dist.send(torch.tensor([1, 101]), dst=0)
    dist.barrier()
    return got


def monitored(_comm: Any, rank: int, world: int, late: list[int], wait_all: bool) -> dict[str, Any]:
    """A monitored barrier that passes, then one that the ranks ``late`` reach 4 s after the others (timeout
    2 s): what each rank raised (type, message), and that the group still works after."""
    import torch
    import torch.distributed as dist

    got: dict[str, Any] = {}
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    got["passed"] = True
    if rank in late:
        time.sleep(4)
    start = time.monotonic()
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=2), wait_all_ranks=wait_all)
        got["error"] = None
    except Exception as e:  # noqa: BLE001 - what it raised is the result
        got["error"] = (type(e).__name__, str(e))
    got["seconds"] = time.monotonic() - start
    t = torch.ones(3)
    dist.all_reduce(t)
    got["after"] = t.tolist()
    dist.monitored_barrier(timeout=timedelta(seconds=30))  # the calls still line up on every rank
    return got


def sparse_all_reduce(_comm: Any, rank: int, world: int) -> dict[str, Any]:
    """Sparse COO all-reduces: rank r stores rows {r, r + 1, ..., r + r} (mod 2 * world) of a (2 * world,
    3) tensor (row i holding i * 10 + k + r / 8, exact in float32), and nothing on rank 1 in a second call;
    one with another size on the last rank. The results as (indices, values, coalesced, bytes)."""
    import torch
    import torch.distributed as dist

    rows = 2 * world

    def made(r: int, n: int) -> Any:
        idx = torch.tensor([[(r + j) % rows for j in range(n)]])
        vals = [[float(i * 10 + k) + r / 8 for k in range(3)] for i in idx[0].tolist()]
        return torch.sparse_coo_tensor(idx, torch.tensor(vals).reshape(n, 3), (rows, 3))

    got: dict[str, Any] = {}
    for name, n in (("overlapping", rank + 1), ("one empty", 0 if rank == 1 else 2)):
        t = made(rank, n)
        dist.all_reduce(t)
        values = t._values()
        got[name] = (t._indices().tolist(), values.tolist(), t.is_coalesced(), values.numpy().tobytes())
    other = torch.sparse_coo_tensor(torch.zeros((1, 0)), torch.zeros((0, 3)), (rows + 1, 3))
    t = made(rank, 1) if rank < world - 1 else other
    try:
        dist.all_reduce(t)
        got["mismatch"] = None
    except Exception as e:  # noqa: BLE001
        got["mismatch"] = (type(e).__name__, str(e))
    try:
        dist.all_reduce(made(rank, 1), op=dist.ReduceOp.MAX)
        got["max"] = None
    except Exception as e:  # noqa: BLE001
        got["max"] = (type(e).__name__, str(e))
    return got
