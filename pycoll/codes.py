"""Numeric codes shared with the native side: the one home of every table that ``pycoll._C`` is passed.

A leaf: it imports nothing of pycoll, so any module (the API, the communicators, the GPU side, the
codecs, the tools) can use the codes without importing another. Each table mirrors a native one; append,
never reorder (tests/unit/test_layers.py checks the native module's names against these).

| table            | native side                                          | used for                   |
|------------------|------------------------------------------------------|----------------------------|
| COLLECTIVE_CODES | csrc/engine/descriptor.h ``kCollectiveNames``         | ``_C.COLLECTIVES``         |
| ALGORITHM_CODES  | csrc/engine/descriptor.h ``kAlgorithmNames``          | ``_C.ALGORITHMS``          |
| DTYPE_CODES      | csrc/kernels/types.h ``DType``                        | element types              |
| OP_CODES         | csrc/kernels/types.h ``RedOp``                        | reduction ops              |
| KIND_CODES       | csrc/kernels/codec.h ``codec::Kind``                  | built-in codec kinds, user |
| ROUNDING_CODES   | csrc/kernels/codec.h ``codec::Rounding``              | codec rounding modes       |
"""

from __future__ import annotations

__all__ = [
    "ALGORITHMS",
    "ALGORITHM_CODES",
    "COLLECTIVES",
    "COLLECTIVE_CODES",
    "DTYPE_CODES",
    "KIND_CODES",
    "OP_CODES",
    "ROUNDING_CODES",
]

#: Collectives in the engine's order (``_C.COLLECTIVES``).
COLLECTIVES = ("allreduce", "reduce_scatter", "all_gather", "broadcast", "barrier")
#: Plan algorithms in the engine's order (``_C.ALGORITHMS``).
ALGORITHMS = ("ring", "tree", "direct", "dissemination", "hierarchical")
COLLECTIVE_CODES = {name: i for i, name in enumerate(COLLECTIVES)}
ALGORITHM_CODES = {name: i for i, name in enumerate(ALGORITHMS)}

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

# Codes shared with csrc/kernels/codec.h (codec::Kind, codec::Rounding).
KIND_CODES = {"fp16": 1, "bf16": 2, "int8": 3, "int4": 4, "user": 15}
ROUNDING_CODES = {"nearest": 0, "stochastic": 1}
