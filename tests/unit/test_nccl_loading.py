"""NCCL loading and the non-blocking communicator logic (pycoll/nccl.py, csrc/nccl/nccl.cc), without a GPU.

A process loads NCCL once, so every case runs in a fresh interpreter. Three sources of "NCCL":

- broken ones (a missing file, ``libm.so.6``), which must raise ``NcclError`` naming what is wrong;
- a stub compiled from ``nccl_stub.c`` that answers like a non-blocking communicator (``ncclInProgress``
  for a few polls) and fails on request: it exercises init, the waits with deadlines, aborts, groups,
  error texts and the dtype / op codes handed to NCCL;
- the real NCCL of the ``nvidia-nccl-cu13`` / ``-cu12`` wheel when one is installed (else those tests skip):
  its version, and a communicator that cannot be formed without a GPU raising NCCL's own text.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from pycoll import _C, libraries

REPO = Path(__file__).resolve().parents[2]
STUB_SOURCE = Path(__file__).with_name("nccl_stub.c")

def run_py(code: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; it prints one JSON object on its last line, returned here.
    The child's stderr is attached to any failure."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(REPO), child_env.get("PYTHONPATH", "")] if p
    )
    child_env.pop("NCCL_LIBRARY", None)
    child_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=timeout,
        cwd=str(REPO),
    )
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines, f"child printed nothing:\n{proc.stderr}"
    return dict(json.loads(lines[-1]))


# Prelude of the children: `expect(fn, cls)` runs fn and returns the exception's class name and text.
PRELUDE = """
import json, os, sys, time
def expect(fn, cls=Exception):
    try:
        fn()
    except cls as exc:
        return [type(exc).__name__, str(exc)]
    raise AssertionError(f"{fn} did not raise {cls}")
"""


# ---------------------------------------------------------------------------------------------------
# Broken libraries and the import


def test_missing_nccl_library_names_path_and_search(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "libnccl.so.2"
    out = run_py(
        PRELUDE
        + """
import pycoll
from pycoll.errors import NcclError
name, text = expect(pycoll.nccl_version, NcclError)
print(json.dumps({"name": name, "text": text}))
""",
        env={"NCCL_LIBRARY": str(missing)},
    )
    assert out["name"] == "NcclError"
    assert str(missing) in out["text"]
    assert "no such file" in out["text"]
    assert "searched: NCCL_LIBRARY=" in out["text"]


def test_library_without_nccl_symbols_names_the_entry_point() -> None:
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to stand in for a library without NCCL's symbols")
    out = run_py(
        PRELUDE
        + """
import pycoll
from pycoll import _C
from pycoll.errors import PycollError
name, text = expect(pycoll.nccl_version, PycollError)
print(json.dumps({"name": name, "text": text, "built": _C.nccl.built(), "loaded": _C.nccl.is_loaded()}))
""",
        env={"NCCL_LIBRARY": libm},
    )
    if not out["built"]:
        assert out["name"] == "InvalidUsageError" and "without CUDA" in out["text"]
        return
    assert out["name"] == "NcclError"
    assert libm in out["text"]
    assert "ncclGetVersion" in out["text"]  # the first entry point looked up
    assert "searched: NCCL_LIBRARY=" in out["text"]
    assert out["loaded"] is False


def test_import_and_cpu_api_do_not_load_nccl_or_torch() -> None:
    out = run_py(
        """
import json, sys
import pycoll
pycoll.allreduce, pycoll.init, pycoll.Communicator
import pycoll.nccl  # the module itself loads nothing either
from pycoll import _C
with open("/proc/self/maps") as f:
    maps = f.read()
