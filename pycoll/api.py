"""pycoll's public functions: init / finalize and the collectives.

Every collective validates its arguments before any byte is sent (InvalidUsageError names what was
expected), then runs the plan of the chosen algorithm on the native executor with the GIL released.
"""

from __future__ import annotations

import atexit
import logging
import operator
import sys
import threading
from typing import Any, Literal, Sequence, TypeVar, Union, overload

import numpy as np

from pycoll import auto
from pycoll.algorithms import ALGORITHMS
from pycoll.arrays import DTYPE_CODES, OP_CODES, Buffer, as_buffer, op_code
from pycoll.auto import DEFAULT_ERROR_BUDGET as DEFAULT_ERROR_BUDGET  # (decided in pycoll.auto)
from pycoll.auto import auto_compressed_algorithm as auto_compressed_algorithm
from pycoll.bootstrap import TorchStoreAdapter, detect_launch, explicit_launch, rendezvous
from pycoll.call import Call, compression_refusal, gpu_codec_refusal
from pycoll.comm import Communicator
from pycoll.compression import Codec, ErrorFeedback, get_codec
from pycoll.env import Settings, launcher_hosts_store
from pycoll.errors import InvalidUsageError
from pycoll.skew import SkewReport
from pycoll.work import Work

T = TypeVar("T")
log = logging.getLogger("pycoll")

_default: Communicator | None = None
_default_lock = threading.Lock()
_EMPTY = Buffer(0, 0, "float32", 4, None)  # what barrier() hands the executor
_BARRIER = Call("barrier", ALGORITHMS["barrier"][0], _EMPTY, _EMPTY, 0)  # barrier() without a timeout


def _configure_logging(settings: Settings) -> None:
    if settings.debug is None or getattr(log, "_pycoll_configured", False):
        return
    level = {"WARN": logging.WARNING, "INFO": logging.INFO, "TRACE": 5}[settings.debug]
    logging.addLevelName(5, "TRACE")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pycoll %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log._pycoll_configured = True  # type: ignore[attr-defined]


def init(
    rank: int | None = None,
    world_size: int | None = None,
    *,
    master_addr: str | None = None,
    master_port: int | None = None,
    store: Any = None,
    timeout: float | None = None,
    set_default: bool = True,
    fault_tolerance: bool | None = None,
    join: str | None = None,
) -> Communicator:
    """Forms a communicator and (by default) makes it the one collectives use when ``comm`` is omitted.

    Where the ranks come from, in order: ``store=`` (a pycoll Store or a torch.distributed Store, with
    ``rank`` and ``world_size``); explicit ``rank=``/``world_size=`` (with ``master_addr``/``master_port``);
    the launcher's environment (torchrun / ``pycoll run``, Open MPI's mpirun, Slurm's srun).
    ``timeout`` (seconds) bounds set-up and is the default deadline of every collective
    (PYCOLL_TIMEOUT, else 300 s). With PYCOLL_SECRET set, every connection to the rendezvous store
    pycoll forms must prove it holds that secret (a ``store=`` you pass is used as it is).

    ``fault_tolerance`` (default PYCOLL_FAULT_TOLERANCE, on): give the communicator a fault plane, so that
    it can ``revoke``, ``agree``, ``shrink`` and ``grow`` and finds a stopped rank within
    PYCOLL_HEARTBEAT_TIMEOUT. ``join="host:port"`` (a member's ``comm.join_address``; several,
    comma-separated; or a file listing them): instead of starting a job, ask a running one to admit this
    process; it returns once the members' ``comm.grow()`` has given it the next rank.
    """
    settings = Settings.from_environ()
    _configure_logging(settings)
    timeout = settings.timeout_s if timeout is None else float(timeout)
    if timeout <= 0:
        raise InvalidUsageError(f"timeout must be > 0 seconds, got {timeout}")
    owned: tuple[Any, ...] = ()
    if join is not None:
        from pycoll.fault.membership import join as join_job
        from pycoll.formation import host_id

        if store is not None or rank is not None or world_size is not None:
            raise InvalidUsageError("init(join=...) takes no store, rank or world_size: the job assigns them")
        comm = join_job(Communicator, join, settings, timeout, host_id(settings))
        return _make_default(comm) if set_default else comm
    if store is not None:
        if rank is None or world_size is None:
            info = detect_launch()
            if info is None:
                raise InvalidUsageError(
                    "init(store=...) needs rank= and world_size= (no launcher variables found)"
                )
            rank = info.rank if rank is None else rank
            world_size = info.world_size if world_size is None else world_size
        if not hasattr(store, "delete") and hasattr(store, "delete_key"):
            store = TorchStoreAdapter(store)  # a torch.distributed Store
    else:
        if rank is not None or world_size is not None:
            if rank is None or world_size is None:
                raise InvalidUsageError(
                    "pass both rank= and world_size=, or neither (to read the launcher's)"
                )
            info = explicit_launch(rank, world_size, master_addr or "127.0.0.1", master_port)
        else:
            info = detect_launch()
            if info is None:
                raise InvalidUsageError(
                    "pycoll.init() found no launcher environment: start the script with `pycoll run -n N`, "
                    "torchrun, mpirun or srun, or pass rank=, world_size=, master_addr=, master_port="
                )
            if master_addr is not None or master_port is not None:
                info = explicit_launch(
                    info.rank,
                    info.world_size,
                    master_addr or info.master_addr,
                    master_port or info.master_port,
                    local_rank=info.local_rank,
                    local_world_size=info.local_world_size,
                    job_id=info.job_id,
                    node_rank=info.node_rank,
                    num_nodes=info.num_nodes,
                )
        rank, world_size = info.rank, info.world_size
        store, server = rendezvous(
            info, timeout=timeout, store_hosted_externally=launcher_hosts_store(), secret=settings.secret
        )
        owned = (store,) if server is None else (store, server)
    try:
        comm = Communicator(
            store,
            int(rank),
            int(world_size),
            timeout=timeout,
            settings=settings,
            owned=owned,
            fault_tolerance=fault_tolerance,
        )
    except BaseException:
        for obj in owned:
            obj.close()
        raise
    return _make_default(comm) if set_default else comm


