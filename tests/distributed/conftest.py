"""Fixtures of the multi-process tests: ``rank_pool(world)`` hands out long-lived rank pools."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # `from harness import ...` under any pytest import mode
    sys.path.insert(0, HERE)

from harness import PoolCache  # noqa: E402


@pytest.fixture(scope="session")
def rank_pool():
    """``rank_pool(world) -> RankPool``: one pool per world size, reused across tests; at most two alive
    at once (4 ranks on 2 cores is normal here; more idle pools only cost memory). A pool whose
    communicator broke or whose run failed is replaced by a fresh one."""
    cache = PoolCache(max_alive=2)
    yield cache.get
    cache.close()


@pytest.fixture(scope="session", autouse=True)
def _remove_ddp_rendezvous_files():
    """The DDP tests' gloo groups meet through FileStore files (_ddp.py); a worker killed at the end of
    the session cannot remove its own, so the session does."""
    yield
    import glob
    import os
    import tempfile

    from _ddp import session_tag

    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"pycoll-ddp-{session_tag()}-*")):
        try:
            os.remove(path)
        except OSError:
            pass