out = {"loaded": _C.nccl.is_loaded(), "in_maps": "libnccl" in maps, "torch": "torch" in sys.modules}
print(json.dumps(out))
"""
    )
    assert out == {"loaded": False, "in_maps": False, "torch": False}


# ---------------------------------------------------------------------------------------------------
# The stub: non-blocking init, waits, aborts, groups, codes


@pytest.fixture(scope="module")
def stub_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    if not _C.nccl.built():
        pytest.skip("pycoll was built without CUDA (no nvcc): there is no NCCL binding to test")
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler to build the NCCL stub")
    out = tmp_path_factory.mktemp("nccl_stub") / "libnccl_stub.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(STUB_SOURCE)], check=True)
    return str(out)


# Prelude of stub children: the stub's recorded state through ctypes (the same library instance pycoll
# dlopen()ed: a second dlopen of one path returns the same handle).
STUB_PRELUDE = (
    PRELUDE
    + """
import ctypes
import numpy as np
import pycoll
from pycoll import _C
from pycoll.nccl import load_nccl
from pycoll.errors import *
path = load_nccl()
stub = ctypes.CDLL(path)
def val(name):
    return ctypes.c_int.in_dll(stub, name).value
def mode(m):
    os.environ["STUB_NCCL_MODE"] = m
UID = _C.nccl.unique_id()
"""
)


def run_stub(stub_lib: str, code: str, mode: str = "") -> dict[str, Any]:
    env = {"NCCL_LIBRARY": stub_lib, "STUB_NCCL_MODE": mode}
    return run_py(STUB_PRELUDE + textwrap.dedent(code), env=env)


def test_stub_init_is_non_blocking_with_a_2_14_config(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        c = _C.nccl.Comm(UID, 4, 2, 10.0)
        print(json.dumps({
            "path": _C.nccl.loaded_path(), "version": pycoll.nccl_version(), "uid": len(UID),
            "size": val("stub_config_size"), "magic": val("stub_config_magic_ok"),
            "cfg_version": val("stub_config_version"), "blocking": val("stub_config_blocking"),
            "next_int": val("stub_config_next_int"), "polls": val("stub_polls"),
            "id_ok": bytes((ctypes.c_ubyte * 128).in_dll(stub, "stub_last_id")) == UID,
            "rank": c.rank, "world": c.world, "device": c.device, "aborted": c.aborted,
        }))
        """,
    )
    assert out["path"] == stub_lib
    assert out["version"] == "2.28.5"
    assert out["uid"] == 128 and out["id_ok"]
    # ncclConfig_t as NCCL 2.14 declared it: size, NCCL_API_MAGIC, version 2.14.0, blocking = 0; the
    # padding after `blocking` holds NCCL_CONFIG_UNDEF_INT.
    assert (out["size"], out["magic"], out["cfg_version"], out["blocking"]) == (24, 1, 21400, 0)
    assert out["next_int"] == -(2**31)
    assert out["polls"] >= 4  # polled through ncclInProgress until ncclSuccess
    assert (out["rank"], out["world"], out["aborted"]) == (2, 4, False)
    assert out["device"] == -1  # no GPU here: cudaGetDevice failed and NCCL (the stub) did not mind


def test_stub_init_timeout_aborts_and_names_rank_and_size(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        t = time.monotonic()
        name, text = expect(lambda: _C.nccl.Comm(UID, 3, 1, 0.5), CollectiveTimeoutError)
        print(json.dumps({"name": name, "text": text, "secs": time.monotonic() - t,
                          "aborts": val("stub_aborts")}))
        """,
        mode="init_hang",
    )
    assert out["name"] == "CollectiveTimeoutError"
    assert "rank 1 of a communicator of 3 ranks" in out["text"]
    assert "0.5 s" in out["text"] and "aborted" in out["text"]
    assert 0.4 < out["secs"] < 5.0
    assert out["aborts"] == 1


def test_stub_init_failure_carries_nccl_text(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        failed = expect(lambda: _C.nccl.Comm(UID, 2, 1, 10.0), NcclError)
        aborts_after_failed = val("stub_aborts")
        mode("init_reject")
        rejected = expect(lambda: _C.nccl.Comm(UID, 2, 1, 10.0), NcclError)
        bad_rank = expect(lambda: _C.nccl.Comm(UID, 2, 2, 10.0), InvalidUsageError)
        bad_id = expect(lambda: _C.nccl.Comm(UID[:100], 2, 0, 10.0), InvalidUsageError)
        print(json.dumps({"failed": failed, "rejected": rejected, "aborts": aborts_after_failed,
                          "bad_rank": bad_rank, "bad_id": bad_id}))
        """,
        mode="init_fail",
    )
    text = out["failed"][1]
    assert text.startswith("NCCL ncclCommInitRankConfig failed on rank 1: unhandled system error (stub)")
    assert "(ncclSystemError)" in text
    assert "last error: stub: socket connect to rank 1 refused" in text
    assert "a communicator of 2 ranks" in text
    assert "cudaGetDevice" in text  # why there was no device, from CUDA
    assert out["aborts"] == 1  # the failed communicator was freed
    rejected = out["rejected"][1]
    assert "invalid argument (stub) (ncclInvalidArgument); last error: stub: rank out of range" in rejected
    assert "rank 2 is not in [0, world size 2)" in out["bad_rank"][1]
    assert "128 bytes, got 100" in out["bad_id"][1]


