"""Compression for all-reduce: codecs, error feedback and user codecs.

    pycoll.allreduce(x, compression="int8")                                  # by name
    pycoll.allreduce(x, compression=pycoll.compression.Int4(block=32, rounding="stochastic", seed=1))
    ef = pycoll.compression.ErrorFeedback()
    pycoll.allreduce(grad, op="avg", compression="int8", residual=ef)       # error feedback

Built-in codecs: ``FP16``, ``BF16``, ``Int8``, ``Int4`` (see ``codecs`` for wire formats). User codecs
written with numba plug into the same plans: see ``pycoll.compression.user``.
"""

from __future__ import annotations

from typing import Any

from pycoll.compression.codecs import (
    BF16,
    CODEC_DTYPES,
    CODEC_NAMES,
    FP16,
    Codec,
    Int4,
    Int8,
    get_codec,
)
from pycoll.compression.feedback import ErrorFeedback

__all__ = [
    "BF16",
    "CODEC_DTYPES",
    "CODEC_NAMES",
    "FP16",
    "Codec",
    "ErrorFeedback",
    "Int4",
    "Int8",
    "UserCodec",
    "get_codec",
]


def __getattr__(name: str) -> Any:
    if name == "UserCodec":  # lazily: pycoll.compression.user imports numba when it is used
        from pycoll.compression.user import UserCodec

        return UserCodec
    raise AttributeError(f"module 'pycoll.compression' has no attribute {name!r}")
