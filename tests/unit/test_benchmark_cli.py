"""``pycoll bench`` (pycoll/cli/bench.py): arguments, and a short end-to-end run when pycoll is built."""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pycoll.bench import jobs, options
from pycoll.cli import bench

REPO = Path(__file__).resolve().parents[2]


def test_defaults() -> None:
    args = bench.build_parser().parse_args([])
    assert args.ranks == 4
    assert (args.minbytes, args.maxbytes, args.stepfactor) == (4096, 64 << 20, 2)
    assert args.iters is None and args.warmup_iters is None
    assert args.check == 1 and args.algorithm == ["auto"] and not args.worker and args.json is None
    assert args.op == ["sum"] and args.datatype == ["float32"] and args.compression == ["none"]
    assert args.baseline == [] and args.plot is None and args.progress == "auto"


def test_worker_arguments_round_trip(tmp_path: Path) -> None:
    parser = bench.build_parser()
    out = tmp_path / "r.jsonl"
    args = parser.parse_args(
        ["--ranks", "2", "-b", "1M", "-e", "8M", "-f", "4", "-n", "3", "-w", "0", "-c", "0"]
        + ["--algorithm", "ring", "--json", str(out)]
    )
    job = bench.job_from_args(args)
    assert jobs.rank_command(job)[2:4] == ["pycoll.bench.worker", "--job"]
    again = jobs.Job.from_json(jobs.rank_command(job)[-1])
    assert again == job
    for name in ("minbytes", "maxbytes", "stepfactor", "iters", "warmup_iters", "check"):
        assert getattr(again, name) == getattr(args, name), name
    assert list(again.algorithm) == args.algorithm
    assert again.json == str(out.resolve())
    # the flags of `pycoll bench --worker` describe the same job
    flags = ["-b", "1M", "-e", "8M", "-f", "4", "-n", "3", "-w", "0", "-c", "0", "--algorithm", "ring"]
    worker = parser.parse_args(["--worker", *flags, "--json", str(out), "--ranks", "2"])
    assert worker.worker and bench.job_from_args(worker) == job


