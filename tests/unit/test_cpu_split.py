"""bench/cpu_split.py's buckets, from a made-up ``perf report --children`` text (no perf needed)."""

from __future__ import annotations

import _bench_scripts
import pytest

REPORT = """\
# Samples: 47K of event 'cpu-clock:ppp'
#
    37.05%     0.13%  [.] __send
    36.47%     0.02%  [k] __x64_sys_sendto
    30.92%    30.41%  [k] pv_native_safe_halt
    30.90%     0.02%  [k] do_idle
    12.98%     0.02%  [k] __x64_sys_recvfrom
     4.12%     0.05%  [k] __x64_sys_futex
     1.70%     0.03%  [k] __x64_sys_poll
     0.77%     0.02%  [k] ksys_write
     3.16%     3.08%  [.] __memmove_avx512_unaligned_erms
     0.50%     0.40%  [.] __memcpy_avx_unaligned
     2.81%     2.81%  [.] 0x00000000000dcd3a
"""


def test_buckets_add_up_to_all_samples() -> None:
    split = _bench_scripts.load("cpu_split.py", "_bench_cpu_split").shares(REPORT)
    assert split["idle (every thread asleep)"] == pytest.approx(30.90)
    assert split["send / sendmsg (TCP stack)"] == pytest.approx(36.47)  # the kernel's, not libc's __send
    assert split["recv / recvmsg (TCP stack)"] == pytest.approx(12.98)
    assert split["futex (sleep and wake-up)"] == pytest.approx(4.12)
    assert split["poll / epoll"] == pytest.approx(1.70)
    assert split["write (eventfd wake-ups)"] == pytest.approx(0.77)
    assert split["sched_yield"] == 0.0
    assert split["user-space copies (memmove/memcpy)"] == pytest.approx(3.48)  # self time of both
    assert sum(split.values()) == pytest.approx(100.0)
    assert split["the rest (reductions, Python, other kernel work)"] == pytest.approx(
        100 - (30.90 + 36.47 + 12.98 + 4.12 + 1.70 + 0.77 + 3.48)
    )