def _make_default(comm: Communicator) -> Communicator:
    global _default
    with _default_lock:
        if _default is not None:
            _default.finalize()
        _default = comm
    comm._replaced.append(_follow)
    return comm


def _follow(new: Communicator) -> None:
    """The default communicator was shrunk or grown: ``new`` is the default now."""
    global _default
    with _default_lock:
        _default = new


def finalize(comm: Communicator | None = None) -> None:
    """Tears the communicator down (the default one when ``comm`` is omitted). Safe to call twice."""
    global _default
    with _default_lock:
        if comm is None or comm is _default:
            comm, _default = _default, None
    if comm is not None:
        comm.finalize()


@atexit.register
def _finalize_at_exit() -> None:
    finalize()


def is_initialized() -> bool:
    return _default is not None


def get_comm(comm: Communicator | None = None) -> Communicator:
    if comm is not None:
        return comm
    if _default is None:
        raise InvalidUsageError("no communicator: call pycoll.init() first (or pass comm=)")
    return _default


def get_rank(comm: Communicator | None = None) -> int:
    return get_comm(comm).rank


def get_world_size(comm: Communicator | None = None) -> int:
    return get_comm(comm).world_size


def _on_gpu(x: Buffer, out: Buffer | None = None) -> bool:
    """Whether the call is on GPU memory; x and out must be in the same place."""
    if out is not None and x.device != out.device:
        raise InvalidUsageError(
            f"x is in {x.where()} memory and out in {out.where()}; both must be in the same place"
        )
    return x.on_gpu


def _timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise InvalidUsageError(f"timeout must be > 0 seconds, got {timeout}")
    return timeout


def _is_auto(compression: Any) -> bool:
    return isinstance(compression, str) and compression.lower() == "auto"


