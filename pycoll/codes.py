"""Numeric codes shared with the native side: the one home of every table that ``pycoll._C`` is passed.

A leaf: it imports nothing of pycoll, so any module (the API, the communicators, the GPU side, the
codecs, the tools) can use the codes without importing another. Each table mirrors a native one; append,
never reorder (tests/unit/test_layers.py checks the native module's names against these).

| table            | native side                                          | used for                        |
|------------------|------------------------------------------------------|---------------------------------|
| COLLECTIVE_CODES | csrc/engine/descriptor.h ``kCollectiveNames``         | ``_C.COLLECTIVE_NAMES``         |
| ALGORITHM_CODES  | csrc/engine/descriptor.h ``kAlgorithmNames``          | ``_C.ALGORITHM_NAMES``          |
| DTYPE_CODES      | csrc/kernels/types.h ``DType``                        | element types                   |
| OP_CODES         | csrc/kernels/types.h ``RedOp``                        | reduction ops                   |
| KIND_CODES       | csrc/kernels/codec.h ``codec::Kind``                  | built-in codec kinds, user      |
| ROUNDING_CODES   | csrc/kernels/codec.h ``codec::Rounding``              | codec rounding modes            |
| ROTATION_CODES   | csrc/kernels/rotation.h ``codec::Rotation``           | codec rotations (wire id)       |
| ERROR_KIND_CODES | csrc/include/pycoll/errors.h ``ErrorKind``            | ``_C.ERROR_KINDS``, aborts      |
"""

from __future__ import annotations

__all__ = [
    "ALGORITHM_NAMES",
    "ALGORITHM_CODES",
    "COLLECTIVE_NAMES",
    "COLLECTIVE_CODES",
    "DTYPE_CODES",
    "ERROR_KIND_CODES",
    "KIND_CODES",
    "OP_CODES",
    "ROTATION_CODES",
    "ROUNDING_CODES",
]

#: Collectives in the engine's order (``_C.COLLECTIVE_NAMES``).
COLLECTIVE_NAMES = ("allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier", "all_to_all")
#: Plan algorithms in the engine's order, then NCCL's own collectives (``_C.ALGORITHM_NAMES``; "nccl" is
#: carried only by the flight records of GPU collectives NCCL runs).
ALGORITHM_NAMES = ("ring", "tree", "direct", "dissemination", "hierarchical", "nccl")
COLLECTIVE_CODES = {name: i for i, name in enumerate(COLLECTIVE_NAMES)}
ALGORITHM_CODES = {name: i for i, name in enumerate(ALGORITHM_NAMES)}

# Codes shared with csrc/kernels/types.h (DType).
DTYPE_CODES = {
    "float32": 0,
    "float64": 1,
    "float16": 2,
    "bfloat16": 3,
    "int32": 4,
    "int64": 5,
    "uint8": 6,
    "int8": 7,
}
# Codes shared with csrc/kernels/types.h (RedOp).
OP_CODES = {"sum": 0, "avg": 1, "min": 2, "max": 3, "prod": 4}

# Codes shared with csrc/kernels/codec.h (codec::Kind, codec::Rounding) and csrc/kernels/rotation.h
# (codec::Rotation; None is no rotation).
KIND_CODES = {"fp16": 1, "bf16": 2, "int8": 3, "int4": 4, "user": 15}
ROUNDING_CODES = {"nearest": 0, "stochastic": 1}
ROTATION_CODES = {None: 0, "hadamard": 1}

# Codes shared with csrc/include/pycoll/errors.h (ErrorKind): what a native error is (pycoll/errors.py has
# the exception class of each), and what NativeCommunicator.abort is told.
ERROR_KIND_CODES = {
    "internal": 0,
    "timeout": 1,
    "peer_lost": 2,
    "mismatch": 3,
    "invalid_usage": 4,
    "nccl": 5,
    "broken": 6,
    "system": 7,
}