def test_rejects_bad_arguments() -> None:
    parser = bench.build_parser()
    for bad in (["--algorithm", "star"], ["-c", "2"], ["-n", "0"], ["-b", "x"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert bench.main(parser.parse_args(["--ranks", "0"])) == 2


def test_registered_in_pycoll_command() -> None:
    from pycoll.cli import main

    parser = main.build_parser()
    args = parser.parse_args(["bench", "--ranks", "2", "-e", "8K"])
    assert args.func is bench.main and args.ranks == 2 and args.maxbytes == 8192


def test_help_does_not_import_numpy() -> None:
    code = "import sys; from pycoll.cli import bench; bench.build_parser(); print('numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _native_available() -> bool:
    try:
        return importlib.util.find_spec("pycoll._C") is not None
    except ImportError:
        return False


@pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
@pytest.mark.parametrize("ranks", [1, 2])
def test_end_to_end(tmp_path: Path, ranks: int) -> None:
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", str(ranks), "-b", "4K", "-e", "64K"]
    cmd += ["-f", "4", "-n", "3", "-w", "1", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert [row[0] for row in rows] == ["4096", "16384", "65536"]
    assert all(row[-1] == "0" for row in rows)  # #wrong
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["wrong"] for r in records] == [0, 0, 0]
    assert all(r["library"] == "pycoll" and r["world"] == ranks for r in records)


def test_compression_flag() -> None:
    parser = bench.build_parser()
    assert parser.parse_args([]).compression == ["none"]
    assert parser.parse_args(["--compression", "int8"]).compression == ["int8"]
    args = parser.parse_args(["--compression", "none, INT4,fp16,int4"])
    assert args.compression == ["none", "int4", "fp16"]  # in order, without repeats
    for bad in ("int2", "", ",", "int8,zstd"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--compression", bad])


def test_compression_names_are_the_codecs() -> None:
    from pycoll.compression import CODEC_NAMES

    assert options.COMPRESSIONS == ("none", *CODEC_NAMES)


def test_worker_arguments_carry_compression() -> None:
    parser = bench.build_parser()
    args = parser.parse_args(["--compression", "none,int8", "--algorithm", "tree"])
    job = bench.job_from_args(args)
    assert job.compression == ("none", "int8")
    again = jobs.Job.from_json(job.to_json())
    assert again.compression == ("none", "int8") and again.algorithm == ("tree",)
    assert bench.job_from_args(parser.parse_args([])).compression == ("none",)


def test_codec_inputs_judge_with_the_derived_bound() -> None:
    """Gaussian inputs; a result within the codec's bound is right, one pushed past it is wrong."""
    if not _native_available():
        pytest.skip("pycoll's native module is not built")
    import numpy as np

    from pycoll.bench.inputs import gaussian_input
    from pycoll.bench.variants import CodecInputs
    from pycoll.compression import Int8

    codec, world, count = Int8(), 3, 1000
    inputs = CodecInputs(codec, "direct")
    xs = [inputs.input(r, world, count, np.float32) for r in range(world)]
    assert all(x.dtype == np.float32 and x.shape == (count,) for x in xs)
    assert not np.array_equal(xs[0], xs[1]) and 0.5 < float(np.std(xs[0])) < 1.5
    np.testing.assert_array_equal(xs[2], gaussian_input(2, count))
    exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
    # two-shot on one process: every share quantized once, the owner's sum once more
    summed = np.sum([codec.roundtrip(x).astype(np.float64) for x in xs], axis=0).astype(np.float32)
    result = codec.roundtrip(summed)
    judge = inputs.judge(1, world, count, np.float32)
    wrong, rel = judge(result)
    assert wrong == 0
    assert rel == pytest.approx(np.linalg.norm(result - exact) / np.linalg.norm(exact))
    assert 1e-4 < rel < 0.02
    assert judge(result.copy()) == (wrong, rel)  # same bits: the verdict is reused
    bad = result.copy()
    bad[:7] += 1.0  # far outside half an int8 step
    assert judge(bad)[0] == 7
    bad[500] = np.nan
    assert judge(bad)[0] > 7  # NaN is never within the bound
    assert judge(exact.astype(np.float32)) == (0, pytest.approx(0.0, abs=1e-7))


@pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
@pytest.mark.parametrize("name", ["reduce_scatter", "all_gather"])
def test_codec_inputs_judge_reduce_scatter_and_all_gather(name: str) -> None:
    """A compressed reduce-scatter's or all-gather's result as pycoll's direct plan makes it (each chunk
    encoded once, blocks from the chunk's start) is right; one pushed past the codec's bound is wrong."""
    import numpy as np

    from pycoll.bench.variants import CodecInputs
    from pycoll.compression import Int8

    codec, world, count, owner = Int8(), 3, 3000, 1
    m = count // world  # 1000: not whole blocks of 64
    inputs = CodecInputs(codec, "direct", collective=name)
    xs = [inputs.input(r, world, count, np.float32) for r in range(world)]
    assert [x.size for x in xs] == [count if name == "reduce_scatter" else m] * world
    if name == "reduce_scatter":
        chunks = [x[owner * m : (owner + 1) * m] for x in xs]
        result = chunks[owner].copy()  # the owner's own share is exact, the others' decoded
        for r in range(world):
            if r != owner:
                result += codec.roundtrip(chunks[r])
        exact = np.sum([c.astype(np.float64) for c in chunks], axis=0)
    else:
        result = np.concatenate([codec.roundtrip(x) for x in xs])
        exact = np.concatenate(xs).astype(np.float64)
    judge = inputs.judge(owner, world, count, np.float32)
    wrong, rel = judge(result)
    assert wrong == 0 and rel == pytest.approx(np.linalg.norm(result - exact) / np.linalg.norm(exact))
    assert 1e-4 < rel < 0.02
    bad = result.copy()
    bad[[0, 500, m - 1]] += 0.5  # far outside half an int8 step
    assert judge(bad)[0] == 3
    bad[7] = np.nan
    assert judge(bad)[0] == 4


@pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
def test_end_to_end_compressed(tmp_path: Path) -> None:
    out = tmp_path / "bench.jsonl"
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", "2", "-b", "16K", "-e", "64K", "-f", "4"]
    cmd += ["-n", "3", "-w", "1", "--compression", "none,int8,fp16,int4", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "effective" in lines[0] and "compression=none,int8,fp16,int4" in lines[0]
    assert lines[1].split()[1:] == [
        "size",
        "count",
        "type",
        "redop",
        "codec",
        "time",
        "algbw",
        "busbw",
        "error",
        "#wrong",
    ]
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    # interleaved: every codec in turn for each size
    assert [(row[0], row[4]) for row in rows] == [
        (size, codec) for size in ("16384", "65536") for codec in ("none", "int8", "fp16", "int4")
    ]
    assert all(row[-1] == "0" for row in rows)  # #wrong: all within the codec's bound
    errors = {(row[0], row[4]): float(row[-2]) for row in rows}
    for size in ("16384", "65536"):
        assert errors[size, "none"] == 0.0
        assert 0 < errors[size, "fp16"] < 1e-3
        assert 1e-3 < errors[size, "int8"] < 0.02
        assert 0.02 < errors[size, "int4"] < 0.3
    assert any(line.startswith("# Max rel. error") for line in lines)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["codec"] for r in records] == ["none", "int8", "fp16", "int4"] * 2
    assert all(r["wrong"] == 0 and r["world"] == 2 and r["library"] == "pycoll" for r in records)
    for r, row in zip(records, rows):
        assert r["rel_error"] == pytest.approx(errors[row[0], row[4]], rel=0.01, abs=0)
    assert records[1]["codecs"]["int8"] == "int8(block=64)" and records[1]["codec_algorithm"] == "direct"
    # effective bandwidth: the uncompressed bytes over the time
    for r in records:
        assert r["bytes"] == 4 * r["count"]
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2 ranks: 2(n-1)/n = 1


@pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
@pytest.mark.parametrize("algorithm", ["ring", "tree"])
def test_end_to_end_compressed_algorithms(algorithm: str) -> None:
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", "3", "-b", "40K", "-e", "40K", "-n", "2"]
    cmd += ["-w", "1", "--algorithm", algorithm, "--compression", "int4,bf16"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert [row[4] for row in rows] == ["int4", "bf16"]
    assert all(row[-1] == "0" and float(row[-2]) > 0 for row in rows)


def test_namespace_from_main_parser_is_accepted_by_job_from_args() -> None:
    ns = argparse.Namespace(
        minbytes=4096,
        maxbytes=8192,
        stepfactor=2.0,
        check=1,
        algorithm="auto",
        iters=None,
        warmup_iters=None,
        json=None,
    )
    job = bench.job_from_args(ns)
    assert (job.minbytes, job.maxbytes, job.stepfactor, job.check) == (4096, 8192, 2.0, 1)
    assert job.algorithm == ("auto",) and job.iters is None and job.warmup_iters is None and job.json is None
    assert (job.op, job.datatype, job.compression, job.baseline) == (("sum",), ("float32",), ("none",), ())


# ---------------------------------------------------------------------------------------------------
# --collective: reduce-scatter and all-gather (nccl-tests' reduce_scatter_perf, all_gather_perf)


def test_collective_flag(capsys: pytest.CaptureFixture[str]) -> None:
    parser = bench.build_parser()
    assert parser.parse_args([]).collective == "allreduce"
    for text, name in (
        ("reduce_scatter", "reduce_scatter"),
        ("all-gather", "all_gather"),
        ("AllReduce", "allreduce"),
    ):
        assert parser.parse_args(["--collective", text]).collective == name
    job = bench.job_from_args(parser.parse_args(["--collective", "allgather", "--link-bytes", "4"]))
    assert (job.collective, job.link_iters, job.link_iface) == ("all_gather", 4, None)
    assert jobs.Job.from_json(job.to_json()) == job
    for bad in (["--collective", "broadcast"], ["--collective", ""], ["--link-bytes", "-1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    err = capsys.readouterr().err
    assert "collective must be one of allreduce, reduce_scatter, all_gather, got 'broadcast'" in err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--algorithm", "ring,tree"],
            "--collective reduce_scatter runs --algorithm auto, ring, direct, hierarchical; not tree",
        ),
        (
            ["--algorithm", "ring", "--compression", "none,int8"],
            "runs algorithm direct or hierarchical (or auto)",
        ),
        (["--calibrate"], "--calibrate fits the all-reduce's cost model"),
    ],
)
def test_collective_rules_out_flags(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = bench.build_parser()
    args = parser.parse_args(["--collective", "reduce_scatter", *flags])
    assert message in (bench.check_arguments(args) or "")
    assert bench.main(args) == 2  # refused before anything starts
    err = capsys.readouterr().err
    assert err.startswith("pycoll bench: error: ") and message in err and err.count("\n") == 1
    # the same flags are fine for the all-reduce
    assert bench.check_arguments(parser.parse_args(flags)) is None


def test_all_gather_takes_no_op() -> None:
    parser = bench.build_parser()
    assert bench.check_arguments(parser.parse_args(["--collective", "all_gather", "-d", "all"])) is None
    message = bench.check_arguments(parser.parse_args(["--collective", "all_gather", "-o", "max"]))
    assert message == "--collective all_gather reduces nothing: -o max does not apply"


def _run_bench(*flags: str) -> tuple[list[str], list[dict]]:
    out_dir = Path(tempfile.mkdtemp(prefix="pycoll-bench-test-"))
    out = out_dir / "bench.jsonl"
    cmd = [sys.executable, "-m", "pycoll.cli.bench", "--ranks", "2", *flags, "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    shutil.rmtree(out_dir)
    return proc.stdout.splitlines(), records


@pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")
@pytest.mark.parametrize("name", ["reduce_scatter", "all_gather"])
def test_end_to_end_reduce_scatter_and_all_gather(name: str) -> None:
    flags = ["--collective", name, "-b", "64K", "-e", "256K", "-f", "4", "-n", "3", "-w", "1"]
    lines, records = _run_bench(*flags, "--algorithm", "ring,direct", "--compression", "none,int8")
    assert f"pycoll.{name}(algorithm=ring,direct, compression=none,int8), 2 ranks" in lines[0]
    assert "busbw = algbw * (n-1)/n" in lines[0]
    rows = [line.split() for line in lines if line and not line.startswith("#")]
    assert [(row[0], row[4], row[5]) for row in rows] == [
        (size, variant, codec)
        for size in ("65536", "262144")
        for variant, codec in (("pycoll/ring", "none"), ("pycoll/direct", "none"), ("pycoll/direct", "int8"))
    ]
    assert all(row[-1] == "0" for row in rows)  # #wrong: exact, or within int8's bound
    assert {row[3] for row in rows} == {"sum" if name == "reduce_scatter" else "none"}
    errors = [float(row[-2]) for row in rows]
    assert errors[0::3] == errors[1::3] == [0.0, 0.0] and all(1e-3 < e < 0.02 for e in errors[2::3])
    plans = "direct or hierarchical (or auto)"
    assert f"# a compressed {name} runs algorithm {plans} only: no codec with ring" in lines
    for r in records:
        assert r["collective"] == name and r["wrong"] == 0 and r["world"] == 2
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] / 2)  # (n-1)/n
        assert r["bytes"] == 4 * r["count"] and r["link_tx_bytes"] == []
    assert records[2]["codec_algorithm"] == "direct"
