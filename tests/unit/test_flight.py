"""The flight recorder (pycoll/flight/, csrc/engine/flight_recorder.h): call sites, records, probes, the
analysis of reports. One process; the 4-rank scenarios are tests/distributed/test_hang_diagnosis.py."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import pycoll
from pycoll import _C
from pycoll.errors import PeerLostError
from pycoll.flight import analysis, probe
from pycoll.flight.recorder import local_report


def _line() -> int:
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno


@pytest.fixture(scope="module")
def comm():
    c = pycoll.init(rank=0, world_size=1, timeout=30, set_default=False)
    yield c
    c.finalize()


def _mine(comm) -> list[dict]:
    _, _, recs = analysis.records_of(local_report(4096), comm.plane.id)
    return recs


def test_call_site_is_the_callers_line(comm):
    here = _line() + 1
    site = _C.trace_call_site()
    assert site == f"{__file__}:{here} in test_call_site_is_the_callers_line"


def test_records_carry_number_call_site_times_and_state(comm):
    x = np.arange(1000, dtype=np.float32)
    before = comm.native().seq
    lines = []
    for _ in range(3):
        lines.append(_line() + 1)
        pycoll.allreduce(x, comm=comm)  # the fast path after the first call
    pycoll.broadcast(np.zeros(7, np.int64), root=0, comm=comm)
    recs = _mine(comm)[-4:]
    assert [r["seq"] for r in recs] == [before + 1, before + 2, before + 3, before + 4]
    for rec, line in zip(recs, lines):
        assert rec["site"] == f"{__file__}:{line} in test_records_carry_number_call_site_times_and_state"
        assert (rec["collective"], rec["count"], rec["dtype"], rec["op"]) == (
            "allreduce",
            1000,
            "float32",
            "sum",
        )
        assert rec["state"] == "completed" and not rec["gpu"]
        assert 0 < rec["enqueued"] <= rec["started"] <= rec["ended"]
    assert (recs[3]["collective"], recs[3]["count"], recs[3]["dtype"]) == ("broadcast", 7, "int64")


def test_async_record_is_enqueued_at_the_callers_line(comm):
    x = np.ones(64, np.float32)
    line = _line() + 1
    work = pycoll.allreduce(x, comm=comm, async_op=True)
    work.wait()
    rec = _mine(comm)[-1]
    assert rec["site"].endswith(f":{line} in test_async_record_is_enqueued_at_the_callers_line")
    assert rec["state"] == "completed" and rec["enqueued"] <= rec["started"] <= rec["ended"]


def test_probe_reads_the_main_threads_stack_without_the_gil(comm):
    """Another process probes this one while its main thread holds the GIL in a long C call: the answer
    comes from the listener's native thread, with the main thread's Python frames and state."""
    code = (
        "import json, sys\nfrom pycoll.flight import probe\n"
        "print(json.dumps(probe.probe(sys.argv[1], records=4, stacks=True, timeout=20)))\n"
    )
    argv = [sys.executable, "-c", code, comm.plane.listener.address]
    prober = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    _C.testing.hold_gil(6.0)  # no Python thread of this process runs meanwhile
    out, _ = prober.communicate(timeout=60)
    assert prober.returncode == 0
    report = json.loads(out)
    assert report["pid"] == os.getpid() and len(report["records"]) == 4
    stack = analysis.main_stack(report)
    assert any(func == "test_probe_reads_the_main_threads_stack_without_the_gil" for _, _, func in stack), (
        report
    )
    # hold_gil sleeps with the GIL held: the main thread was asleep in the kernel, not in a futex (which
    # is where it would wait for the GIL)
    assert report["main"]["state"] == "S" and report["main"]["syscall"] in ("clock_nanosleep", "nanosleep")
    assert time.monotonic() - t0 >= 6.0


def test_probe_with_a_wrong_secret_gets_nothing():
    listener = _C.ControlListener("127.0.0.1", b"the job's secret")
    address = f"127.0.0.1:{listener.port}"
    with pytest.raises(PeerLostError):
        probe.probe(address, records=1, secret=b"another secret", timeout=5)
    with pytest.raises(PeerLostError):
        probe.probe(address, records=1, secret=None, timeout=5)
    assert probe.probe(address, records=1, secret=b"the job's secret", timeout=5)["pid"] == os.getpid()


def _last_line(code: str, **env: str) -> str:
    """The last line ``code`` prints in a process of its own with ``env`` added to the environment."""
    argv = [sys.executable, "-c", code]
    out = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_ring_keeps_the_last_entries():
    code = (
        "import numpy as np, pycoll\n"
        "from pycoll.flight import analysis, recorder\n"
        "c = pycoll.init(rank=0, world_size=1, timeout=30)\n"
        "for i in range(20): pycoll.allreduce(np.ones(4, np.float32))\n"
        "_, _, recs = analysis.records_of(recorder.local_report(100), c.plane.id)\n"
        "print([r['seq'] for r in recs])\n"
    )
    seqs = json.loads(_last_line(code, PYCOLL_TRACE_ENTRIES="8"))
    assert len(seqs) == 8 and seqs == list(range(seqs[0], seqs[0] + 8)) and seqs[-1] >= 20


def test_records_read_while_they_are_written_are_whole():
    """A recorder of 4 records written by one native thread (each field a function of its collective's
    ticket) and read by another, as a probe reads it while collectives run: no record it returns mixes two
    collectives (the slots' locks; a reader whose copy was not guarded got tens of thousands of torn
    records a second when this test was written)."""
    out = _C.testing.flight_recorder_race(1.0, 4)
    assert out["torn"] == 0 and out["reads"] > 10_000 and out["writes"] > 10_000, out


def test_recorder_off_records_nothing():
    code = (
        "import numpy as np, pycoll\nfrom pycoll.flight import recorder\n"
        "c = pycoll.init(rank=0, world_size=1, timeout=30)\npycoll.allreduce(np.ones(4, np.float32))\n"
        "print(len(recorder.local_report(100)['records']))\n"
    )
    assert _last_line(code, PYCOLL_TRACE="0") == "0"


# ---- the analysis, on made-up reports ----------------------------------------------------------------
def _rec(seq, site, state="completed", count=8, collective="allreduce", started=1, ended=2):
    return {"seq": seq, "comm": 0, "collective": collective, "count": count, "dtype": "float32", "op": "sum",
            "algorithm": "ring", "root": 0, "codec": None, "site": site, "state": state,
            "started": started * 10**9, "ended": ended * 10**9}  # fmt: skip


def _report(rank, recs, now=10, stacks="", main=None):
    return {"now": now * 10**9, "comms": [{"id": 0, "info": {"name": "p/e0", "rank": rank, "world": 4}}],
            "records": recs, "stacks": stacks, "main": main}  # fmt: skip


A, B = "/x/train.py:31 in step", "/x/train.py:36 in step"


def test_positions():
    mine = _rec(5, A, "failed")
    stacks = (
        "Thread 0x00000000000000ff (most recent call first):\n"
        '  File "/x/data.py", line 12 in load_batch\n'
        '  File "/x/train.py", line 29 in step\n'
    )
    behind = _report(
        3, [_rec(4, A)], stacks=stacks, main={"ident": 255, "state": "S", "syscall": "clock_nanosleep"}
    )
    p = analysis.position(3, behind, "p/e0", mine)
    assert p.kind == "behind" and "#4" in p.text and "load_batch (data.py:12) <- step (train.py:29)" in p.text
    assert "sleeping (clock_nanosleep)" in p.text and "8.0 s ago" in p.text
    assert analysis.position(1, _report(1, [_rec(5, A, "started")]), "p/e0", mine).kind == "waiting"
    other = analysis.position(2, _report(2, [_rec(5, B, "started", count=1)]), "p/e0", mine)
    assert other.kind == "elsewhere" and "allreduce(1 x float32, sum) at train.py:36 in step" in other.text
    desync = analysis.position(2, _report(2, [_rec(5, B, "started")]), "p/e0", mine)
    assert desync.kind == "elsewhere" and "another line" in desync.text
    assert analysis.position(0, _report(0, [_rec(6, A, "started")]), "p/e0", mine).kind == "ahead"
    assert analysis.position(0, "cannot connect", "p/e0", mine).kind == "gone"
    text = analysis.summary([analysis.position(r, _report(r, [_rec(5, A, "started")]), "p/e0", mine)
                             for r in (1, 2)], 0, mine)  # fmt: skip
    assert "ranks 1, 2 wait in it at train.py:31 in step." in text


def test_spans():
    assert analysis.spans([7, 0, 1, 2, 3, 5, 8]) == "0-3, 5, 7, 8"
    assert analysis.spans([4]) == "4" and analysis.spans([1, 2]) == "1, 2"


def test_first_divergence_and_missing(tmp_path):
    for rank, recs in {
        0: [_rec(1, A), _rec(2, B)],
        1: [_rec(1, A), _rec(2, B)],
        2: [_rec(1, A), _rec(2, A)],
    }.items():
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "report": _report(rank, recs)}))
    text = analysis.analyze_dumps(tmp_path)
    assert "missing: rank(s) 3" in text
    assert (
        "first divergence: collective #2: rank(s) 0, 1 called allreduce(8 x float32, sum) at train.py:36 "
        "in step; rank(s) 2 called allreduce(8 x float32, sum) at train.py:31 in step"
    ) in text
