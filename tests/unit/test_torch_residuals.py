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
    res = Residuals(8)
    reused = 0
    for _ in range(20):
        t = torch.empty(1000)
        address = t.data_ptr()
        res.for_tensor(t, 1000).fill_(3.0)  # what compression "lost" on t
        del t
        t2 = torch.empty(1000)
        reused += t2.data_ptr() == address
        assert float(res.for_tensor(t2, 1000).abs().max()) == 0.0, "inherited a freed tensor's residual"
        del t2
    assert reused > 0, "the allocator never reused an address: the case this test is about did not occur"
    assert len(res) <= 2


def test_at_most_limit_residuals_least_recently_used_dropped():
    res = Residuals(3)
    tensors = [torch.zeros(10) for _ in range(4)]
    first = res.for_tensor(tensors[0], 10)
    for t in tensors[1:3]:
        res.for_tensor(t, 10)
    assert res.for_tensor(tensors[0], 10) is first  # used again: now the most recent
    res.for_tensor(tensors[3], 10)  # drops tensors[1]'s, the least recently used
    assert len(res) == 3 and res.for_tensor(tensors[0], 10) is first