def _chunked_compression(
    comm: Communicator,
    collective: str,
    compression: Any,
    residual: Any,
    error_budget: float | None,
    largest: Buffer,
    op: str,
    gpu: bool,
) -> tuple[Codec | None, Buffer | None]:
    """The codec and residual of a reduce-scatter or all-gather (``largest``: its larger buffer, which
    ``compression="auto"`` prices; a residual is shaped like the reduce-scatter's input, ``largest``)."""
    if _is_auto(compression):
        codec, _ = auto.compression(comm, residual, largest, op, error_budget, gpu, collective)
        return codec, None
    if error_budget is not None:
        raise InvalidUsageError('error_budget= applies to compression="auto" only')
    return _compression(comm, compression, residual, largest, op, collective)


def _compression(
    comm: Communicator, compression: Any, residual: Any, buf: Buffer, op: str, collective: str = "allreduce"
) -> tuple[Codec | None, Buffer | None]:
    """The codec and residual (shaped like ``buf``, the call's input) of a compressed ``collective``,
    validated before anything is sent."""
    codec = get_codec(compression)
    if codec is None:
        if residual is not None:
            raise InvalidUsageError("residual= (error feedback) needs compression=")
        return None, None
    if codec.block_bytes > comm.fragment_bytes:
        raise InvalidUsageError(
            f"{codec!r} encodes a block into {codec.block_bytes} bytes, more than one transport fragment "
            f"({comm.fragment_bytes} bytes, PYCOLL_SHM_SLOT_BYTES); use a smaller block"
        )
    refusal = compression_refusal(collective, buf.dtype, op)
    if refusal is None and buf.on_gpu:  # refused before anything runs, at one rank too
        refusal = gpu_codec_refusal(codec.kind)
    if refusal is not None:
        raise InvalidUsageError(f"compression={codec!r} {refusal}")
    if residual is None:
        return codec, None
    if isinstance(residual, ErrorFeedback):
        residual = residual.residual_for(buf.count)
    res = as_buffer(residual, "residual", writable=True)
    if res.dtype != "float32" or res.count != buf.count:
        raise InvalidUsageError(
            f"residual must be float32 with as many elements as x ({buf.count}), "
            f"got {res.count} x {res.dtype}"
        )
    if res.device != buf.device:
        raise InvalidUsageError(
            f"residual is in {res.where()} memory but x in {buf.where()}; keep them together"
        )
    if res.overlaps(buf):
        raise InvalidUsageError("residual must not overlap x")
    return codec, res


@overload
def allreduce(
    x: T,
    op: str = ...,
    *,
    algorithm: str = ...,
    compression: Union[str, Codec, None] = ...,
    residual: Any = ...,
    error_budget: float | None = ...,
    comm: Communicator | None = ...,
    timeout: float | None = ...,
    async_op: Literal[False] = ...,
) -> T: ...


@overload
def allreduce(
    x: T,
    op: str = ...,
    *,
    algorithm: str = ...,
    compression: Union[str, Codec, None] = ...,
    residual: Any = ...,
    error_budget: float | None = ...,
    comm: Communicator | None = ...,
    timeout: float | None = ...,
    async_op: Literal[True],
) -> Work: ...