def test_stub_codes_handed_to_nccl(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        from pycoll.arrays import DTYPE_CODES, OP_CODES
        c = _C.nccl.Comm(UID, 2, 0, 10.0)  # (the stub needs no second rank)
        buf = np.zeros(64, dtype=np.uint8)
        p = buf.ctypes.data
        types, ops = {}, {}
        for name, code in DTYPE_CODES.items():
            c.all_reduce(p, p, 3, code, OP_CODES["sum"], 0)
            types[name] = val("stub_last_dtype")
        for name, code in OP_CODES.items():
            c.all_reduce(p, p, 3, DTYPE_CODES["float32"], code, 0)
            ops[name] = val("stub_last_op")
        bad_dtype = expect(lambda: c.all_reduce(p, p, 3, 99, 0, 0), InvalidUsageError)
        bad_op = expect(lambda: c.all_reduce(p, p, 3, 0, 99, 0), InvalidUsageError)
        one = _C.nccl.Comm(UID, 1, 0, 10.0)
        one_rank_avg = []
        for call in (one.all_reduce, one.reduce_scatter):
            call(p, p, 3, DTYPE_CODES["float64"], OP_CODES["avg"], 0)
            one_rank_avg.append(val("stub_last_op"))
        print(json.dumps({"types": types, "ops": ops, "bad_dtype": bad_dtype, "bad_op": bad_op,
                          "one_rank_avg": one_rank_avg}))
        """,
    )
    # ncclDataType_t / ncclRedOp_t values from NCCL's nccl.h.
    assert out["types"] == {
        "float32": 7, "float64": 8, "float16": 6, "bfloat16": 9,
        "int32": 2, "int64": 4, "uint8": 1, "int8": 0,
    }  # fmt: skip
    assert out["ops"] == {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
    # At one rank an average is its input: asked for as a sum (NCCL 2.28.9's one-rank average left the tail
    # of a large float64 out-of-place call unwritten on an H100)
    assert out["one_rank_avg"] == [0, 0]
    assert "unknown dtype code 99" in out["bad_dtype"][1]
    assert "unknown op code 99" in out["bad_op"][1]


def test_stub_collectives_and_self_send_recv_in_a_group(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        c = _C.nccl.Comm(UID, 1, 0, 10.0)
        x = np.arange(37, dtype=np.float64); y = np.zeros_like(x)
        c.all_reduce(x.ctypes.data, y.ctypes.data, x.size, 1, 0, 0)
        ar = (y == x).all() and val("stub_last_count") == 37
        y[:] = 0
        c.reduce_scatter(x.ctypes.data, y.ctypes.data, 37, 1, 1, 0)
        rs = (y == x).all()
        y[:] = 0
        c.all_gather(x.ctypes.data, y.ctypes.data, 37, 1, 0)
        ag = (y == x).all()
        y[:] = 0
        c.broadcast(x.ctypes.data, y.ctypes.data, 37, 1, 0, 0)
        bc = (y == x).all() and val("stub_last_root") == 0
        bad_root = expect(lambda: c.broadcast(x.ctypes.data, y.ctypes.data, 37, 1, 1, 0), InvalidUsageError)
        y[:] = 0
        polls = val("stub_polls")
        _C.nccl.group_start()
        c.send(x.ctypes.data, x.nbytes, 0, 0)
        c.recv(y.ctypes.data, y.nbytes, 0, 0)
        queued_without_polling = val("stub_polls") == polls
        _C.nccl.group_end()
        sr = (y == x).all() and val("stub_last_peer") == 0 and val("stub_last_dtype") == 1
        bad_peer = expect(lambda: c.send(x.ctypes.data, 8, 1, 0), InvalidUsageError)
        print(json.dumps({"ar": bool(ar), "rs": bool(rs), "ag": bool(ag), "bc": bool(bc), "sr": bool(sr),
                          "queued": queued_without_polling, "polled": val("stub_polls") > polls,
                          "bad_root": bad_root, "bad_peer": bad_peer}))
        """,
    )
    assert out["ar"] and out["rs"] and out["ag"] and out["bc"] and out["sr"]
    assert out["queued"] and out["polled"]  # group_end, not send/recv, waited for the launch
    assert "root 1 is not in [0, 1)" in out["bad_root"][1]
    assert "peer 1 is not in [0, 1)" in out["bad_peer"][1]


