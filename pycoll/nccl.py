"""NCCL, loaded at first use: finding the library, its version, and communicators over pycoll's store.

``import pycoll`` never loads NCCL (nor CUDA); :func:`load_nccl` does, from the path
:func:`pycoll.libraries.find_nccl` chooses (``NCCL_LIBRARY``, the ``nvidia-nccl-cu13`` / ``-cu12`` wheels,
then the system), so what ``pycoll doctor`` reports is what a job gets. A process holds one NCCL.

The CUDA device is the caller's choice and must be current before :func:`create_nccl_comm`; the usual
one is the launcher's local rank (torchrun's, mpirun's, Slurm's or ``pycoll run``'s, as
:func:`pycoll.bootstrap.detect_launch` reads it), e.g. with torch::

    launch = pycoll.bootstrap.detect_launch()
    torch.cuda.set_device(launch.local_rank if launch is not None else 0)
    comm = pycoll.nccl.create_nccl_comm(store, rank, world_size, timeout=60)

The communicator (``pycoll._C.nccl.Comm``) takes raw device pointers and a ``cudaStream_t`` as ints
(``tensor.data_ptr()``, ``torch.cuda.current_stream().cuda_stream``) and dtype / op codes of
:mod:`pycoll.arrays` (``DTYPE_CODES``, ``OP_CODES``). It is non-blocking inside: each call returns once
NCCL has taken the operation (the work itself runs on the stream), and every wait for other ranks (init,
a group's launch, destroy) has the communicator's timeout, after which it is aborted and
``CollectiveTimeoutError`` is raised (``NCCL_COMM_BLOCKING=1`` in the environment makes NCCL block
inside its calls, which takes these deadlines away). NCCL's failures raise :class:`pycoll.NcclError`
with NCCL's own text (``ncclGetErrorString``, ``ncclGetLastError``), the call and the rank;
``PeerLostError`` when NCCL says a remote rank failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pycoll.errors import CollectiveTimeoutError, InvalidUsageError, NcclError

if TYPE_CHECKING:
    from pycoll.bootstrap.store import Store

__all__ = ["UNIQUE_ID_BYTES", "create_nccl_comm", "load_nccl", "nccl_version"]

#: Size of ``ncclUniqueId``.
UNIQUE_ID_BYTES = 128


def _native() -> Any:
    from pycoll import _C

    return _C.nccl


def load_nccl() -> str:
    """Load NCCL (once per process) and return the path it was loaded from.

    Raises :class:`NcclError` naming every place searched when no NCCL is found, or the path and the
    loader's reason when it cannot be used; :class:`InvalidUsageError` when pycoll was built without CUDA.
    """
    native = _native()
    if native.is_loaded():
        return str(native.loaded_path())
    from pycoll.libraries import find_nccl

    info = find_nccl(load=False)
    searched = "; ".join(info.searched) or "nowhere"
    if info.path is None or info.error:
        raise NcclError(f"cannot load NCCL: {info.error or 'libnccl not found'} (searched: {searched})")
    if not native.built():
        raise InvalidUsageError(
            f"pycoll was built without CUDA, so it cannot use the NCCL at {info.path} "
            "(rebuild where nvcc is found, or with PYCOLL_CUDA=on)"
        )
    try:
        native.load(info.path)
    except NcclError as exc:
        raise NcclError(f"{exc} (chosen from {info.source}; searched: {searched})") from None
    return info.path


def nccl_version() -> str:
    """The version of the NCCL pycoll uses, as ``ncclGetVersion`` reports it ("2.28.5"); loads NCCL on
    first use (see :func:`load_nccl` for what it raises)."""
    from pycoll.libraries import decode_nccl_version

    load_nccl()
    return decode_nccl_version(int(_native().version()))


def create_nccl_comm(store: Store, rank: int, world_size: int, timeout: float) -> Any:
    """Form an NCCL communicator of ``world_size`` ranks; every rank calls this with its own ``rank``.

    Rank 0 makes the 128-byte unique id and publishes it in ``store`` (pycoll's rendezvous store, or any
    object with its ``set`` / ``get`` / ``add``); the others read it. Communicators formed on one store are
    numbered per rank in the store, so ranks must form them in the same order. ``timeout`` (seconds)
    bounds each wait: for the id, for NCCL's init, and later each of the communicator's own waits.
    The CUDA device must already be current (see the module docstring).

    Returns ``pycoll._C.nccl.Comm``. Raises ``CollectiveTimeoutError`` when rank 0's id or some rank
    does not arrive in time, :class:`NcclError` with NCCL's text when NCCL fails.
    """
    if not 0 <= rank < world_size:
        raise InvalidUsageError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if not timeout > 0:
        raise InvalidUsageError(f"timeout must be > 0 seconds, got {timeout}")
    native = _native()
    load_nccl()
    n = store.add(f"pycoll/nccl/communicators/{rank}", 1)
    key = f"pycoll/nccl/comm{n}/unique_id"
    if rank == 0:
        uid = bytes(native.unique_id())
        store.set(key, uid)
    else:
        try:
            uid = bytes(store.get(key, timeout=timeout))
        except CollectiveTimeoutError as exc:
            raise CollectiveTimeoutError(
                f"rank {rank}: rank 0 did not publish the NCCL unique id of communicator {n} within "
                f"{timeout:g} s: {exc}"
            ) from exc
    if len(uid) != UNIQUE_ID_BYTES:
        raise NcclError(f"the NCCL unique id under {key!r} is {len(uid)} bytes, expected {UNIQUE_ID_BYTES}")
    return native.Comm(uid, world_size, rank, float(timeout))