def allreduce(
    x: T,
    op: str = "sum",
    *,
    algorithm: str = "auto",
    compression: Union[str, Codec, None] = None,
    residual: Any = None,
    error_budget: float | None = None,
    comm: Communicator | None = None,
    timeout: float | None = None,
    async_op: bool = False,
) -> Union[T, Work]:
    """Reduces ``x`` in place across all ranks and returns it (a Work when ``async_op``).

    ``x``: a contiguous numpy array or torch tensor (CPU or CUDA), or a CuPy / numba device array, of
    float32, float64, float16, bfloat16, int32, int64, uint8 or int8. ``op``: sum, avg (floating types),
    min, max, prod. ``algorithm``: ring, tree, direct, hierarchical, or auto: the one the cost model
    (pycoll.tuning) predicts fastest for this size and world, and ``hierarchical`` on several hosts of
    equal size with more than one rank each; on GPU memory also ``nccl`` (NCCL's own all-reduce, what
    auto means there). Every rank ends with bitwise-identical results.

    GPU memory: the work is enqueued on the caller's stream (torch's current stream; the stream a
    ``__cuda_array_interface__`` names) and the call returns without waiting for the GPU; ``async_op``
    gives a Work whose ``wait()`` does. The tensor must be on the communicator's device (its local rank
    modulo the visible GPUs).

    ``compression``: None, "fp16", "bf16", "int8", "int4" or a ``pycoll.compression`` codec; needs float32,
    float16 or bfloat16 data and op sum or avg, and sums in float32. ``algorithm="auto"`` then means direct
    (two-shot: each element quantized at most twice), or ``hierarchical`` where plain auto would pick it
    (``auto_compressed_algorithm``). ``compression="auto"``: the codec and algorithm the
    cost model predicts fastest among no compression and the codecs whose expected relative error is
    within ``error_budget`` (default ``DEFAULT_ERROR_BUDGET``, 1e-3; integers, float64 and other
    operators are never compressed). ``residual``: error feedback, a float32 array like ``x`` or a
    ``pycoll.compression.ErrorFeedback``; what compression lost is stored there and added next time.
    """
    c = comm if comm is not None else _default
    plain = compression is None and residual is None and error_budget is None and not async_op
    if plain and c is not None and isinstance(x, np.ndarray):
        # The fast path: a numpy array of a dtype and length this communicator has all-reduced before
        # with the same arguments runs the prepared call (checked against the array in the native layer).
        # It is this function's whole body; the rest is _allreduce, whose larger frame costs about 0.2 us
        # per call to set up.
        dtype = x.dtype
        key = (dtype.num, x.size, op, algorithm, timeout)
        try:
            prepared = c.prepared.get(key)
        except TypeError:  # an unhashable argument: the full path names what is wrong with it
            return _allreduce(x, op, algorithm, compression, residual, error_budget, comm, timeout, async_op)
        if prepared is not None and prepared[0] is dtype and c.run_prepared(prepared[1], x):
            return x
        return _allreduce(
            x, op, algorithm, compression, residual, error_budget, comm, timeout, async_op, (key, dtype)
        )
    return _allreduce(x, op, algorithm, compression, residual, error_budget, comm, timeout, async_op)


def _allreduce(
    x: Any,
    op: str,
    algorithm: str,
    compression: Union[str, Codec, None],
    residual: Any,
    error_budget: float | None,
    comm: Communicator | None,
    timeout: float | None,
    async_op: bool,
    fast_key: tuple[tuple, Any] | None = None,
) -> Any:
    """allreduce past the fast path: validates everything; a plain call on a numpy array (``fast_key``:
    its fast-path key and dtype) is remembered for the fast path."""
    c = get_comm(comm)
    buf = as_buffer(x, "x", writable=True)
    code = op_code(op, buf)
    auto_algorithm: str | None = None
    gpu = _on_gpu(buf)
    if _is_auto(compression):
        codec, auto_algorithm = auto.compression(c, residual, buf, op, error_budget, gpu)
        if algorithm == "nccl":  # NCCL's own all-reduce was asked for, which does not compress
            codec = None
        res = None
    else:
        if error_budget is not None:
            raise InvalidUsageError('error_budget= applies to compression="auto" only')
        codec, res = _compression(c, compression, residual, buf, op)
    if codec is not None and algorithm == "auto":
        algo = auto_algorithm or auto_compressed_algorithm(c)
    elif auto_algorithm is not None and algorithm == "auto":  # compression="auto" chose no codec on GPUs
        algo = auto_algorithm
    else:
        algo = auto.algorithm(c, "allreduce", algorithm, buf.nbytes, buf.itemsize, gpu)
    if codec is not None and algo == "nccl":
        raise InvalidUsageError(
            "algorithm='nccl' does not compress; use ring, tree or direct with compression="
        )
    call = Call(
        "allreduce",
        algo,
        buf,
        buf,
        buf.count,
        op=code,
        op_name=op,
        codec=codec,
        residual=res,
        timeout=_timeout(timeout),
        async_op=async_op,
        result=x,
    )
    if fast_key is not None:  # a plain call on host memory: the fast path takes it next time
        c.dispatcher.cpu.remember(fast_key[0], fast_key[1], call)
    return c.launch(call)