def test_stub_launch_timeout_aborts_then_calls_raise_broken(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        c = _C.nccl.Comm(UID, 2, 0, 0.3)
        mode("launch_hang")
        buf = np.zeros(4, dtype=np.float32); p = buf.ctypes.data
        hang = expect(lambda: c.all_reduce(p, p, 4, 0, 0, 0), CollectiveTimeoutError)
        aborted, aborts = c.aborted, val("stub_aborts")
        broken = expect(lambda: c.all_reduce(p, p, 4, 0, 0, 0), CommunicatorBrokenError)
        mode("group_hang")
        c2 = _C.nccl.Comm(UID, 2, 0, 0.3)
        _C.nccl.group_start()
        c2.send(p, 16, 1, 0)
        c2.recv(p, 16, 1, 0)
        group = expect(_C.nccl.group_end, CollectiveTimeoutError)
        print(json.dumps({"hang": hang, "aborted": aborted, "aborts": aborts, "broken": broken,
                          "group": group, "c2_aborted": c2.aborted, "aborts2": val("stub_aborts")}))
        """,
    )
    hang = out["hang"][1]
    assert "NCCL ncclAllReduce did not finish within 0.3 s on rank 0 of a communicator of 2 ranks" in hang
    assert out["aborted"] and out["aborts"] == 1
    assert "the communicator was aborted" in out["broken"][1]
    assert "NCCL ncclGroupEnd did not finish within 0.3 s on rank 0" in out["group"][1]
    assert out["c2_aborted"] and out["aborts2"] == 2


def test_stub_abort_from_another_thread_ends_a_wait(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        import threading
        c = _C.nccl.Comm(UID, 2, 0, 30.0)
        mode("launch_hang")
        buf = np.zeros(4, dtype=np.float32); p = buf.ctypes.data
        threading.Timer(0.3, c.abort).start()
        t = time.monotonic()
        name, text = expect(lambda: c.all_reduce(p, p, 4, 0, 0, 0), CommunicatorBrokenError)
        print(json.dumps({"text": text, "secs": time.monotonic() - t, "aborted": c.aborted,
                          "aborts": val("stub_aborts")}))
        """,
    )
    assert "NCCL ncclAllReduce on rank 0: the communicator was aborted while waiting" in out["text"]
    assert out["secs"] < 5.0
    assert out["aborted"] and out["aborts"] == 1


