"""The built-in codecs and what every codec has in common.

A codec is a wire format for float32 values plus the native functions that encode and decode it
(csrc/cpu/codec.h): the executor calls them on every fragment, without Python and without the GIL.
Element-level arithmetic lives in csrc/kernels/codec.h (shared with the CUDA kernels);
``pycoll.compression.reference`` repeats it in numpy as the tests' oracle.

Wire bytes per element, scales included (float32 input is 4 bytes per element):

    codec              bytes / element          ratio vs float32
    fp16, bf16         2                        2x
    int8(block=B)      1 + 4/B                  (default B=64: 1.0625, 3.76x)
    int4(block=B)      0.5 + 4/B                (default B=32: 0.625, 6.4x)

int8 and int4 scale each block of B elements by its largest magnitude (symmetric: codes -127..127 and
-7..7). Rounding is "nearest" (round half to even) or "stochastic" (unbiased; reproducible from
``seed``: the same seed and the same sequence of calls give the same bits).

``rotation="hadamard"`` (int8, int4): a collective runs on rotated copies of its buffers, each codec block
multiplied by a fixed randomized Hadamard matrix (csrc/kernels/rotation.h), and its output is rotated back.
Outliers spread over their block, so its absmax and every element's step shrink (SDP4Bit, NeurIPS 2024:
int4 final-loss gaps of 0.06-0.19% with it against 0.4-1.2% without). The wire format is the codec's own;
``encode`` / ``decode`` are the wire codec, ``roundtrip`` includes the rotation.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from pycoll.codes import KIND_CODES as KIND_CODES  # (re-exported: the codes live in pycoll.codes)
from pycoll.codes import ROTATION_CODES as ROTATION_CODES
from pycoll.codes import ROUNDING_CODES as ROUNDING_CODES
from pycoll.errors import InvalidUsageError

SCALE_BYTES = 4
MIN_BLOCK, MAX_BLOCK = 8, 4096
#: The largest block a rotation takes (csrc/kernels/rotation.h kMaxRotationBlock).
MAX_ROTATION_BLOCK = 256

#: Input dtypes every codec accepts: its messages are float32 sums (float16 and bfloat16 are widened first
#: and rounded back once at the end). pycoll.call's rule of what may be compressed starts from it.
CODEC_DTYPES = ("float32", "float16", "bfloat16")

# Defaults chosen from the error-vs-wire-bytes table in docs/compression.md ("Choosing block sizes"): the
# largest blocks whose two-shot error on Gaussian data stays >= 10% under the targets (int8 1%, int4 15%) at
# any world size (it tends to sqrt(2) x one quantization's error as the world grows).
DEFAULT_INT8_BLOCK = 64
DEFAULT_INT4_BLOCK = 32


class Codec:
    """What the executor needs from a codec: a wire layout, native kernels and an id for mismatch checks.

    Subclasses set ``name`` and implement ``_make_native``. The layout is ``block_elems`` elements per
    ``block_bytes`` encoded bytes (a last, partial block of r elements takes ``tail_bytes(r)``), and
    messages are cut at block boundaries, so every fragment decodes on its own.
    """

    name: str = "codec"
    kind: str = "user"
    rounding: str = "nearest"
    seed: int = 0
    #: None, or "hadamard": the collective's buffers are rotated around the codec (module docstring).
    rotation: str | None = None

    def __init__(self) -> None:
        self._native: Any = None

    # ---- layout --------------------------------------------------------------------------------------
    @property
    def block_elems(self) -> int:
        return int(self.native().block_elems)

    @property
    def block_bytes(self) -> int:
        return int(self.native().block_bytes)

    def encoded_bytes(self, n: int) -> int:
        """Bytes on the wire for ``n`` elements."""
        return int(self.native().encoded_bytes(int(n)))

    @property
    def bytes_per_element(self) -> float:
        """Wire bytes per element of long messages, scales included."""
        return self.block_bytes / self.block_elems

    # ---- identity ------------------------------------------------------------------------------------
    @property
    def wire_id(self) -> int:
        """Identifies the wire format and rounding; ranks must agree on it (checked on every message)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_native"] = None  # rebuilt on first use
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and other.wire_id == self.wire_id and other.seed == self.seed

    def __hash__(self) -> int:
        return hash((self.wire_id, self.seed))

    # ---- kernels ---------------------------------------------------------------------------------------
    def native(self) -> Any:
        """The native codec the executor calls (built once)."""
        if self._native is None:
            self._native = self._make_native()
        return self._native

    def _make_native(self) -> Any:
        raise NotImplementedError

    def encode(self, x: np.ndarray, residual: np.ndarray | None = None, *, index: int = 0, key: int = 0
               ) -> np.ndarray:
        """Encodes a float32 array (adding and updating ``residual`` when given); returns the bytes."""
        src = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        out = np.empty(self.encoded_bytes(src.size), dtype=np.uint8)
        self.native().encode(src, out, residual=residual, index=index, key=key)
        return out

    def decode(self, data: np.ndarray, n: int, *, acc: np.ndarray | None = None) -> np.ndarray:
        """Decodes ``n`` elements (added to ``acc`` when given) into a new float32 array."""
        dst = np.empty(int(n), dtype=np.float32)
        self.native().decode(np.ascontiguousarray(data, dtype=np.uint8), dst,
                             acc=None if acc is None else np.ascontiguousarray(acc, dtype=np.float32))
        return dst

    def roundtrip(self, x: np.ndarray) -> np.ndarray:
        """What one quantization does to ``x`` (one part): decode(encode(x)), and with a rotation, x rotated
        first and rotated back after."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if self.rotation is None:
            return self.decode(self.encode(x), x.size)
        block = self.block_elems
        rotated = rotate(x, [x.size], block)
        return rotate(self.decode(self.encode(rotated), x.size), [x.size], block, inverse=True)


def rotate(x: np.ndarray, parts: Any, block: int, inverse: bool = False) -> np.ndarray:
    """A copy of float32 ``x`` rotated as a collective's buffer is (``parts``: element counts, one after
    another, each cut in codec blocks of ``block`` from its start; ``inverse``: rotated back)."""
    out = np.array(x, dtype=np.float32, copy=True).reshape(-1)
    counts = np.ascontiguousarray(parts, dtype=np.uint64)
    if int(counts.sum()) != out.size:
        raise InvalidUsageError(f"parts {list(parts)} do not add up to {out.size} elements")
    _native_module().rotate(out, counts, int(block), bool(inverse))
    return out


def _native_module() -> Any:
    from pycoll import _C

    return _C


class _Cast(Codec):
    def __init__(self) -> None:
        super().__init__()

    @property
    def wire_id(self) -> int:
        return KIND_CODES[self.kind]

    def _make_native(self) -> Any:
        return _native_module().builtin_codec(KIND_CODES[self.kind], 1, 0)

    @property
    def block_elems(self) -> int:
        return 1

    @property
    def block_bytes(self) -> int:
        return 2

    def encoded_bytes(self, n: int) -> int:
        return 2 * int(n)


class FP16(_Cast):
    """IEEE half precision, round to nearest even. Magnitudes above 65504 become Inf (visible, not silent)."""

    name = kind = "fp16"


class BF16(_Cast):
    """bfloat16 (float32's range, 8 bits of mantissa), round to nearest even."""

    name = kind = "bf16"


class _Blockwise(Codec):
    qmax = 0
    default_block = 0

    def __init__(
        self, block: int | None = None, rounding: str = "nearest", seed: int = 0, rotation: str | None = None
    ) -> None:
        super().__init__()
        block = self.default_block if block is None else block
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or not (
                MIN_BLOCK <= block <= MAX_BLOCK and block % 8 == 0):
            raise InvalidUsageError(f"{self.kind} block must be a multiple of 8 in "
                                    f"[{MIN_BLOCK}, {MAX_BLOCK}], got {block!r}")
        if rounding not in ROUNDING_CODES:
            raise InvalidUsageError(f"rounding must be one of {', '.join(ROUNDING_CODES)}, got {rounding!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise InvalidUsageError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        if rotation not in ROTATION_CODES:
            raise InvalidUsageError(f"rotation must be None or 'hadamard', got {rotation!r}")
        if rotation is not None and block > MAX_ROTATION_BLOCK:
            raise InvalidUsageError(
                f"rotation={rotation!r} takes blocks of at most {MAX_ROTATION_BLOCK} elements, got {block}"
            )
        self.block = int(block)
        self.rounding = rounding
        self.seed = int(seed)
        self.rotation = rotation
        extra = "" if rounding == "nearest" else f", rounding={rounding!r}, seed={seed}"
        extra += "" if rotation is None else f", rotation={rotation!r}"
        self.name = f"{self.kind}(block={self.block}{extra})"

    @property
    def wire_id(self) -> int:
        """Kind in the low byte, rounding in the next (rotation in its high nibble), block above."""
        modes = ROUNDING_CODES[self.rounding] | ROTATION_CODES[self.rotation] << 4
        return KIND_CODES[self.kind] | modes << 8 | self.block << 16

    def _make_native(self) -> Any:
        kind, rounding = KIND_CODES[self.kind], ROUNDING_CODES[self.rounding]
        return _native_module().builtin_codec(kind, self.block, rounding)

    @property
    def block_elems(self) -> int:
        return self.block

    @property
    def block_bytes(self) -> int:
        return SCALE_BYTES + self._payload(self.block)

    def _payload(self, n: int) -> int:
        raise NotImplementedError

    def encoded_bytes(self, n: int) -> int:
        full, rest = divmod(int(n), self.block)
        return full * self.block_bytes + (SCALE_BYTES + self._payload(rest) if rest else 0)

    def step_bound(self, absmax: np.ndarray) -> np.ndarray:
        """Largest |x - decode(encode(x))| of an element in a block with this absmax: half a step for
        nearest rounding, a whole step for stochastic, and float32's part. The encode rounds qmax / absmax
        and x times it (2 roundings of a value up to qmax: 2 * qmax * 2**-24 of a step), the decode
        absmax / qmax and the code times it (as much again): 4 * qmax * 2**-24 steps in all, 3e-5 of a
        step for int8, which a bound of half a step times (1 + 1e-5) missed by 1e-5."""
        step = np.asarray(absmax, dtype=np.float64) / self.qmax
        rounding = 4 * self.qmax * 2.0**-24
        return step * ((0.5 if self.rounding == "nearest" else 1.0) + rounding) + 1e-37


class Int8(_Blockwise):
    """int8 codes with one float32 absmax per block of ``block`` elements (default 64)."""

    kind = "int8"
    qmax = 127
    default_block = DEFAULT_INT8_BLOCK

    def _payload(self, n: int) -> int:
        return n


class Int4(_Blockwise):
    """int4 codes (two per byte) with one float32 absmax per block of ``block`` elements (default 32)."""

    kind = "int4"
    qmax = 7
    default_block = DEFAULT_INT4_BLOCK

    def _payload(self, n: int) -> int:
        return (n + 1) // 2


_BY_NAME = {"fp16": FP16, "bf16": BF16, "int8": Int8, "int4": Int4}
#: Names ``compression=`` accepts.
CODEC_NAMES = tuple(_BY_NAME)
_DEFAULTS: dict[str, Codec] = {}


def get_codec(spec: Any) -> Codec | None:
    """``compression=`` as the API accepts it: None / "none", a name, or a Codec object."""
    if spec is None:
        return None
    if isinstance(spec, Codec):
        return spec
    if isinstance(spec, str):
        name = spec.lower()
        if name == "none":
            return None
        codec = _DEFAULTS.get(name)
        if codec is None and name in _BY_NAME:
            # One object per name, so compression="int8" on every call reuses its native codec.
            codec = _DEFAULTS[name] = _BY_NAME[name]()
        if codec is not None:
            return codec
    raise InvalidUsageError(
        f"compression must be None, one of {', '.join(CODEC_NAMES)} or a pycoll.compression.Codec, "
        f"got {spec!r}"
    )


def user_wire_id(definition: str) -> int:
    """The wire id of a user codec: its kind code plus a hash of everything that defines its format."""
    return KIND_CODES["user"] | (zlib.crc32(definition.encode()) << 16)
