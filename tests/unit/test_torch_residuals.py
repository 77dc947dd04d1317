"""The error-feedback residuals of the torch backend (pycoll.torch.options.Residuals): one per live
storage, none inherited by a tensor that lands where a freed one was, least recently used dropped."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from pycoll.torch.options import Residuals  # noqa: E402


def test_a_storage_keeps_its_residual_and_views_of_other_elements_get_their_own():
    res = Residuals(8)
    t = torch.zeros(64)
    r = res.for_tensor(t, 64)
    r += 1.5
    assert res.for_tensor(t, 64) is r and res.for_tensor(t.view(8, 8), 64) is r  # same storage, same place
    assert float(res.for_tensor(t[32:], 32).abs().sum()) == 0.0  # another slice: a residual of its own
    assert len(res) == 2


def test_a_tensor_where_a_freed_one_was_starts_from_zeros():
    """Two storages at one address, one after the other (as the allocator may hand out): made
    deterministic here with torch.from_numpy over the same numpy buffer, each call a new storage."""
    import numpy as np

    res = Residuals(8)
    memory = np.zeros(1000, dtype=np.float32)
    first = torch.from_numpy(memory)
    res.for_tensor(first, 1000).fill_(3.0)  # what compression "lost" on the first tensor
    address = first.data_ptr()
    del first  # its storage is freed; the memory stays (numpy owns it)
    second = torch.from_numpy(memory)
    assert second.data_ptr() == address
    assert float(res.for_tensor(second, 1000).abs().max()) == 0.0, "inherited a freed tensor's residual"
    assert len(res) == 1  # the stale entry was dropped


def test_at_most_limit_residuals_least_recently_used_dropped():
    res = Residuals(3)
    tensors = [torch.zeros(10) for _ in range(4)]
    first = res.for_tensor(tensors[0], 10)
    for t in tensors[1:3]:
        res.for_tensor(t, 10)
    assert res.for_tensor(tensors[0], 10) is first  # used again: now the most recent
    res.for_tensor(tensors[3], 10)  # drops tensors[1]'s, the least recently used
    assert len(res) == 3 and res.for_tensor(tensors[0], 10) is first
