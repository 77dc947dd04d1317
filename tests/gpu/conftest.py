"""The GPU tests need torch with CUDA (its tensors are the device memory), a CUDA device, and pycoll built
with CUDA. Where one is missing every test here is *skipped* with the reason (never passed), so that
``pytest -rs`` says why; scripts/gpu_check.sh fails when they are skipped on a machine that has a GPU."""

from __future__ import annotations

import pytest


def why_no_gpu() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed (the GPU tests take device memory from torch CUDA tensors)"
    if not torch.cuda.is_available():
        return f"torch.cuda is not available (torch {torch.__version__}, built for CUDA {torch.version.cuda})"
    from pycoll import _C

    if not _C.cuda.built():
        return "pycoll was built without CUDA (nvcc not found at build time): rebuild with PYCOLL_CUDA=on"
    if _C.cuda.device_count() == 0:
        return f"torch sees a GPU but pycoll's CUDA runtime does not: {_C.cuda.device_error()}"
    return None


@pytest.fixture(autouse=True)
def _needs_gpu() -> None:
    why = why_no_gpu()
    if why:
        pytest.skip(why)
