"""The all-reduce communication hook for DDP and the communicator it runs on.

The contract DDP expects from a hook (torch.distributed.algorithms.ddp_comm_hooks), kept exactly:
``hook(state, bucket) -> torch.futures.Future`` whose value is a tensor of the bucket's shape holding
the *averaged* gradients. This hook writes the average into ``bucket.buffer()`` in place (so
``gradient_as_bucket_view=True`` gradients see it and no second full-size buffer is kept alive) and
returns the future of an asynchronous pycoll all-reduce, so DDP overlaps it with the rest of backward.
"""

from __future__ import annotations

import itertools
import warnings
from typing import Any

import torch
import torch.distributed as dist

import pycoll
from pycoll.comm import Communicator
from pycoll.compression import CODEC_DTYPES, Codec, get_codec
from pycoll.errors import InvalidUsageError
from pycoll.skew import SkewReport
from pycoll.torch.backend import ProcessGroupPycoll

_TORCH_CODEC_DTYPES = {getattr(torch, name) for name in CODEC_DTYPES}
_group_counter: dict[tuple[int, ...], itertools.count] = {}


def init_from_process_group(
    process_group: Any = None, *, timeout: float | None = None, set_default: bool = False
) -> Communicator:
    """A pycoll communicator over the ranks of a torch.distributed process group (the default group
    when None), formed through torch's own store: no second rendezvous, no extra ports.

    Every rank of the group must call it (the same number of times per group). ``set_default`` makes
    it the communicator pycoll's collectives use when ``comm=`` is omitted. A group of the "pycoll"
    backend already has a communicator: without ``set_default`` that one is returned.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidUsageError(
            "init_from_process_group() needs torch.distributed initialized (dist.init_process_group)"
        )
    from torch.distributed import distributed_c10d as c10d

    group = process_group if process_group is not None else c10d._get_default_group()
    if isinstance(group, ProcessGroupPycoll) and not set_default:
        return group.comm  # a "pycoll" group already has its communicator: no second one
    ranks = tuple(dist.get_process_group_ranks(group))
    # Keys unique to this group and to this call for the group, identical on every member.
    call = next(_group_counter.setdefault(ranks, itertools.count()))
    prefix = f"pycoll/pg{abs(hash(ranks)) % (1 << 32):08x}/{call}"
    store = dist.PrefixStore(prefix, c10d._get_default_store())
    return pycoll.init(
        store=store,
        rank=dist.get_rank(group),
        world_size=dist.get_world_size(group),
        timeout=timeout,
        set_default=set_default,
    )


class CommState:
    """What every hook state shares: the communicator, found on first use, and pickling without it.

    ``comm`` None: pycoll's default communicator if ``pycoll.init()`` was called, else one formed from
    DDP's default process group. A pickled state carries no communicator; unpickled into a live state
    (a roll-back), it keeps that state's communicator.
    """

    comm: Communicator | None = None

    def communicator(self) -> Communicator:
        if self.comm is None:
            self.comm = pycoll.get_comm() if pycoll.is_initialized() else init_from_process_group()
        return self.comm

    def skew(self, window: int | None = None) -> SkewReport:
        """The skew report of the hook's communicator (``Communicator.skew``; docs/skew.md): who entered
        the gradient all-reduces late, and how long the others waited. Every rank must call it."""
        return self.communicator().skew(window)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["comm"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        comm = self.__dict__.get("comm")
        self.__dict__.update(state)
        if state.get("comm") is None:
            self.comm = comm


class HookState(CommState):
    """What ``allreduce_hook`` keeps between calls.

    ``comm``: the pycoll communicator (None: pycoll's default one if ``pycoll.init()`` was called, else
    one formed from DDP's default process group on first use). ``compression``: None / "none" for a plain
    all-reduce, or a codec name or object (``pycoll.compression``). ``error_feedback``: keep a float32
    residual per bucket, keyed by ``bucket.index()`` and the bucket's layout (the shapes of its
    parameters in order): a bucket that changes gets a new residual of zeros, and the old one is kept
    one more iteration (DDP's buckets can change back, as after a restart) before it is dropped.
    ``start_iter``: iterations before compression starts (DDP rebuilds its buckets after the first
    one, so the default 2 keeps residuals from being made for buckets about to change). ``min_numel``:
    gradients with fewer elements (biases, norms) go uncompressed, in one plain all-reduce per bucket;
    each run of adjacent larger ones is compressed on its own, so no codec block mixes a bias with a
    weight.

    Pickles without the communicator (``__getstate__``): save it with a checkpoint and restore it on
    the same ranks to continue with the same residuals and iteration count: rolled back into the same
    DDP, training continues bit for bit as it did (with nearest rounding: stochastic rounding draws from
    the communicator's collective count, which a checkpoint does not hold). A state with a numba user
    codec does not pickle (its compiled kernels cannot). A restarted job's new DDP runs its first iteration on
    its initial bucket layout and only then rebuilds it in the order gradients became ready, so in that
    one iteration the buckets differ from the saved run's (they start from zero residuals) and the
    result differs slightly from an uninterrupted run; from the next iteration on the layouts agree
    again and the saved residuals are used.
    """

    def __init__(
        self,
        comm: Communicator | None = None,
        compression: str | Codec | None = "int8",
        error_feedback: bool = True,
        start_iter: int = 2,
        min_numel: int = 1024,
    ) -> None:
        if not isinstance(start_iter, int) or start_iter < 0:
            raise InvalidUsageError(f"start_iter must be an integer >= 0, got {start_iter!r}")
        if not isinstance(min_numel, int) or min_numel < 0:
            raise InvalidUsageError(f"min_numel must be an integer >= 0, got {min_numel!r}")
        self.comm = comm
        self.codec = get_codec(compression)
        self.error_feedback = bool(error_feedback)
        self.start_iter = start_iter
        self.min_numel = min_numel
        self.iter = 0
        # (bucket index, layout) -> residual, and the iteration that last used it
        self.residuals: dict[tuple[int, tuple[tuple[int, ...], ...]], torch.Tensor] = {}
        self.last_used: dict[tuple[int, tuple[tuple[int, ...], ...]], int] = {}
        self._warned_dtype = False

    def codec_for(self, buffer: torch.Tensor) -> Codec | None:
        """The codec this bucket goes through now, or None (too early, too small, or not a float type)."""
        if self.codec is None or self.iter < self.start_iter or buffer.numel() < self.min_numel:
            return None
        if buffer.dtype not in _TORCH_CODEC_DTYPES:
            if not self._warned_dtype:
                self._warned_dtype = True
                warnings.warn(
                    f"pycoll.torch: a {buffer.dtype} gradient bucket is all-reduced without compression "
                    f"({self.codec!r} needs {', '.join(CODEC_DTYPES)})",
                    stacklevel=3,
                )
            return None
        return self.codec

    def residual_for(
        self, index: int, buffer: torch.Tensor, layout: tuple[tuple[int, ...], ...] = ()
    ) -> torch.Tensor:
        """The residual of bucket ``index`` with this ``layout`` (the shapes of its parameters in order);
        zeros when new."""
        key = (index, layout or ((buffer.numel(),),))
        r = self.residuals.get(key)
        if r is None or r.numel() != buffer.numel():
            r = torch.zeros(buffer.numel(), dtype=torch.float32, device=buffer.device)
            self.residuals[key] = r
        self.last_used[key] = self.iter
        return r

    def end_iteration(self) -> None:
        """Counts an iteration; drops residuals no bucket used in this one or the one before."""
        for key in [k for k, it in self.last_used.items() if it < self.iter - 1]:
            del self.residuals[key], self.last_used[key]
        self.iter += 1


def skew_report(group: Any = None, window: int | None = None) -> SkewReport:
    """The skew report of a "pycoll" process group (the default group when None): who entered its
    collectives late (docs/skew.md). Every rank of the group must call it. For DDP's gradients under
    another backend with pycoll's hook, ask the hook's state (``HookState.skew()``)."""
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidUsageError("skew_report() needs torch.distributed initialized (dist.init_process_group)")
    from torch.distributed import distributed_c10d as c10d

    pg = group if group is not None else c10d._get_default_group()
    if not isinstance(pg, ProcessGroupPycoll):
        raise InvalidUsageError(
            f"the process group runs on {dist.get_backend(pg)!r}, not pycoll: its collectives are not "
            "recorded. With pycoll's DDP hook, the hook's state has the report (HookState.skew())"
        )
    return pg.skew(window)


def _runs(sizes: list[int], min_numel: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(offset, length) of the runs of adjacent gradients with >= min_numel elements, and of the others."""
    large: list[tuple[int, int]] = []
    small: list[tuple[int, int]] = []
    offset = 0
    for n in sizes:
        runs = large if n >= min_numel else small
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + n)
        else:
            runs.append((offset, n))
        offset += n
    return large, small


def allreduce_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients over the ranks through pycoll, compressed as ``state`` says."""
    fut = _average(state, bucket)
    if bucket.is_last():
        state.end_iteration()
    return fut


def _average(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    buffer = bucket.buffer()
    comm = state.communicator()
    codec = state.codec_for(buffer)
    params = bucket.parameters()
    large, small = _runs([p.numel() for p in params], state.min_numel)
    if codec is None or not large:
        plain: torch.futures.Future[torch.Tensor] = pycoll.allreduce(
            buffer, "avg", comm=comm, async_op=True
        ).get_future()
        return plain
    residual = None
    if state.error_feedback:
        residual = state.residual_for(bucket.index(), buffer, tuple(tuple(p.shape) for p in params))
    futures = []
    for offset, n in large:  # each run compressed on its own, in place
        part = buffer[offset : offset + n]
        res = None if residual is None else residual[offset : offset + n]
        work = pycoll.allreduce(part, "avg", compression=codec, residual=res, comm=comm, async_op=True)
        futures.append(work.get_future())
    if small:  # the small gradients together, uncompressed, then back in place
        packed = torch.cat([buffer[offset : offset + n] for offset, n in small])

        def unpack(fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
            fut.wait()  # raises the all-reduce's error, if any, into the future DDP waits on
            at = 0
            for offset, n in small:
                buffer[offset : offset + n].copy_(packed[at : at + n])
                at += n
            return buffer

        futures.append(pycoll.allreduce(packed, "avg", comm=comm, async_op=True).get_future().then(unpack))
    if len(futures) == 1 and not small:
        return futures[0]
    def all_done(fut: torch.futures.Future[list[torch.futures.Future[torch.Tensor]]]) -> torch.Tensor:
        for f in fut.wait():
            f.wait()  # raises the first failed all-reduce's error into the future DDP waits on
        return buffer

    done: torch.futures.Future[torch.Tensor] = torch.futures.collect_all(futures).then(all_done)
    return done


# DDP's register_comm_hook compares the annotations of `bucket` and the return value with the real
# objects; under `from __future__ import annotations` they would be strings.
allreduce_hook.__annotations__.update(bucket=dist.GradBucket, state=HookState)
allreduce_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
