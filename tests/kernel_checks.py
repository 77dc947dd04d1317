"""The CUDA kernels against the CPU loops, bit for bit: the checks that need no real device, run by
``tests/gpu/test_kernels.py`` on a GPU and by ``tests/unit/test_emulated_kernels.py`` on the CPU emulation
of the same kernels (``pycoll.testing.emulated_kernels``). Each test file subclasses :class:`KernelChecks`
and gives it a ``kernels`` fixture: a :class:`Kernels` backend (buffers and the three raw-pointer calls).

Reduce: every dtype x op, against ``_C.testing.cpu_reduce``. Codecs: fp16, bf16, int8 and int4 (several block
sizes, nearest and stochastic rounding) against the CPU codecs of ``_C.builtin_codec``: encoded bytes,
the second copy (out2), decoded values, updated residuals, decode, decode-accumulate (acc, residual,
divisor, in place). Always on fresh random data of awkward sizes (0, 1, 7, block - 1, block + 1,
1000003) with NaN / Inf / zero / subnormal / tie blocks, at aligned and misaligned addresses (so both the
16-byte vector path and the scalar path run), with every output poisoned with 0xFF bytes first and
guard bytes around it that must stay untouched.

"Bit for bit" has one exception, NaN payloads: a NaN that arithmetic produces is the canonical
0x7fffffff on a GPU, while x86 keeps an operand's payload (or makes 0xffc00000). So an element that is
NaN on the CPU must be NaN on the GPU, with any payload; every other element must have the same bits.
The CPU emulation of the kernels needs the exception too: its scalar code and the CPU's vector loops may
take the payload of a different one of two NaN operands (x86 keeps the first; the compilers order them).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import pytest

from pycoll import _C
from pycoll.arrays import DTYPE_CODES, OP_CODES
from pycoll.compression.codecs import KIND_CODES, ROUNDING_CODES, SCALE_BYTES
from pycoll.errors import InvalidUsageError

F32 = np.float32
POISON = 0xFF
GUARD = 64  # bytes before and after every buffer that must keep their poison
LARGE = 1_000_003

STORAGE = {"float32": np.float32, "float64": np.float64, "float16": np.uint16, "bfloat16": np.uint16,
           "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "int8": np.int8}
BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


# ---- backends ------------------------------------------------------------------------------------------

class Buf(Protocol):
    """``nbytes`` of kernel-visible memory at byte ``offset`` from a 256-byte aligned allocation, with
    poisoned guard bytes on both sides."""

    nbytes: int

    @property
    def ptr(self) -> int: ...

    def get(self, dtype: Any = np.uint8) -> np.ndarray:
        """A copy of the contents, after checking that both guards kept their poison."""
        ...


class Kernels(Protocol):
    """The memory the kernels run on and the calls of ``pycoll._C.cuda`` (without the stream argument)."""

    def buf(self, nbytes: int, offset: int = 0, fill: np.ndarray | None = None,
            poison: int = POISON) -> Buf: ...

    def reduce(self, dtype: int, op: int, dst: int, dst2: int, a: int, b: int, n: int,
               avg_divisor: int) -> None: ...

    def encode(self, kind: int, block: int, rounding: int, src: int, out: int, n: int, **kw: Any) -> None: ...

    def decode(self, kind: int, block: int, rounding: int, data: int, dst: int, n: int,
               **kw: Any) -> None: ...

    def rotate(self, x: int, n: int, part: int, block: int, inverse: bool) -> None: ...


def check_guards(host: np.ndarray, lo: int, nbytes: int, poison: int, offset: int) -> np.ndarray:
    """The ``nbytes`` at ``lo`` of ``host`` (a buffer's whole allocation), after its guards' check."""
    where = f"buffer at offset {offset}"
    assert (host[:lo] == poison).all(), f"{where}: a kernel wrote before the start"
    assert (host[lo + nbytes:] == poison).all(), f"{where}: a kernel wrote past the end"
    return host[lo:lo + nbytes].copy()


class HostBuf:
    """A :class:`Buf` in host memory (numpy), for the emulated kernels."""

    def __init__(self, nbytes: int, offset: int = 0, fill: np.ndarray | None = None, poison: int = POISON):
        self.nbytes, self.offset, self.poison = nbytes, offset, poison
        total = GUARD + offset + nbytes + GUARD
        raw = np.full(total + 256, poison, dtype=np.uint8)
        start = (-raw.ctypes.data) % 256
        self.mem = raw[start:start + total]
        self.lo = GUARD + offset
        if fill is not None and nbytes:
            data = np.ascontiguousarray(fill).view(np.uint8).reshape(-1)
            assert data.size == nbytes
            self.mem[self.lo:self.lo + nbytes] = data

    @property
    def ptr(self) -> int:
        return int(self.mem.ctypes.data) + self.lo

    def get(self, dtype: Any = np.uint8) -> np.ndarray:
        return check_guards(self.mem, self.lo, self.nbytes, self.poison, self.offset).view(dtype)


# ---- comparisons ---------------------------------------------------------------------------------------

def nan_mask(bits: np.ndarray, fmt: str) -> np.ndarray:
    if fmt == "f32":
        return (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    if fmt == "f64":
        return (bits & np.uint64(0x7FFFFFFFFFFFFFFF)) > np.uint64(0x7FF0000000000000)
    if fmt == "f16":
        return (bits & np.uint16(0x7FFF)) > np.uint16(0x7C00)
    if fmt == "bf16":
        return (bits & np.uint16(0x7FFF)) > np.uint16(0x7F80)
    return np.zeros(bits.shape, dtype=bool)


def assert_same(gpu: np.ndarray, cpu: np.ndarray, fmt: str, what: str) -> None:
    """Same bits, except that NaN matches NaN. An element still holding the poison (all ones) on the GPU
    must hold it on the CPU too: NaN-matching must not hide an element the kernel never wrote."""
    gpu, cpu = np.ascontiguousarray(gpu), np.ascontiguousarray(cpu)
    assert gpu.shape == cpu.shape, f"{what}: shape {gpu.shape} vs {cpu.shape}"
    if gpu.size == 0:
        return
    ut = BITS[gpu.dtype.itemsize]
    g, c = gpu.view(ut), cpu.view(ut)
    poison = ut(np.iinfo(ut).max)
    unwritten = np.flatnonzero((g == poison) & (c != poison))
    assert unwritten.size == 0, f"{what}: {unwritten.size} elements not written, first at {unwritten[0]}"
    bad = np.flatnonzero((g != c) & ~(nan_mask(g, fmt) & nan_mask(c, fmt)))
    if bad.size:
        i = int(bad[0])
        raise AssertionError(f"{what}: {bad.size} of {g.size} differ; first at {i}: gpu {gpu[i]!r} "
                             f"(0x{int(g[i]):x}) vs cpu {cpu[i]!r} (0x{int(c[i]):x})")


def float_fmt(dtype: str) -> str:
    return {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}.get(dtype, "int")


# ---- reduce ----------------------------------------------------------------------------------------------

REDUCE_SIZES = [0, 1, 7, 33, 4099, LARGE]
# element offsets of (dst, a, b): all aligned (vector path), all one element off (scalar head, then
# vectors), disagreeing (scalar path throughout)
REDUCE_OFFSETS = [(0, 0, 0), (1, 1, 1), (0, 1, 2)]


def reduce_inputs(dtype: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Values of the dtype's storage type: ordinary numbers and, mixed in, raw random bit patterns
    (so NaN, Inf, subnormals and -0 for the floats, extremes that wrap for the integers)."""
    st = np.dtype(STORAGE[dtype])
    raw = rng.integers(0, 256, size=n * st.itemsize, dtype=np.uint8).view(st)
    if dtype in ("float32", "float64"):
        nice = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)).astype(st)
    elif dtype == "float16":
        nice = (rng.standard_normal(n) * 100).astype(np.float16).view(np.uint16)
    elif dtype == "bfloat16":
        nice = (rng.standard_normal(n).astype(F32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    else:
        nice = rng.integers(-20 if st.kind == "i" else 0, 20, n).astype(st)
    return np.where(rng.random(n) < 0.3, raw, nice).astype(st)


def run_reduce(k: Kernels, dtype: str, op: str, n: int, offsets: tuple[int, int, int], with_dst2: bool,
               divisor: int, rng: np.random.Generator) -> None:
    st = np.dtype(STORAGE[dtype])
    es = st.itemsize
    a, b = reduce_inputs(dtype, n, rng), reduce_inputs(dtype, n, rng)
    da = k.buf(n * es, offsets[1] * es, a)
    db = k.buf(n * es, offsets[2] * es, b)
    dd = k.buf(n * es, offsets[0] * es)
    dd2 = k.buf(n * es, offsets[0] * es) if with_dst2 else None
    k.reduce(DTYPE_CODES[dtype], OP_CODES[op], dd.ptr, dd2.ptr if dd2 else 0, da.ptr, db.ptr, n, divisor)
    want = np.empty_like(a)
    _C.testing.cpu_reduce(DTYPE_CODES[dtype], OP_CODES[op], want, a, b, divisor)
    where = f"reduce {dtype} {op} n={n} offsets={offsets} divisor={divisor}"
    assert_same(dd.get(st), want, float_fmt(dtype), where)
    if dd2:
        assert_same(dd2.get(st), want, float_fmt(dtype), where + " (dst2)")


# ---- codecs ------------------------------------------------------------------------------------------------

class Spec:
    def __init__(self, kind: str, block: int = 0, rounding: str = "nearest"):
        self.kind, self.block, self.rounding = kind, block, rounding
        self.cpu = _C.builtin_codec(KIND_CODES[kind], max(block, 8), ROUNDING_CODES[rounding])

    @property
    def args(self) -> tuple[int, int, int]:
        return KIND_CODES[self.kind], self.block, ROUNDING_CODES[self.rounding]

    @property
    def cast(self) -> bool:
        return self.kind in ("fp16", "bf16")

    def __repr__(self) -> str:
        return f"{self.kind}" + ("" if self.cast else f"-{self.block}-{self.rounding}")


SPECS = [Spec("fp16"), Spec("bf16")]
SPECS += [Spec("int8", b) for b in (8, 24, 64, 256, 4096)] + [Spec("int4", b) for b in (8, 24, 32, 256, 4096)]
SPECS += [Spec("int8", b, "stochastic") for b in (8, 64, 264)]
SPECS += [Spec("int4", b, "stochastic") for b in (16, 32, 4096)]
ARBITRARY = [Spec("int8", 8), Spec("int4", 8), Spec("int4", 24), Spec("fp16"), Spec("bf16")]


def codec_sizes(spec: Spec) -> list[int]:
    b = 16 if spec.cast else spec.block
    return sorted({0, 1, 7, b - 1, b + 1, 3 * b + 5}) + [LARGE]


def codec_data(n: int, block: int, rng: np.random.Generator) -> np.ndarray:
    """Per block (of `block` elements): gaussian at scales from 1e-38 to 1e38 (some overflowing to Inf),
    all zeros (some -0), exact ties of the int8 / int4 grids, float32 subnormals, fp16 / bf16 rounding
    ties, or a block poisoned with one NaN, +Inf or -Inf."""
    if n == 0:
        return np.zeros(0, F32)
    nb = -(-n // block)
    kind = np.repeat(rng.integers(0, 9, nb), block)[:n]
    scale = np.repeat(10.0 ** rng.uniform(-38, 38.6, nb), block)[:n]
    g = rng.standard_normal(n)
    with np.errstate(over="ignore"):
        x = (g * scale).astype(F32)
    x[kind == 1] = np.where(rng.random(int((kind == 1).sum())) < 0.2, F32(-0.0), F32(0.0))
    qmax = np.repeat(np.where(rng.random(nb) < 0.5, 127, 7), block)[:n]
    ties = (rng.integers(-254, 255, n) / 2.0).clip(-qmax, qmax)
    starts = np.zeros(n, dtype=bool)
    starts[::block] = True
    ties = np.where(starts, qmax, ties)  # absmax = qmax: step 1, codes land on exact halves
    x = np.where(kind == 2, ties.astype(F32), x)
    sub = (rng.integers(1, 1 << 23, n, dtype=np.uint32) | (rng.integers(0, 2, n, dtype=np.uint32) << 31))
    x = np.where(kind == 3, sub.view(F32), x)
    tie_bits = (rng.integers(0x38800000, 0x47000000, n, dtype=np.uint32) & ~np.uint32(0xFFFF))
    tie_bits |= np.where(rng.random(n) < 0.5, np.uint32(0x1000), np.uint32(0x8000))
    x = np.where(kind == 4, tie_bits.view(F32), x)
    poisoned = np.flatnonzero(kind == 5)
    if poisoned.size:
        pick = poisoned[rng.random(poisoned.size) < 2.0 / block + 0.01]
        x[pick] = rng.choice(np.array([np.nan, np.inf, -np.inf], dtype=F32), pick.size)
    # an unusual NaN payload too
    if n > 10:
        x[rng.integers(0, n)] = np.uint32(0xFFA00001).view(F32)
    return np.ascontiguousarray(x, dtype=F32)


def scale_positions(spec: Spec, n: int) -> np.ndarray:
    """Byte offsets of the float32 scales in an int8 / int4 encoding of n elements."""
    full, rest = divmod(n, spec.block)
    block_bytes = spec.cpu.block_bytes
    return np.arange(full + (1 if rest else 0), dtype=np.int64) * block_bytes


def assert_same_encoding(spec: Spec, n: int, gpu: np.ndarray, cpu: np.ndarray, what: str) -> None:
    if spec.cast:
        assert_same(gpu.view(np.uint16), cpu.view(np.uint16), spec.kind.replace("fp", "f"), what)
        return
    pos = scale_positions(spec, n)
    idx = (pos[:, None] + np.arange(SCALE_BYTES)).reshape(-1)
    g_scale = np.ascontiguousarray(gpu[idx]).view(F32)
    c_scale = np.ascontiguousarray(cpu[idx]).view(F32)
    assert_same(g_scale, c_scale, "f32", what + " (scales)")
    payload = np.ones(gpu.size, dtype=bool)
    payload[idx] = False
    bad = np.flatnonzero(gpu[payload] != cpu[payload])
    if bad.size:
        i = int(np.flatnonzero(payload)[bad[0]])
        raise AssertionError(f"{what}: {bad.size} payload bytes differ; first at byte {i}: gpu {gpu[i]} "
                             f"vs cpu {cpu[i]}")


# Encode variants: (residual scale or None, decoded: False / True / "alias" (over src), out2, float
# element offset, byte offset of out)
ENCODE_VARIANTS = [
    (None, False, False, 0, 0),
    (None, True, True, 1, 2),
    (1.0, True, False, 0, 1),
    (0.5, False, True, 3, 2),
    (1.0, "alias", True, 0, 3),
    (1.0, True, True, 2, 0),
]


def run_encode(k: Kernels, spec: Spec, x: np.ndarray, variant: tuple, index: int, key: int,
               poison: int = POISON) -> None:
    scale, decoded, with_out2, foff, boff = variant
    n = x.size
    nbytes = spec.cpu.encoded_bytes(n)
    rng = np.random.default_rng(n + foff)
    residual = None
    if scale is not None:  # residuals of the size error feedback leaves behind
        with np.errstate(invalid="ignore", over="ignore"):
            residual = (rng.standard_normal(n) * np.abs(x).clip(0, 1e30) * 1e-3).astype(F32)
        residual[~np.isfinite(residual)] = 0
    # the CPU
    want_out = np.empty(nbytes, dtype=np.uint8)
    want_res = residual.copy() if residual is not None else None
    src_cpu = x.copy()
    want_dec = src_cpu if decoded == "alias" else np.empty(n, dtype=F32)
    spec.cpu.encode(src_cpu, want_out, residual=want_res, residual_scale=scale or 1.0,
                    decoded=want_dec if decoded else None, index=index, key=key)
    # the kernels
    d_src = k.buf(4 * n, 4 * foff, x)
    d_out = k.buf(nbytes, boff, poison=poison)
    d_out2 = k.buf(nbytes, boff + 64, poison=poison) if with_out2 else None
    d_res = k.buf(4 * n, 4 * foff + 256, residual) if residual is not None else None
    d_dec = d_src if decoded == "alias" else (k.buf(4 * n, 4 * foff + 512) if decoded else None)
    k.encode(*spec.args, d_src.ptr, d_out.ptr, n, residual=d_res.ptr if d_res else 0,
             residual_scale=scale or 1.0, decoded=d_dec.ptr if d_dec else 0,
             out2=d_out2.ptr if d_out2 else 0, index=index, key=key)
    where = f"encode {spec} n={n} variant={variant} index={index}"
    out = d_out.get()
    assert_same_encoding(spec, n, out, want_out, where)
    if d_out2:
        assert np.array_equal(d_out2.get(), out), f"{where}: out2 differs from out"
    if d_res:
        assert_same(d_res.get(F32), want_res, "f32", where + " residual")
    if decoded:
        assert_same(d_dec.get(F32), want_dec, "f32", where + " decoded")
    if decoded != "alias":
        assert np.array_equal(d_src.get(F32).view(np.uint32), x.view(np.uint32)), f"{where}: src changed"


# Decode variants: (acc: None / "sep" / "alias" (acc is dst), residual, divisor, float offset, byte offset)
DECODE_VARIANTS = [
    (None, False, 0, 0, 0),
    ("sep", False, 0, 1, 0),
    ("sep", True, 3, 0, 1),
    ("alias", True, 0, 2, 3),
    ("alias", False, 7, 0, 2),
    (None, False, 4, 1, 2),
    ("sep", True, 0, 3, 0),
]


def run_decode(k: Kernels, spec: Spec, data: np.ndarray, n: int, variant: tuple,
               rng: np.random.Generator) -> None:
    acc_mode, with_res, divisor, foff, boff = variant
    acc = (rng.standard_normal(n) * 100).astype(F32) if acc_mode else None
    if acc is not None and n > 4:
        acc[:2] = [np.nan, -0.0]
    res = (rng.standard_normal(n)).astype(F32) if with_res else None
    want = np.empty(n, dtype=F32)
    want_res = res.copy() if res is not None else None
    if acc_mode == "alias":
        want[:] = acc
        spec.cpu.decode(data, want, acc=want, residual=want_res, divisor=divisor)
    else:
        spec.cpu.decode(data, want, acc=acc, residual=want_res, divisor=divisor)
    d_in = k.buf(data.size, boff, data)
    d_acc = k.buf(4 * n, 4 * foff + 256, acc) if acc_mode == "sep" else None
    d_dst = k.buf(4 * n, 4 * foff, acc if acc_mode == "alias" else None)
    d_res = k.buf(4 * n, 4 * foff + 512, res) if res is not None else None
    acc_ptr = d_acc.ptr if d_acc else (d_dst.ptr if acc_mode == "alias" else 0)
    k.decode(*spec.args, d_in.ptr, d_dst.ptr, n, acc=acc_ptr, residual=d_res.ptr if d_res else 0,
             divisor=divisor)
    where = f"decode {spec} n={n} variant={variant}"
    assert_same(d_dst.get(F32), want, "f32", where)
    if d_res:
        assert_same(d_res.get(F32), want_res, "f32", where + " residual")
    assert np.array_equal(d_in.get(), data), f"{where}: the encoding changed"


# ---- the checks ------------------------------------------------------------------------------------------


class KernelChecks:
    """The kernels' checks, for any :class:`Kernels` backend: a subclass named ``Test...`` provides the
    ``kernels`` fixture."""

    # -- reduce
    @pytest.mark.parametrize("op", list(OP_CODES))
    @pytest.mark.parametrize("dtype", list(DTYPE_CODES))
    def test_reduce_matches_cpu(self, kernels: Kernels, dtype: str, op: str) -> None:
        rng = np.random.default_rng([DTYPE_CODES[dtype], OP_CODES[op], 1])
        divisor = 3 if op == "avg" else 0
        for n in REDUCE_SIZES:
            for k, offsets in enumerate(REDUCE_OFFSETS):
                run_reduce(kernels, dtype, op, n, offsets, with_dst2=(k + n) % 2 == 1, divisor=divisor,
                           rng=rng)

    @pytest.mark.parametrize("dtype", list(DTYPE_CODES))
    def test_reduce_divisor_applies_to_every_op(self, kernels: Kernels, dtype: str) -> None:
        """As on the CPU, avg_divisor > 0 divides whatever the op (the finalize step of an average)."""
        rng = np.random.default_rng([DTYPE_CODES[dtype], 2])
        for op in ("max", "prod", "min"):
            run_reduce(kernels, dtype, op, 4099, (0, 0, 0), with_dst2=True, divisor=5, rng=rng)

    @pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
    def test_reduce_in_place(self, kernels: Kernels, dtype: str) -> None:
        """dst may alias a (the executor's receive-reduce into its own buffer)."""
        rng = np.random.default_rng([DTYPE_CODES[dtype], 3])
        st = np.dtype(STORAGE[dtype])
        for n, off in ((LARGE, 0), (4099, 1)):
            a, b = reduce_inputs(dtype, n, rng), reduce_inputs(dtype, n, rng)
            da, db = kernels.buf(n * st.itemsize, off * st.itemsize, a), kernels.buf(n * st.itemsize, 0, b)
            kernels.reduce(DTYPE_CODES[dtype], OP_CODES["sum"], da.ptr, 0, da.ptr, db.ptr, n, 0)
            want = np.empty_like(a)
            _C.testing.cpu_reduce(DTYPE_CODES[dtype], OP_CODES["sum"], want, a, b)
            assert_same(da.get(st), want, float_fmt(dtype), f"in-place reduce {dtype} n={n}")

    # -- codecs
    @pytest.mark.parametrize("spec", SPECS, ids=repr)
    def test_encode_matches_cpu(self, kernels: Kernels, spec: Spec) -> None:
        rng = np.random.default_rng([KIND_CODES[spec.kind], spec.block, ROUNDING_CODES[spec.rounding]])
        block = 16 if spec.cast else spec.block
        for n in codec_sizes(spec):
            x = codec_data(n, block, rng)
            key = int(rng.integers(0, 2**32))
            for k, variant in enumerate(ENCODE_VARIANTS):
                index = int(rng.integers(0, 2**40)) * block if k % 2 else 0
                run_encode(kernels, spec, x, variant, index, key)
            # every byte of the encoding is written: the plain encode again over another poison
            run_encode(kernels, spec, x, ENCODE_VARIANTS[0], 0, key, poison=0x00)

    @pytest.mark.parametrize("spec", [s for s in SPECS if s.rounding == "stochastic"], ids=repr)
    def test_stochastic_index_across_2_32(self, kernels: Kernels, spec: Spec) -> None:
        """The element index's high half feeds the hash too; a block may straddle 2**32."""
        rng = np.random.default_rng(11)
        x = codec_data(5 * spec.block + 3, spec.block, rng)
        for index in (2**32 - 2 * spec.block, 2**32 - 3, 3 * 2**32 + spec.block):
            run_encode(kernels, spec, x, ENCODE_VARIANTS[1], index, 12345)

    @pytest.mark.parametrize("spec", SPECS, ids=repr)
    def test_decode_matches_cpu(self, kernels: Kernels, spec: Spec) -> None:
        rng = np.random.default_rng([KIND_CODES[spec.kind], spec.block, ROUNDING_CODES[spec.rounding], 7])
        block = 16 if spec.cast else spec.block
        for n in codec_sizes(spec):
            x = codec_data(n, block, rng)
            data = np.empty(spec.cpu.encoded_bytes(n), dtype=np.uint8)
            spec.cpu.encode(x, data, key=int(rng.integers(0, 2**32)))
            for variant in DECODE_VARIANTS:
                run_decode(kernels, spec, data, n, variant, rng)

    @pytest.mark.parametrize("spec", ARBITRARY, ids=repr)
    def test_decode_arbitrary_bytes(self, kernels: Kernels, spec: Spec) -> None:
        """Bytes no encoder makes (codes -128 / -8, negative, NaN and subnormal scales, every 16-bit
        pattern)."""
        rng = np.random.default_rng(5)
        for n in (1, 13, 65536, LARGE):
            data = rng.integers(0, 256, spec.cpu.encoded_bytes(n), dtype=np.uint8)
            if spec.cast and n == 65536:
                data = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.uint8)
            for variant in (DECODE_VARIANTS[0], DECODE_VARIANTS[2]):
                run_decode(kernels, spec, data, n, variant, rng)

    # -- the rotation (csrc/kernels/rotation.h)
    @pytest.mark.parametrize("block", [8, 24, 32, 64, 128, 256])
    def test_rotate_matches_cpu(self, kernels: Kernels, block: int) -> None:
        """Parts of one size in blocks of ``block`` (a short last block), forward and back, in place, at
        aligned and misaligned addresses: the same bits as ``_C.rotate`` (no NaN arithmetic here)."""
        rng = np.random.default_rng([block, 13])
        for parts, part in ((1, 1), (1, block - 1), (3, 3 * block + 5), (2, LARGE // 2)):
            n = parts * part
            x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-30, 30, n)).astype(F32)
            for k, inverse in enumerate((False, True)):
                want = x.copy()
                _C.rotate(want, np.full(parts, part, dtype=np.uint64), block, inverse)
                dev = kernels.buf(4 * n, 4 * k, x)
                kernels.rotate(dev.ptr, n, part, block, inverse)
                where = f"rotate block={block} {parts} x {part} inverse={inverse}"
                assert_same(dev.get(F32), want, "f32", where)

    # -- the host side's checks, before any launch
    def test_bad_arguments_raise_before_a_launch(self, kernels: Kernels) -> None:
        n = 1024
        dev = kernels.buf(4 * n + 4, 0, np.zeros(n + 1, dtype=F32))
        with pytest.raises(InvalidUsageError, match="aligned"):
            kernels.reduce(0, 0, dev.ptr + 1, 0, dev.ptr, dev.ptr, n, 0)
        with pytest.raises(InvalidUsageError, match="aligned"):
            kernels.encode(KIND_CODES["int8"], 64, 0, dev.ptr + 2, dev.ptr, n)
        with pytest.raises(InvalidUsageError, match="null"):
            kernels.encode(KIND_CODES["int8"], 64, 0, 0, dev.ptr, n)
        with pytest.raises(InvalidUsageError, match="block"):
            kernels.decode(KIND_CODES["int4"], 20, 0, dev.ptr, dev.ptr, n)
        with pytest.raises(InvalidUsageError, match="codecs are fp16, bf16, int8 and int4"):
            kernels.encode(KIND_CODES["user"], 64, 0, dev.ptr, dev.ptr, n)
        with pytest.raises(InvalidUsageError, match="unknown op code"):
            kernels.reduce(0, 17, dev.ptr, 0, dev.ptr, dev.ptr, n, 0)
        with pytest.raises(InvalidUsageError, match="not parts of 1000"):
            kernels.rotate(dev.ptr, n, 1000, 32, False)
        with pytest.raises(InvalidUsageError, match=r"blocks of 512 \(1 to 256\)"):
            kernels.rotate(dev.ptr, n, n, 512, False)
        assert (dev.get(F32) == 0).all(), "a refused call wrote"
        # a correct call after the errors gives the right answer
        run_reduce(kernels, "float32", "sum", 4099, (0, 0, 0), with_dst2=False, divisor=0,
                   rng=np.random.default_rng(1))