def broadcast(
    x: T,
    root: int = 0,
    *,
    algorithm: str = "auto",
    comm: Communicator | None = None,
    timeout: float | None = None,
    async_op: bool = False,
) -> Union[T, Work]:
    """Copies ``x`` of rank ``root`` into ``x`` of every rank, in place."""
    c = get_comm(comm)
    buf = as_buffer(x, "x", writable=True)
    if not isinstance(root, (int, np.integer)) or not 0 <= root < c.world_size:
        raise InvalidUsageError(f"root must be a rank in 0..{c.world_size - 1}, got {root!r}")
    gpu = _on_gpu(buf)
    algo = auto.algorithm(c, "broadcast", algorithm, buf.nbytes, buf.itemsize, gpu)
    call = Call(
        "broadcast",
        algo,
        buf,
        buf,
        buf.count,
        root=int(root),
        timeout=_timeout(timeout),
        async_op=async_op,
        result=x,
    )
    return c.launch(call)


def barrier(*, comm: Communicator | None = None, timeout: float | None = None) -> None:
    """Returns once every rank has entered the barrier."""
    c = get_comm(comm)
    if timeout is None:
        c.launch(_BARRIER)  # the same call every time (the benchmarks run one before each timed call)
    else:
        c.launch(Call("barrier", _BARRIER.algorithm, _EMPTY, _EMPTY, 0, timeout=_timeout(timeout)))


def skew_report(
    comm: Communicator | None = None, *, window: int | None = None, timeout: float | None = None
) -> SkewReport:
    """Who entered the collectives late, and how long the others waited for them: ``comm.skew()`` on
    the default communicator (docs/skew.md). Every rank must call it; each gets the same report."""
    return get_comm(comm).skew(window, _timeout(timeout))


def _check_same_dtype(x: Buffer, out: Buffer) -> None:
    if x.dtype != out.dtype:
        raise InvalidUsageError(f"x and out must have the same dtype, got {x.dtype} and {out.dtype}")
    if x.overlaps(out):
        raise InvalidUsageError("x and out must not overlap")


def reduce_scatter(
    x: Any,
    out: T,
    op: str = "sum",
    *,
    algorithm: str = "auto",
    compression: Union[str, Codec, None] = None,
    residual: Any = None,
    error_budget: float | None = None,
    comm: Communicator | None = None,
    timeout: float | None = None,
    async_op: bool = False,
) -> Union[T, Work]:
    """``out`` on rank r becomes chunk r of the reduction of every rank's ``x``.

    ``x`` holds world_size * out.size elements (chunk r is ``x.flat[r*m:(r+1)*m]``); it is not modified.
    ``algorithm``: ring, direct, hierarchical (several hosts of equal size: each host sums over shared
    memory, and only the hosts' sums cross the network), or auto (hierarchical where it applies, else the
    cost model's choice).

    ``compression``: as for ``allreduce`` (float32, float16 or bfloat16 data, op sum or avg). Each rank
    encodes each chunk of ``x`` once, on the way to its owner, and the owner adds the decoded chunks and
    its own exact one in float32 (the direct algorithm; docs/compression.md#reduce-scatter): every
    element is quantized once, whatever the world size. Hierarchical, the host's sums are exact and
    each is encoded once, between hosts. ``residual``: error feedback as for
    ``allreduce``, shaped like ``x``. ``compression="auto"`` / ``error_budget``: the codec (or none) the
    cost model predicts fastest within the budget, as for ``allreduce`` (docs/tuning.md).
    """
    c = get_comm(comm)
    xb = as_buffer(x, "x", writable=False)
    ob = as_buffer(out, "out", writable=True)
    code = op_code(op, ob)
    _check_same_dtype(xb, ob)
    if xb.count != ob.count * c.world_size:
        raise InvalidUsageError(
            f"x must hold world_size * out.size = {c.world_size} * {ob.count} = {c.world_size * ob.count} "
            f"elements, got {xb.count}"
        )
    gpu = _on_gpu(xb, ob)
    codec, res = _chunked_compression(c, "reduce_scatter", compression, residual, error_budget, xb, op, gpu)
    if codec is not None:
        if res is not None and res.overlaps(ob):
            raise InvalidUsageError("residual must not overlap out")
        algo = auto.compressed_algorithm("reduce_scatter", algorithm, None if gpu else c)
        if c.world_size == 1:  # nothing is sent: the chunk is copied exactly, as without a codec
            codec = res = None
    else:
        algo = auto.algorithm(c, "reduce_scatter", algorithm, xb.nbytes, xb.itemsize, gpu)
    if gpu and algo == "hierarchical":
        raise InvalidUsageError(
            "a hierarchical reduce-scatter runs on host memory only; on GPU memory use algorithm='direct' "
            "(or 'nccl' uncompressed)"
        )
    call = Call(
        "reduce_scatter",
        algo,
        xb,
        ob,
        ob.count,
        op=code,
        op_name=op,
        codec=codec,
        residual=res,
        timeout=_timeout(timeout),
        async_op=async_op,
        result=out,
    )
    return c.launch(call)


