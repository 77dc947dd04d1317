"""User codecs: a wire format written in Python with numba, run by the native executor.

A codec is a block layout plus two kernels. The executor calls the kernels on fragments of whole blocks,
from its own threads, without the GIL, so they must be native code: numba compiles them into C
functions whose addresses the native codec (csrc/cpu/codec.h, ``make_user_codec``) calls.

Layout: ``block_elems`` float32 elements encode into ``block_bytes`` bytes; the last, partial block of a
message of r elements (0 < r < block_elems) into ``tail_bytes(r)`` bytes (1 to block_bytes), so n
elements take ``(n // block_elems) * block_bytes + tail_bytes(n % block_elems)`` bytes. A block must fit
in one transport fragment: block_bytes is at most 4096.

The simple way: two Python functions on numpy arrays, compiled with ``numba.njit`` and wrapped for you::

    def encode(src, out, index, key):   # src: float32[n]; out: uint8[encoded_bytes(n)]
        ...                             # index: element index of src[0] in the buffer (a multiple of
                                        # block_elems); key: uint32, per rank and call (stochastic rounding)
    def decode(data, out, accumulate):  # data: uint8[encoded_bytes(n)]; out: float32[n]
        ...                             # out = decoded, or out += decoded (in float32) when accumulate

    codec = UserCodec("mine", block_elems=256, block_bytes=36, tail_bytes=lambda r: 4 + (r + 7) // 8,
                      encode=encode, decode=decode)
    pycoll.allreduce(x, compression=codec, residual=pycoll.compression.ErrorFeedback())

Or the C functions themselves, as ``numba.cfunc`` objects with exactly these signatures::

    encode: void(float32* src, int64 n, uint8* out, int64 index, uint32 key)
    decode: void(uint8* in, int64 n, float32* out, int32 accumulate)

Rules for kernels: encode must write exactly encoded_bytes(n) bytes and depend only on (src, index, key)
so that fragments encode the same as whole messages; decode must not depend on anything but its bytes;
neither may write its input. Exceptions cannot reach the caller (numba prints and ignores them), and
decode must not raise on any bytes. Error feedback (``residual=``) needs nothing from the codec: the
executor decodes what was encoded and keeps the difference.

Every rank must construct the same codec: its ``wire_id`` (checked on every message) hashes the name, the
layout and the kernels' code (or ``version=`` when given), so ranks running different codecs fail with
CollectiveMismatchError instead of decoding each other's bytes wrongly.

Compiled kernels are cached per process by (kernel functions, layout) and kept for the life of the
process (the native codec holds only their addresses): build codecs from the same function objects
(module-level functions, or a cached factory) to compile once.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
import threading
import types
from typing import Any, Callable, Sequence, Union

import numpy as np

from pycoll.compression.codecs import Codec, _native_module, user_wire_id
from pycoll.errors import InvalidUsageError

ENCODE_SIGNATURE = "void(float32* src, int64 n, uint8* out, int64 index, uint32 key)"
DECODE_SIGNATURE = "void(uint8* in, int64 n, float32* out, int32 accumulate)"
ENCODE_PARAMS = ("src", "out", "index", "key")
DECODE_PARAMS = ("data", "out", "accumulate")
ENCODE_ARRAYS = "float32[n], uint8[encoded_bytes(n)], int64, uint32"
DECODE_ARRAYS = "uint8[encoded_bytes(n)], float32[n], bool"

#: Largest block_bytes: a block must fit in the smallest transport fragment (PYCOLL_SHM_SLOT_BYTES >= 4096).
MAX_BLOCK_BYTES = 4096
#: Largest block_elems (the layout keeps one tail size per partial-block length).
MAX_BLOCK_ELEMS = 1 << 16

TailBytes = Union[Callable[[int], int], Sequence[int]]

_lock = threading.Lock()
# (encode, decode, block_elems, block_bytes, tails) -> (encode cfunc, decode cfunc); never emptied: the
# native codecs built from these hold their addresses.
_compiled: dict[tuple, tuple[Any, Any]] = {}


def _numba() -> Any:
    try:
        import numba  # type: ignore[import-untyped, unused-ignore]
    except ImportError as e:
        raise InvalidUsageError(
            "a user codec written in Python needs numba: pip install numba") from e
    return numba


def _signatures(numba: Any) -> tuple[Any, Any]:
    t = numba.types
    enc = t.void(t.CPointer(t.float32), t.int64, t.CPointer(t.uint8), t.int64, t.uint32)
    dec = t.void(t.CPointer(t.uint8), t.int64, t.CPointer(t.float32), t.int32)
    return enc, dec


def _is_cfunc(obj: Any) -> bool:
    numba = sys.modules.get("numba")  # a numba object exists only if numba was imported
    if numba is None:
        return False
    from numba.core.ccallback import CFunc  # type: ignore[import-untyped, unused-ignore]

    return isinstance(obj, CFunc)


def _is_dispatcher(obj: Any) -> bool:
    numba = sys.modules.get("numba")
    if numba is None:
        return False
    from numba.core.dispatcher import Dispatcher  # type: ignore[import-untyped, unused-ignore]

    return isinstance(obj, Dispatcher)


def _check_cfunc(obj: Any, which: str, signature: str) -> int:
    numba = _numba()
    want = _signatures(numba)[0 if which == "encode" else 1]
    got = getattr(obj, "_sig", None)
    if got != want:
        raise InvalidUsageError(f"the {which} cfunc has signature {got}, a user codec needs {signature}")
    address = getattr(obj, "address", None)
    if not isinstance(address, int) or address == 0:
        raise InvalidUsageError(f"the {which} cfunc has no address ({address!r})")
    return address


def _check_python_kernel(fn: Any, which: str, params: tuple[str, ...]) -> None:
    py = fn.py_func if _is_dispatcher(fn) else fn
    if not isinstance(py, types.FunctionType):
        raise InvalidUsageError(
            f"{which} must be a Python function {which}({', '.join(params)}), a numba.njit function or a "
            f"numba.cfunc with signature {ENCODE_SIGNATURE if which == 'encode' else DECODE_SIGNATURE}; "
            f"got {type(fn).__name__}")
    try:
        inspect.signature(py).bind(*params)
    except TypeError:
        raise InvalidUsageError(
            f"{which} must take {len(params)} arguments ({', '.join(params)}), got {py.__name__}"
            f"{inspect.signature(py)}") from None


def _int(value: Any, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not low <= value <= high:
        raise InvalidUsageError(f"{what} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def _tail_table(tail_bytes: TailBytes, block_elems: int, block_bytes: int) -> list[int]:
    if callable(tail_bytes):
        tails = [0]
        for r in range(1, block_elems):
            try:
                size = tail_bytes(r)
            except Exception as e:  # noqa: BLE001 - the user's function: say where it failed
                raise InvalidUsageError(f"tail_bytes({r}) raised {type(e).__name__}: {e}") from e
            tails.append(_int(size, f"tail_bytes({r})", 1, block_bytes))
        return tails
    if isinstance(tail_bytes, (str, bytes)) or not isinstance(tail_bytes, (Sequence, np.ndarray)):
        raise InvalidUsageError(f"tail_bytes must be a function of r or a list of block_elems sizes, "
                                f"got {type(tail_bytes).__name__}")
    if len(tail_bytes) != block_elems:
        raise InvalidUsageError(f"tail_bytes must list one size per r in [0, block_elems) ({block_elems} "
                                f"sizes), got {len(tail_bytes)}")
    if isinstance(tail_bytes[0], bool) or tail_bytes[0] != 0:
        raise InvalidUsageError(f"tail_bytes[0] must be 0 (no partial block encodes to nothing), "
                                f"got {tail_bytes[0]!r}")
    tails = [0]
    tails += [_int(tail_bytes[r], f"tail_bytes[{r}]", 1, block_bytes) for r in range(1, block_elems)]
    return tails


# ---- identity ------------------------------------------------------------------------------------------
def _fingerprint(obj: Any, h: Any, seen: set[int], depth: int = 0) -> None:
    """Feeds what defines a kernel into ``h``: its bytecode and constants, the values it closes over and
    the plain values, arrays and functions it reads from its globals (numba freezes all of them)."""
    if depth > 8:
        return
    if _is_dispatcher(obj) or _is_cfunc(obj):
        obj = getattr(obj, "py_func", None) or getattr(obj, "_pyfunc", None)
    if isinstance(obj, types.FunctionType):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        _fingerprint(obj.__code__, h, seen, depth + 1)
        _fingerprint(obj.__defaults__, h, seen, depth + 1)
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                value = None
            _fingerprint(value, h, seen, depth + 1)
        names = _global_names(obj.__code__)
        for name in sorted(names):
            if name in obj.__globals__:
                h.update(f"g:{name}=".encode())
                _fingerprint(obj.__globals__[name], h, seen, depth + 1)
    elif isinstance(obj, types.CodeType):
        h.update(obj.co_code)
        h.update(repr(obj.co_names).encode())
        for const in obj.co_consts:
            _fingerprint(const, h, seen, depth + 1)
    elif isinstance(obj, np.ndarray):
        h.update(f"a:{obj.dtype.str}{obj.shape}".encode())
        h.update(np.ascontiguousarray(obj).tobytes())
    elif isinstance(obj, (tuple, list)):
        h.update(f"{type(obj).__name__}{len(obj)}(".encode())
        for item in obj:
            _fingerprint(item, h, seen, depth + 1)
        h.update(b")")
    elif obj is None or isinstance(obj, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(f"{type(obj).__name__}:{obj!r};".encode())
    elif isinstance(obj, types.ModuleType):
        h.update(f"m:{obj.__name__};".encode())
    else:  # something numba resolves at compile time (a type, a builtin): its name identifies it
        qualname = getattr(obj, "__qualname__", type(obj).__name__)
        h.update(f"o:{getattr(obj, '__module__', '')}.{qualname};".encode())


def _global_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _kernel_id(encode: Any, decode: Any) -> str:
    h = hashlib.sha256()
    seen: set[int] = set()
    _fingerprint(encode, h, seen)
    h.update(b"|")
    _fingerprint(decode, h, seen)
    return h.hexdigest()[:16]


# ---- compiling -----------------------------------------------------------------------------------------
def _compile(encode: Any, decode: Any, name: str, block_elems: int, block_bytes: int,
             tails: list[int]) -> tuple[Any, Any]:
    """The cfuncs that turn the ABI's pointers into arrays and call the user's functions (cached)."""
    key = (encode, decode, block_elems, block_bytes, tuple(tails))
    with _lock:
        hit = _compiled.get(key)
        if hit is not None:
            return hit
        numba = _numba()
        enc_sig, dec_sig = _signatures(numba)
        # Kernels are called without Python around them: no Python-style exceptions for float errors.
        enc_jit = encode if _is_dispatcher(encode) else numba.njit(error_model="numpy")(encode)
        dec_jit = decode if _is_dispatcher(decode) else numba.njit(error_model="numpy")(decode)
        # Frozen into the wrappers as constants (numba freezes closure variables).
        be, bb = block_elems, block_bytes
        tail = np.asarray(tails, dtype=np.int64)
        carray = numba.carray

        def encode_c(src_ptr, n, out_ptr, index, key):
            src = carray(src_ptr, (n,))
            out = carray(out_ptr, ((n // be) * bb + tail[n % be],))
            enc_jit(src, out, index, key)

        def decode_c(in_ptr, n, out_ptr, accumulate):
            data = carray(in_ptr, ((n // be) * bb + tail[n % be],))
            out = carray(out_ptr, (n,))
            dec_jit(data, out, accumulate != 0)

        compiled = []
        for which, sig, wrapper in (("encode", enc_sig, encode_c), ("decode", dec_sig, decode_c)):
            try:
                compiled.append(numba.cfunc(sig, error_model="numpy")(wrapper))
            except numba.core.errors.NumbaError as e:
                params = ENCODE_PARAMS if which == "encode" else DECODE_PARAMS
                gets = ENCODE_ARRAYS if which == "encode" else DECODE_ARRAYS
                raise InvalidUsageError(
                    f"user codec {name!r}: numba could not compile {which}({', '.join(params)}) for the "
                    f"arguments it gets ({gets}):\n{e}") from e
        hit = (compiled[0], compiled[1])
        _compiled[key] = hit
        return hit


# ---- the codec -------------------------------------------------------------------------------------------
class UserCodec(Codec):
    """A codec from a block layout and two numba kernels; see the module docstring.

    ``name``: shown in logs and errors. ``block_elems``, ``block_bytes``, ``tail_bytes`` (a function of r
    or a list indexed by r, with tail_bytes[0] == 0): the layout. ``encode``, ``decode``: Python functions
    (compiled with numba here), ``numba.njit`` functions, or ``numba.cfunc`` objects with the C
    signatures. ``version``: identifies the kernels in ``wire_id`` instead of their code. ``seed``: seeds
    the ``key`` handed to encode (stochastic rounding), as for the built-in codecs.
    """

    kind = "user"

    def __init__(
        self,
        name: str,
        block_elems: int,
        block_bytes: int,
        tail_bytes: TailBytes,
        encode: Any,
        decode: Any,
        *,
        version: str | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if not isinstance(name, str) or not name:
            raise InvalidUsageError(f"a user codec needs a non-empty name, got {name!r}")
        self.name = name
        self._block_elems = _int(block_elems, "block_elems", 1, MAX_BLOCK_ELEMS)
        self._block_bytes = _int(block_bytes, "block_bytes", 1, MAX_BLOCK_BYTES)
        self._tails = _tail_table(tail_bytes, self._block_elems, self._block_bytes)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
            raise InvalidUsageError(f"seed must be an integer in [0, 2**64), got {seed!r}")
        self.seed = int(seed)
        if version is not None and not isinstance(version, str):
            raise InvalidUsageError(f"version must be a string, got {version!r}")
        self.version = version

        enc_is_c, dec_is_c = _is_cfunc(encode), _is_cfunc(decode)
        if enc_is_c != dec_is_c:
            raise InvalidUsageError("encode and decode must both be numba cfuncs, or both Python (or "
                                    "numba.njit) functions")
        if enc_is_c:
            _check_cfunc(encode, "encode", ENCODE_SIGNATURE)
            _check_cfunc(decode, "decode", DECODE_SIGNATURE)
            self._encode_cfunc, self._decode_cfunc = encode, decode
            with _lock:  # the native codec holds only their addresses: keep them for the process's life
                _compiled.setdefault((encode, decode), (encode, decode))
        else:
            _check_python_kernel(encode, "encode", ENCODE_PARAMS)
            _check_python_kernel(decode, "decode", DECODE_PARAMS)
            self._encode_cfunc, self._decode_cfunc = _compile(
                encode, decode, name, self._block_elems, self._block_bytes, self._tails)
        self.encode_kernel, self.decode_kernel = encode, decode
        kernels = f"version={version}" if version is not None else f"code={_kernel_id(encode, decode)}"
        self._definition = (f"user:{name};elems={self._block_elems};bytes={self._block_bytes};"
                            f"tails={hashlib.sha256(repr(self._tails).encode()).hexdigest()[:16]};{kernels}")

    @classmethod
    def from_numba(
        cls,
        name: str,
        block_elems: int,
        block_bytes: int,
        tail_bytes: TailBytes,
        encode: Callable[..., Any],
        decode: Callable[..., Any],
        *,
        version: str | None = None,
        seed: int = 0,
    ) -> UserCodec:
        """A codec from Python kernels ``encode(src, out, index, key)`` and ``decode(data, out,
        accumulate)`` on numpy arrays, compiled with numba (the same as the constructor)."""
        return UserCodec(name, block_elems, block_bytes, tail_bytes, encode, decode, version=version,
                         seed=seed)

    # ---- layout (known without building the native codec) -----------------------------------------------
    @property
    def block_elems(self) -> int:
        return self._block_elems

    @property
    def block_bytes(self) -> int:
        return self._block_bytes

    def tail_bytes(self, r: int) -> int:
        """Encoded size of a last, partial block of ``r`` elements (0 <= r < block_elems)."""
        return self._tails[r]

    def encoded_bytes(self, n: int) -> int:
        full, rest = divmod(int(n), self._block_elems)
        return full * self._block_bytes + self._tails[rest]

    # ---- identity ------------------------------------------------------------------------------------------
    @property
    def definition(self) -> str:
        """What ``wire_id`` hashes: name, layout and the kernels' code hash (or version)."""
        return self._definition

    @property
    def wire_id(self) -> int:
        return user_wire_id(self._definition)

    # ---- kernels -------------------------------------------------------------------------------------------
    @property
    def encode_address(self) -> int:
        return int(self._encode_cfunc.address)

    @property
    def decode_address(self) -> int:
        return int(self._decode_cfunc.address)

    def _make_native(self) -> Any:
        return _native_module().user_codec(self.name, self._block_elems, self._block_bytes, self._tails,
                                           self.encode_address, self.decode_address)

    def __reduce__(self) -> Any:  # rebuilt from the same kernels (Python functions pickle by reference)
        if _is_cfunc(self.encode_kernel) or _is_cfunc(self.decode_kernel):
            raise TypeError(f"user codec {self.name!r} was built from numba cfuncs, which cannot be pickled; "
                            f"build it in each process instead")
        return (_rebuild, (self.name, self._block_elems, self._block_bytes, self._tails,
                           self.encode_kernel, self.decode_kernel, self.version, self.seed))


def _rebuild(name: str, block_elems: int, block_bytes: int, tails: list[int], encode: Any, decode: Any,
             version: str | None, seed: int) -> UserCodec:
    return UserCodec(name, block_elems, block_bytes, tails, encode, decode, version=version, seed=seed)