def test_stub_remote_error_is_peer_lost_and_abort_breaks(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        import gc
        c = _C.nccl.Comm(UID, 2, 0, 10.0)
        buf = np.zeros(4, dtype=np.float32); p = buf.ctypes.data
        mode("remote_error")
        c.all_reduce(p, p, 4, 0, 0, 0)
        lost = expect(c.check_async, PeerLostError)
        del c; gc.collect()
        aborts_after_del = val("stub_aborts")
        mode("")
        c = _C.nccl.Comm(UID, 2, 0, 10.0)
        c.check_async()
        c.abort()
        c.abort()  # a second abort does nothing
        broken = expect(c.check_async, CommunicatorBrokenError)
        print(json.dumps({"lost": lost, "aborts_after_del": aborts_after_del, "aborted": c.aborted,
                          "broken": broken, "aborts": val("stub_aborts"), "destroys": val("stub_destroys")}))
        """,
    )
    assert out["lost"][0] == "PeerLostError"
    assert "ncclRemoteError" in out["lost"][1] and "stub: rank 1 exited" in out["lost"][1]
    assert "rank 0" in out["lost"][1]
    assert out["aborts_after_del"] == 1  # a failed communicator is aborted, not destroyed
    assert out["aborted"] and out["aborts"] == 2 and out["destroys"] == 0
    assert "was aborted" in out["broken"][1]


def test_stub_destroy_finalizes_and_gc_destroys(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        import gc
        c = _C.nccl.Comm(UID, 2, 0, 10.0)
        c.destroy()
        after_destroy = [val("stub_finalizes"), val("stub_destroys"), c.destroyed]
        c.destroy()  # a second destroy does nothing
        broken = expect(lambda: c.broadcast(0, 0, 0, 0, 0, 0), CommunicatorBrokenError)
        c = _C.nccl.Comm(UID, 2, 0, 10.0)
        del c; gc.collect()
        print(json.dumps({"after_destroy": after_destroy, "broken": broken,
                          "finalizes": val("stub_finalizes"), "destroys": val("stub_destroys"),
                          "aborts": val("stub_aborts")}))
        """,
    )
    assert out["after_destroy"] == [1, 1, True]
    assert "was destroyed" in out["broken"][1]
    assert (out["finalizes"], out["destroys"], out["aborts"]) == (2, 2, 0)