def all_gather(
    x: Any,
    out: T,
    *,
    algorithm: str = "auto",
    compression: Union[str, Codec, None] = None,
    exact_own: bool = False,
    error_budget: float | None = None,
    comm: Communicator | None = None,
    timeout: float | None = None,
    async_op: bool = False,
) -> Union[T, Work]:
    """``out`` on every rank becomes the concatenation of every rank's ``x`` in rank order.

    ``compression``: as for ``allreduce`` (float32, float16 or bfloat16 data). Each rank's ``x`` is
    encoded once and every rank decodes the same bytes, its owner too, so every rank's ``out`` is
    bitwise identical (docs/compression.md#all-gather); ``exact_own=True``: each rank keeps its own
    chunk exact instead (the ranks' outputs then differ in that chunk). ``compression="auto"`` /
    ``error_budget``: as for ``reduce_scatter``. ``algorithm``: ring, direct, hierarchical (several
    hosts of equal size: each chunk crosses the network once per other host, compressed or not), or auto
    (hierarchical where it applies, else the cost model's choice).
    """
    c = get_comm(comm)
    xb = as_buffer(x, "x", writable=False)
    ob = as_buffer(out, "out", writable=True)
    _check_same_dtype(xb, ob)
    if ob.count != xb.count * c.world_size:
        raise InvalidUsageError(
            f"out must hold world_size * x.size = {c.world_size} * {xb.count} = {c.world_size * xb.count} "
            f"elements, got {ob.count}"
        )
    gpu = _on_gpu(xb, ob)
    codec, _ = _chunked_compression(c, "all_gather", compression, None, error_budget, ob, "sum", gpu)
    if codec is None and exact_own and not _is_auto(compression):
        raise InvalidUsageError("exact_own= applies to a compressed all_gather (give compression=)")
    exact_own = exact_own and codec is not None
    if codec is not None:
        algo = auto.compressed_algorithm("all_gather", algorithm, None if gpu else c)
        if c.world_size == 1:  # nothing is sent: the chunk is copied exactly, as without a codec
            codec, exact_own = None, False
    else:
        algo = auto.algorithm(c, "all_gather", algorithm, ob.nbytes, ob.itemsize, gpu)
    call = Call(
        "all_gather",
        algo,
        xb,
        ob,
        xb.count,
        codec=codec,
        timeout=_timeout(timeout),
        async_op=async_op,
        result=out,
        exact_own=bool(exact_own),
    )
    return c.launch(call)


def _parts(counts: Any, total: int, world: int, what: str, name: str) -> tuple[int, ...]:
    """``counts`` (``name``: send_counts or recv_counts) as a tuple of ``world`` elements per rank summing
    to ``total``, the length of ``what`` (x or out)."""
    try:
        parts = tuple(operator.index(c) for c in counts)
    except TypeError:
        raise InvalidUsageError(f"{name} must be a sequence of {world} integers, got {counts!r}") from None
    if len(parts) != world or min(parts, default=0) < 0 or sum(parts) != total:
        raise InvalidUsageError(
            f"{name} must be {world} non-negative element counts summing to {what}.size ({total}), got "
            f"{list(parts)}"
        )
    return parts


