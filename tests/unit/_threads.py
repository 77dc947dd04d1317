"""Running callables side by side in a test, with a deadline (shared by the store and bootstrap tests)."""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence


def run_threads(fns: Sequence[Callable[[], Any]], timeout: float) -> list[Any]:
    """Run callables in threads; return their results or raised exceptions (never hangs)."""
    results: list[Any] = [None] * len(fns)

    def wrap(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            results[i] = exc

    threads = [threading.Thread(target=wrap, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    assert not any(t.is_alive() for t in threads), "threads still running past the deadline"
    return results