def test_stub_ctrl_c_during_init_aborts(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        import signal, threading
        # Python leaves SIGINT ignored when it started ignored (a background job of a shell without job
        # control): install the handler that raises KeyboardInterrupt, as an interactive run has it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
        t = time.monotonic()
        name, _ = expect(lambda: _C.nccl.Comm(UID, 2, 1, 30.0), KeyboardInterrupt)
        print(json.dumps({"name": name, "secs": time.monotonic() - t, "aborts": val("stub_aborts")}))
        """,
        mode="init_hang",
    )
    assert out["name"] == "KeyboardInterrupt"
    assert out["secs"] < 5.0
    assert out["aborts"] == 1


def test_stub_loading_rules(stub_lib: str, tmp_path: Path) -> None:
    other = tmp_path / "libnccl_other.so"
    shutil.copy(stub_lib, other)
    out = run_stub(
        stub_lib,
        f"""
        same = load_nccl() == path and _C.nccl.load(path) is None
        other = expect(lambda: _C.nccl.load({str(other)!r}), InvalidUsageError)
        print(json.dumps({{"same": same, "other": other}}))
        """,
    )
    assert out["same"]
    assert "already loaded from" in out["other"][1]


def test_stub_old_nccl_is_refused(stub_lib: str, tmp_path: Path) -> None:
    out = run_py(
        PRELUDE
        + f"""
import ctypes
from pycoll import _C
from pycoll.errors import NcclError
ctypes.c_int.in_dll(ctypes.CDLL({stub_lib!r}), "stub_version").value = 21306
before = expect(_C.nccl.version)
name, text = expect(lambda: _C.nccl.load({stub_lib!r}), NcclError)
print(json.dumps({{"before": before, "text": text, "loaded": _C.nccl.is_loaded()}}))
"""
    )
    assert out["before"][0] == "InvalidUsageError" and "not loaded" in out["before"][1]
    assert "21306" in out["text"] and "NCCL >= 2.14" in out["text"]
    assert out["loaded"] is False


def test_create_nccl_comm_shares_the_unique_id_through_the_store(stub_lib: str) -> None:
    out = run_stub(
        stub_lib,
        """
        import threading
        from pycoll.bootstrap import TCPStoreClient, TCPStoreServer
        from pycoll.nccl import create_nccl_comm
        server = TCPStoreServer("127.0.0.1", 0)
        comms, errors = {}, []
        def rank(r):
            try:
                store = TCPStoreClient("127.0.0.1", server.port, timeout=10)
                comms[r] = create_nccl_comm(store, r, 2, timeout=10)
            except BaseException as exc:
                errors.append(repr(exc))
        threads = [threading.Thread(target=rank, args=(r,)) for r in (1, 0)]
        for t in threads: t.start()
        for t in threads: t.join()
        ids_ok = bytes((ctypes.c_ubyte * 128).in_dll(stub, "stub_last_id")) == UID
        lonely = TCPStoreClient("127.0.0.1", server.port, timeout=10)
        late = expect(lambda: create_nccl_comm(lonely, 1, 2, timeout=0.3), CollectiveTimeoutError)
        print(json.dumps({"errors": errors, "ranks": sorted((c.rank, c.world) for c in comms.values()),
                          "inits": val("stub_inits"), "ids_ok": ids_ok, "late": late}))
        server.close()
        """,
    )
    assert out["errors"] == []
    assert out["ranks"] == [[0, 2], [1, 2]]
    assert out["inits"] == 2 and out["ids_ok"]
    assert "rank 0 did not publish the NCCL unique id" in out["late"][1]


# ---------------------------------------------------------------------------------------------------
# The real NCCL, when a wheel (or NCCL_LIBRARY) provides one


def _real_nccl() -> libraries.LibraryInfo:
    info = libraries.find_nccl(load=True)
    if not info.usable:
        pytest.skip(f"no usable NCCL installed (pip install nvidia-nccl-cu13): {info.error}")
    if not _C.nccl.built():
        pytest.skip("pycoll was built without CUDA (no nvcc): there is no NCCL binding to test")
    return info


def test_real_nccl_version_matches_ctypes() -> None:
    info = _real_nccl()
    assert info.path is not None
    out = run_py(
        """
import json, pycoll
from pycoll import _C
print(json.dumps({"version": pycoll.nccl_version(), "path": _C.nccl.loaded_path()}))
"""
    )
    assert out["path"] == info.path
    assert out["version"] == libraries.nccl_version(info.path) == info.version


def test_real_nccl_comm_without_gpu_raises_nccl_text_or_works_with_one() -> None:
    _real_nccl()
    out = run_py(
        PRELUDE
        + """
from pycoll import _C
from pycoll.errors import PycollError
from pycoll.nccl import load_nccl
load_nccl()
uid = _C.nccl.unique_id()
t = time.monotonic()
try:
    c = _C.nccl.Comm(uid, 1, 0, 30.0)
except PycollError as exc:
    result = {"error": [type(exc).__name__, str(exc)]}
else:
    result = {"world": c.world, "device": c.device}
    c.destroy()
result["secs"] = time.monotonic() - t
print(json.dumps(result))
""",
        timeout=120,
    )
    assert out["secs"] < 30
    if "error" in out:  # no GPU (this machine): NCCL's own words, the call and the rank
        name, text = out["error"]
        assert name == "NcclError"
        assert text.startswith("NCCL ncclCommInitRankConfig failed on rank 0: ")
        assert re.search(r"\((ncclUnhandledCudaError|ncclSystemError|ncclInvalidUsage)\)", text)
        assert "last error: " in text
    else:  # a GPU: a communicator of one rank forms
        assert out["world"] == 1 and out["device"] >= 0
