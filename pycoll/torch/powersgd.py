"""PowerSGD: a low-rank DDP communication hook whose two small all-reduces go through pycoll.

The algorithm (Vogels et al., "PowerSGD: Practical Low-Rank Gradient Compression", 2019), per bucket:

- Each gradient of the bucket is a *tensor*. A tensor that is 1-D, or whose rank-``r`` form would not
  be at least ``min_compression_rate`` times smaller than itself, is *uncompressed*: all of them are
  concatenated and averaged with one plain all-reduce.
- Every other tensor is a *matrix* ``M`` (n x m: first dimension x the rest), the local gradient plus
  this rank's *residual* (what earlier steps left out). With ``Q`` (m x r, warm-started from the
  previous step): ``P = M Q``, all-reduced (averaged) for all matrices of the bucket at once;
  ``P`` orthogonalized; ``Q = M^T P``, all-reduced (averaged); the average of the ``M`` is then about
  ``P Q^T``, which is written back into the bucket's buffer in place, and ``residual = M - P Q^T``.

All P of a bucket share one flat buffer, and so do all Q, so a bucket costs two all-reduces of
``sum (n + m) r`` elements (plus one for its uncompressed tensors) instead of one of ``sum n m``.

Every rank ends bitwise identical: pycoll's all-reduce results are, and everything after them (the
orthogonalization, ``P Q^T``) is computed from those identical values only. Random numbers (the first
``Q``, and every ``Q`` without warm start) come from a generator seeded by ``(random_seed, bucket
index, iteration)``, the same on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

import pycoll
from pycoll.comm import Communicator
from pycoll.errors import InvalidUsageError
from pycoll.torch.hooks import CommState


@dataclass
class BucketState:
    """What PowerSGD keeps for one bucket (``PowerSGDState.buckets[bucket.index()]``).

    ``signature``: dtype and gradient shapes of the bucket this was made for (a different bucket at
    this index, as after DDP rebuilds its buckets, gets a fresh ``BucketState``). ``compressed``: the
    positions (in ``bucket.gradients()``) of the tensors compressed, ``dims`` their (n, m, r).
    ``p``, ``q``: flat buffers of every matrix's P (n x r) and Q (m x r), in that order. ``residual``:
    flat error feedback of every compressed matrix (n x m), or None without error feedback.
    """

    signature: tuple[Any, ...]
    compressed: tuple[int, ...]
    uncompressed: tuple[int, ...]
    dims: tuple[tuple[int, int, int], ...]
    p: torch.Tensor
    q: torch.Tensor
    residual: torch.Tensor | None

    def p_views(self) -> list[torch.Tensor]:
        return _views(self.p, [(n, r) for n, _m, r in self.dims])

    def q_views(self) -> list[torch.Tensor]:
        return _views(self.q, [(m, r) for _n, m, r in self.dims])

    def residual_views(self) -> list[torch.Tensor]:
        return [] if self.residual is None else _views(self.residual, [(n, m) for n, m, _r in self.dims])


def _views(flat: torch.Tensor, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    out, offset = [], 0
    for rows, cols in shapes:
        out.append(flat[offset : offset + rows * cols].view(rows, cols))
        offset += rows * cols
    return out


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 gradients are compressed in float64; float32 and the half types in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _seed(random_seed: int, index: int, iteration: int) -> int:
    """A seed for torch.Generator, a pure function of its arguments (so the same on every rank)."""
    h = (random_seed * 0x9E3779B97F4A7C15 + index * 0xBF58476D1CE4E5B9 + iteration * 0x94D049BB133111EB)
    h &= (1 << 64) - 1
    h ^= h >> 31
    return h & ((1 << 63) - 1)


class PowerSGDState(CommState):
    """What ``powersgd_hook`` keeps between calls.

    ``comm``: the pycoll communicator (None: pycoll's default one if ``pycoll.init()`` was called, else
    one formed from DDP's default process group on first use). ``rank``: the rank r of the
    approximation (fewer bytes and more error as it shrinks). ``start_iter``: iterations that go
    through a plain averaged all-reduce first (DDP rebuilds its buckets after the first one; the
    first iterations' gradients are also the ones a low-rank form fits worst). ``min_compression_rate``:
    a tensor is compressed only if ``n * m >= min_compression_rate * (n + m) * r``. ``use_error_feedback``:
    keep what the approximation left out and add it to the next step's gradient (a residual per
    bucket, ``bucket.index()``, re-created when the bucket changes). ``warm_start``: start each step's
    power iteration from the previous step's Q (else from a fresh random one).
    ``orthogonalization_epsilon``: with epsilon > 0 (or r <= 2) P is orthogonalized by Gram-Schmidt
    dividing each column by its norm + epsilon (a column of P that is zero, or depends on the earlier
    ones, becomes zero: no NaN); with 0 and r > 2 by Householder QR (such a column becomes some unit
    vector orthogonal to the others: P stays orthonormal). A Q column that is zero or not finite is
    drawn again. ``random_seed``: seeds the random Q, identically on every rank.

    The hook is synchronous: it returns a completed future. Its three all-reduces depend on each other
    and must be issued in the same order on every rank, so they run on the thread DDP calls the hook
    on rather than in future callbacks on pycoll's worker thread.

    Pickles without the communicator (``__getstate__``): save it with a checkpoint and restore it on
    the same ranks to continue with the same P, Q, residuals and iteration count. Into the DDP it was
    saved from (a roll-back) it continues bitwise as before. Into a fresh DDP, whose first iteration
    runs on DDP's initial buckets before it rebuilds them into the saved layout, the buckets that
    differ are averaged uncompressed that once and their saved state is used from the next iteration
    on (``bucket_state``).
    """

    def __init__(
        self,
        comm: Communicator | None = None,
        rank: int = 4,
        start_iter: int = 2,
        min_compression_rate: float = 2.0,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 0,
        random_seed: int = 0,
    ) -> None:
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise InvalidUsageError(f"rank must be an integer >= 1, got {rank!r}")
        if not isinstance(start_iter, int) or isinstance(start_iter, bool) or start_iter < 0:
            raise InvalidUsageError(f"start_iter must be an integer >= 0, got {start_iter!r}")
        if not isinstance(min_compression_rate, (int, float)) or not min_compression_rate >= 0:
            raise InvalidUsageError(
                f"min_compression_rate must be a number >= 0, got {min_compression_rate!r}"
            )
        if not isinstance(orthogonalization_epsilon, (int, float)) or not orthogonalization_epsilon >= 0:
            raise InvalidUsageError(
                f"orthogonalization_epsilon must be a number >= 0, got {orthogonalization_epsilon!r}"
            )
        if not isinstance(random_seed, int) or random_seed < 0:
            raise InvalidUsageError(f"random_seed must be an integer >= 0, got {random_seed!r}")
        self.comm = comm
        self.rank = rank
        self.start_iter = start_iter
        self.min_compression_rate = float(min_compression_rate)
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.orthogonalization_epsilon = float(orthogonalization_epsilon)
        self.random_seed = random_seed
        self.iter = 0
        self.buckets: dict[int, BucketState] = {}
        self._restored_at: int | None = None  # the iteration this state was unpickled at

    def should_compress(self, shape: torch.Size | tuple[int, ...]) -> bool:
        """Whether a gradient of this shape goes through the low-rank path."""
        if len(shape) < 2:
            return False
        n, m = shape[0], _numel(shape[1:])
        r = min(n, m, self.rank)
        return r > 0 and n * m >= self.min_compression_rate * (n + m) * r

    def residuals(self, bucket_index: int) -> list[torch.Tensor | None]:
        """The error-feedback residual of each gradient of a bucket (in ``bucket.gradients()`` order),
        as an n x m matrix; None where the gradient is not compressed (or there is no error feedback)."""
        b = self.buckets.get(bucket_index)
        if b is None:
            return []
        out: list[torch.Tensor | None] = [None] * len(b.signature[1])
        if b.residual is not None:
            for pos, res in zip(b.compressed, b.residual_views()):
                out[pos] = res
        return out

    def bucket_state(self, index: int, gradients: list[torch.Tensor]) -> BucketState | None:
        """The state of bucket ``index``, made (zero residual, random Q) when new or when it changed.

        None in the first iteration after unpickling when the bucket differs from the saved one: a
        fresh DDP's first iteration runs on its initial buckets, which it then rebuilds into the layout
        the saved state was made for. That bucket is averaged uncompressed once and the saved state is
        kept for the next iteration instead of being lost.
        """
        dtype = gradients[0].dtype if gradients else torch.float32
        signature = (str(dtype), tuple(tuple(g.shape) for g in gradients))
        b = self.buckets.get(index)
        if b is not None and b.signature == signature:
            return b
        if b is not None and self._restored_at == self.iter:
            return None
        compressed = tuple(i for i, g in enumerate(gradients) if self.should_compress(g.shape))
        uncompressed = tuple(i for i in range(len(gradients)) if i not in set(compressed))
        dims = []
        for i in compressed:
            n, m = gradients[i].shape[0], gradients[i].numel() // gradients[i].shape[0]
            dims.append((n, m, min(n, m, self.rank)))
        cdtype = _compute_dtype(dtype)
        b = BucketState(
            signature=signature,
            compressed=compressed,
            uncompressed=uncompressed,
            dims=tuple(dims),
            p=torch.zeros(sum(n * r for n, _m, r in dims), dtype=cdtype),
            q=torch.zeros(sum(m * r for _n, m, r in dims), dtype=cdtype),
            residual=torch.zeros(sum(n * m for n, m, _r in dims), dtype=cdtype)
            if self.use_error_feedback
            else None,
        )
        self._randomize(b, index, everything=True)
        self.buckets[index] = b
        return b

    def _randomize(self, b: BucketState, index: int, everything: bool) -> None:
        """Fills Q with standard normal values: all of it, or only the columns that are all zero or not
        finite (a Q column that became zero would otherwise stay zero for good under warm start)."""
        gen: torch.Generator | None = None
        for q in b.q_views():
            if everything:
                cols = None
            else:
                dead = ~(q.isfinite().all(dim=0) & q.ne(0).any(dim=0))
                if not bool(dead.any()):
                    continue
                cols = dead
            if gen is None:
                gen = torch.Generator().manual_seed(_seed(self.random_seed, index, self.iter))
            values = torch.randn(q.shape, generator=gen, dtype=q.dtype)
            if cols is None:
                q.copy_(values)
            else:
                q[:, cols] = values[:, cols]

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_restored_at", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._restored_at = self.iter


def _numel(shape: torch.Size | tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _orthogonalize(p: torch.Tensor, epsilon: float) -> None:
    """Makes the columns of ``p`` (n x r, r <= n) orthonormal, in place. Deterministic: the same input
    gives the same bits, so ranks holding the same all-reduced P stay identical."""
    r = p.shape[1]
    if epsilon == 0 and r > 2:
        # Householder QR: numerically better than Gram-Schmidt, and a zero column gives no NaN.
        q, _ = torch.linalg.qr(p, mode="reduced")
        p.copy_(q)
        return
    # Modified Gram-Schmidt (each normalized column is removed from the ones after it), with a second
    # projection of each column against the earlier ones ("twice is enough", Kahan-Parlett): where P is
    # (nearly) rank-deficient, what the first pass leaves of a column is mostly rounding error, far from
    # orthogonal to the earlier columns. If the second pass removes more than half of what was left,
    # the column depended on the earlier ones and becomes zero (it would add no direction, only error).
    for i in range(r):
        col = p[:, i : i + 1]
        norm = torch.linalg.vector_norm(col)
        if i > 0 and bool(norm > 0):
            done = p[:, :i]
            col.sub_(done @ (done.T @ col))
            again = torch.linalg.vector_norm(col)
            norm = again if bool(again >= 0.5 * norm) else torch.zeros_like(norm)
        if not bool(norm > 0):
            col.zero_()
            continue  # a zero column removes nothing from the others
        col.div_(norm + epsilon)
        if i + 1 < r:
            rest = p[:, i + 1 :]
            rest.sub_(col @ (col.T @ rest))


def _completed(value: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    fut.set_result(value)
    return fut


def _plain_average(
    state: PowerSGDState, bucket: dist.GradBucket, comm: Communicator
) -> torch.futures.Future[torch.Tensor]:
    work = pycoll.allreduce(bucket.buffer(), "avg", comm=comm, async_op=True)
    if bucket.is_last():
        state.iter += 1
    fut: torch.futures.Future[torch.Tensor] = work.get_future()
    return fut


def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients over the ranks with PowerSGD (see the module docstring); a plain
    averaged all-reduce before ``state.start_iter``. Writes the result into ``bucket.buffer()`` in
    place and returns a future holding that buffer."""
    buffer = bucket.buffer()
    comm = state.communicator()
    if state.iter < state.start_iter:
        return _plain_average(state, bucket, comm)
    gradients = bucket.gradients()
    index = bucket.index()
    b = state.bucket_state(index, gradients)
    if b is None or not b.compressed:
        return _plain_average(state, bucket, comm)

    # The uncompressed tensors: one all-reduce of their concatenation, in flight while P is computed.
    plain = [gradients[i] for i in b.uncompressed]
    flat = torch.cat([g.reshape(-1) for g in plain]) if plain else None
    flat_work = pycoll.allreduce(flat, "avg", comm=comm, async_op=True) if flat is not None else None

    if state.warm_start:
        state._randomize(b, index, everything=False)
    else:
        state._randomize(b, index, everything=True)
    cdtype = b.p.dtype
    ps, qs, residuals = b.p_views(), b.q_views(), b.residual_views()
    matrices: list[torch.Tensor] = []
    for k, pos in enumerate(b.compressed):
        n, m, _r = b.dims[k]
        g = gradients[pos].reshape(n, m)  # a view when the gradient is contiguous
        if residuals:
            matrices.append(residuals[k].add_(g))  # the residual now holds M = gradient + residual
        else:
            matrices.append(g if g.dtype == cdtype else g.to(cdtype))

    # P = M Q, averaged; orthogonalized.
    for mat, p, q in zip(matrices, ps, qs):
        torch.matmul(mat, q, out=p)
    pycoll.allreduce(b.p, "avg", comm=comm)
    for p in ps:
        _orthogonalize(p, state.orthogonalization_epsilon)
    # Q = M^T P, averaged: the average of the M is about P Q^T.
    for mat, p, q in zip(matrices, ps, qs):
        torch.matmul(mat.T, p, out=q)
    pycoll.allreduce(b.q, "avg", comm=comm)

    for k, pos in enumerate(b.compressed):
        grad = gradients[pos]
        approx = ps[k] @ qs[k].T
        if residuals:
            residuals[k].sub_(approx)
        grad.copy_(approx.view(grad.shape))

    if flat_work is not None and flat is not None:
        flat_work.wait()
        offset = 0
        for g in plain:
            g.copy_(flat[offset : offset + g.numel()].view(g.shape))
            offset += g.numel()

    if bucket.is_last():
        state.iter += 1
    return _completed(buffer)


# DDP's register_comm_hook compares the hook's annotations with the objects themselves, and the
# ``from __future__ import annotations`` above makes them strings: give it the objects.
powersgd_hook.__annotations__ = {
    "state": PowerSGDState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}
