"""``Options``: what a ``"pycoll"`` process group compresses, passed as ``pg_options=``.

    dist.init_process_group("pycoll", pg_options=pycoll.torch.Options(compression="int8"))
    tp = dist.new_group(ranks, backend="pycoll", pg_options=pycoll.torch.Options())  # lossless

The codec rule (one place: ``Options.codec_for``): an all-reduce or reduce-scatter compresses when the
group has a codec, the tensor has at least ``min_numel`` elements, its dtype is one the codecs take
(float32, float16, bfloat16) and the op is SUM, AVG or PREMUL_SUM. An all-gather into a tensor
(``all_gather_into_tensor``, FSDP2's weights) compresses only when opted in with
``all_gather_compression``, under the same size and dtype rule: each rank's chunk is encoded once and
every rank decodes the same bytes (ZeRO++'s qwZ). ``all_to_all_single`` (MoE dispatch and combine)
compresses only when opted in with ``all_to_all_compression``, under the dtype rule (not ``min_numel``:
the ranks' inputs differ in size): each part is encoded once by its sender and decoded once by its
receiver, a rank's own part copied exactly.
Everything else (integers, uint8, bool, float64, MIN/MAX/PRODUCT/bitwise, other gathers, the list
all-to-all, broadcasts, send/recv) stays lossless.

Error feedback (``error_feedback=True``, the default with a codec): what compression lost on a tensor
is kept in a float32 residual and added to that tensor's next all-reduce. A residual belongs to the
tensor's storage (keyed by its data pointer, element offset, element count and dtype) and lives as long
as that storage does: each entry holds a weak reference to the storage, and once the storage is freed
its residual is dropped, so a new tensor the allocator places at the same address starts from zeros
instead of inheriting a stranger's residual. DDP all-reduces each gradient bucket in the same bucket
buffer every step, so each bucket keeps its residual (DDP rebuilds its buckets once, after the first
step: the new buffers start from zeros). FSDP2 reduce-scatters from a buffer it allocates and frees
each step, so there residuals keyed by storage start from zeros every step; pycoll.torch.fsdp gives
each FSDP module a reduce-scatter whose residual belongs to the module instead (``for_owner``). At
most ``max_residuals`` residuals are kept, the least recently used dropped first.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Union

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from pycoll.compression import CODEC_DTYPES, Codec, get_codec
from pycoll.errors import InvalidUsageError

_CODEC_DTYPES = {getattr(torch, name) for name in CODEC_DTYPES}


class Options:
    """Per-group settings of the pycoll backend (``pg_options=`` of init_process_group / new_group).

    ``compression``: None (default: lossless, results equal gloo's to rounding), "fp16", "bf16", "int8",
    "int4", or a ``pycoll.compression`` codec (a user codec included). ``error_feedback``: keep a residual
    per tensor storage (module docstring). ``min_numel``: tensors with fewer elements go uncompressed
    (the DDP hook's rule). ``algorithm``: the all-reduce algorithm ("auto": the cost model's choice).
    ``max_residuals``: how many residuals error feedback keeps at most. ``all_gather_compression``: the
    codec of ``all_gather_into_tensor`` (None, the default: lossless), e.g. FSDP2's weight all-gather.
    ``all_to_all_compression``: the codec of ``all_to_all_single`` (None, the default: lossless), e.g.
    MoE token dispatch; no error feedback (each call moves other tokens).
    """

    def __init__(
        self,
        compression: Union[str, Codec, None] = None,
        *,
        error_feedback: bool = True,
        min_numel: int = 1024,
        algorithm: str = "auto",
        max_residuals: int = 256,
        all_gather_compression: Union[str, Codec, None] = None,
        all_to_all_compression: Union[str, Codec, None] = None,
    ) -> None:
        if not isinstance(min_numel, int) or min_numel < 0:
            raise InvalidUsageError(f"min_numel must be an integer >= 0, got {min_numel!r}")
        if not isinstance(max_residuals, int) or max_residuals < 1:
            raise InvalidUsageError(f"max_residuals must be an integer >= 1, got {max_residuals!r}")
        if not isinstance(algorithm, str):
            raise InvalidUsageError(f"algorithm must be a string, got {algorithm!r}")
        self.codec: Codec | None = get_codec(compression)
        self.error_feedback = bool(error_feedback)
        self.min_numel = min_numel
        self.algorithm = algorithm
        self.max_residuals = max_residuals
        self.all_gather_codec: Codec | None = get_codec(all_gather_compression)
        self.all_to_all_codec: Codec | None = get_codec(all_to_all_compression)

    def codec_for(self, tensor: torch.Tensor, op: str, numel: int | None = None) -> Codec | None:
        """The codec this reduction of ``tensor`` (or of ``numel`` elements of its dtype) goes through,
        or None (lossless): the rule of the module docstring."""
        if op not in ("sum", "avg"):
            return None
        return self._sized(self.codec, tensor, tensor.numel() if numel is None else numel)

    def all_gather_codec_for(self, tensor: torch.Tensor) -> Codec | None:
        """The codec an ``all_gather_into_tensor`` of ``tensor`` (a rank's input) goes through, or None."""
        return self._sized(self.all_gather_codec, tensor, tensor.numel())

    def all_to_all_codec_for(self, tensor: torch.Tensor) -> Codec | None:
        """The codec an ``all_to_all_single`` of ``tensor`` (a rank's input) goes through, or None: the
        dtype rule only, not ``min_numel``: with uneven parts the ranks' inputs differ in size, and every
        rank must choose alike."""
        codec = self.all_to_all_codec
        return codec if codec is not None and tensor.dtype in _CODEC_DTYPES else None

    def _sized(self, codec: Codec | None, tensor: torch.Tensor, numel: int) -> Codec | None:
        """``codec`` where the size and dtype rule lets it compress ``numel`` elements of ``tensor``'s."""
        if codec is None or numel < self.min_numel or tensor.dtype not in _CODEC_DTYPES:
            return None
        return codec

    def __repr__(self) -> str:
        codec = "none" if self.codec is None else repr(self.codec)
        ag = self.all_gather_codec
        gather = "" if ag is None else f", all_gather_compression={ag!r}"
        if self.all_to_all_codec is not None:
            gather += f", all_to_all_compression={self.all_to_all_codec!r}"
        return (
            f"pycoll.torch.Options(compression={codec}, error_feedback={self.error_feedback}, "
            f"min_numel={self.min_numel}, algorithm={self.algorithm!r}{gather})"
        )


class Residuals:
    """Error-feedback residuals of one process group, one per live tensor storage (``for_tensor``) or per
    live owner object (``for_owner``: an FSDP2 module's reduce-scatter, pycoll.torch.fsdp), least
    recently used dropped first (see the module docstring)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        # key -> (whether what it belongs to is gone, the residual)
        self._by_key: OrderedDict[tuple[Any, ...], tuple[Callable[[], bool], torch.Tensor]] = OrderedDict()

    @staticmethod
    def key(tensor: torch.Tensor) -> tuple[Any, ...]:
        storage = tensor.untyped_storage()
        return (tensor.device, storage.data_ptr(), tensor.storage_offset(), tensor.numel(), tensor.dtype)

    def for_tensor(self, tensor: torch.Tensor, numel: int) -> torch.Tensor:
        """The residual of ``tensor``'s storage: ``numel`` float32 elements (one per element reduced);
        zeros when new."""
        return self._get(
            (*self.key(tensor), numel), lambda: StorageWeakRef(tensor.untyped_storage()).expired, numel,
            tensor.device,
        )  # fmt: skip

    def for_owner(self, owner: object, numel: int, device: torch.device) -> torch.Tensor:
        """The residual that ``owner`` keeps (as long as it lives) for reductions of ``numel`` elements,
        whatever buffer they come from; zeros when new."""
        def expired() -> Callable[[], bool]:
            ref = weakref.ref(owner)
            return lambda: ref() is None

        return self._get(("owner", id(owner), device, numel), expired, numel, device)

    @property
    def limit(self) -> int:
        return self._limit

    def _get(
        self, key: tuple[Any, ...], expired: Callable[[], Callable[[], bool]], numel: int, device: Any
    ) -> torch.Tensor:
        """The residual under ``key``, or a new one of zeros whose entry ``expired()`` (made only then)
        says when what it belongs to is gone."""
        with self._lock:
            entry = self._by_key.get(key)
            if entry is not None and not entry[0]():
                self._by_key.move_to_end(key)
                return entry[1]
            for stale in [k for k, (gone, _) in self._by_key.items() if gone()]:
                del self._by_key[stale]  # what they belonged to is gone (one may have had this key)
            residual = torch.zeros(numel, dtype=torch.float32, device=device)
            self._by_key[key] = (expired(), residual)
            while len(self._by_key) > self._limit:
                self._by_key.popitem(last=False)
            return residual

    def __len__(self) -> int:
        return len(self._by_key)