def _all_to_all_parts(
    c: Communicator, xb: Buffer, ob: Buffer, send_counts: Any, recv_counts: Any
) -> tuple[int, tuple[tuple[int, ...], tuple[int, ...]] | None]:
    """(elements per part, None) of an even all-to-all (no counts given), or (0, (send, receive counts))."""
    world = c.world_size
    if send_counts is None and recv_counts is None:
        if xb.count != ob.count or xb.count % world:
            raise InvalidUsageError(
                f"an all_to_all without send_counts / recv_counts cuts x and out into {world} equal parts: "
                f"both must hold the same multiple of {world} elements, got {xb.count} and {ob.count}"
            )
        return xb.count // world, None
    if send_counts is None or recv_counts is None:
        raise InvalidUsageError("give both send_counts and recv_counts (element counts per rank), or neither")
    send = _parts(send_counts, xb.count, world, "x", "send_counts")
    recv = _parts(recv_counts, ob.count, world, "out", "recv_counts")
    if send[c.rank] != recv[c.rank]:
        raise InvalidUsageError(
            f"rank {c.rank} sends itself send_counts[{c.rank}] = {send[c.rank]} elements but receives "
            f"recv_counts[{c.rank}] = {recv[c.rank]}: its own part must be the same size both ways"
        )
    return 0, (send, recv)


def all_to_all(
    x: Any,
    out: T,
    send_counts: Sequence[int] | None = None,
    recv_counts: Sequence[int] | None = None,
    *,
    algorithm: str = "auto",
    compression: Union[str, Codec, None] = None,
    error_budget: float | None = None,
    comm: Communicator | None = None,
    timeout: float | None = None,
    async_op: bool = False,
) -> Union[T, Work]:
    """Every rank sends part p of ``x`` to rank p and receives into part q of ``out`` what rank q sent it.

    Without counts the parts are equal: ``x`` and ``out`` hold world_size parts of the same size. With
    ``send_counts`` / ``recv_counts`` (elements per rank, in rank order; MoE dispatch) they may differ and
    be empty; rank q's ``send_counts[r]`` must equal rank r's ``recv_counts[q]``, which every message
    checks: otherwise CollectiveMismatchError on the ranks that part joins, and on the others at once or,
    where all their own parts matched and the call finished, at their next collective. ``x`` is not
    modified.

    ``compression``: as for ``all_gather`` (float32, float16 or bfloat16 data): each part is encoded once
    by its sender, in codec blocks from the part's start, and decoded once by its receiver; a rank's own
    part is copied exactly (docs/compression.md#all-to-all). ``compression="auto"`` / ``error_budget``: as
    for ``all_gather``, with equal parts only (every rank prices the same size). On GPU memory only equal
    parts run (the plan's grouped program needs every rank's part sizes).
    """
    c = get_comm(comm)
    xb = as_buffer(x, "x", writable=False)
    ob = as_buffer(out, "out", writable=True)
    _check_same_dtype(xb, ob)
    count, splits = _all_to_all_parts(c, xb, ob, send_counts, recv_counts)
    gpu = _on_gpu(xb, ob)
    if gpu and splits is not None:
        raise InvalidUsageError(
            "all_to_all on GPU memory runs even parts only (no send_counts / recv_counts): its grouped "
            "program is lowered from every rank's plan, and uneven parts are known to their own ranks only"
        )
    if splits is not None and _is_auto(compression):
        raise InvalidUsageError(
            'compression="auto" needs equal parts (no send_counts / recv_counts): it prices the size of x, '
            "which uneven parts make differ from rank to rank, and every rank must choose alike"
        )
    codec, _ = _chunked_compression(c, "all_to_all", compression, None, error_budget, xb, "sum", gpu)
    algo = auto.all_to_all_algorithm(algorithm)
    if c.world_size == 1:  # nothing is sent: the one part is copied exactly
        codec = None
    call = Call(
        "all_to_all",
        algo,
        xb,
        ob,
        count,
        codec=codec,
        timeout=_timeout(timeout),
        async_op=async_op,
        result=out,
        splits=splits,
    )
    return c.launch(call)


SUPPORTED_DTYPES = tuple(DTYPE_CODES)
SUPPORTED_OPS = tuple(OP_CODES)
