"""The benchmark package's job protocol (pycoll/bench/jobs.py): a Job, its wire format, the commands that
start its ranks, and run_job end to end when pycoll is built."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from pycoll.bench import jobs
from pycoll.bench.jobs import Job, run_job
from pycoll.bootstrap.spawn import module_command

REPO = Path(__file__).resolve().parents[2]


def _native_available() -> bool:
    try:
        return importlib.util.find_spec("pycoll._C") is not None
    except (ImportError, ValueError):
        return False


needs_native = pytest.mark.skipif(not _native_available(), reason="pycoll's native module is not built")


def test_job_lists_are_tuples_and_a_string_is_one_item() -> None:
    job = Job(algorithm="ring", compression=["none", "int8"], baseline="gloo", prefix=["taskset", "-c", "0"])
    assert job.algorithm == ("ring",) and job.compression == ("none", "int8") and job.baseline == ("gloo",)
    assert job.prefix == ("taskset", "-c", "0")
    assert Job().op == ("sum",) and Job().datatype == ("float32",) and Job().baseline == ()


def test_job_round_trips_through_json_without_the_launcher_fields() -> None:
    job = Job(
        ranks=3,
        minbytes=1 << 20,
        maxbytes=8 << 20,
        stepfactor=4,
        iters=7,
        warmup_iters=0,
        check=0,
        op=("min", "max"),
        datatype=("float16",),
        algorithm=("ring", "tree"),
        compression=("none", "auto"),
        baseline=("gloo",),
        json="/tmp/r.jsonl",
        table=False,
        error_budget=0.05,
        collective="reduce_scatter",
        link_iters=5,
        link_iface="veth0",
        env={"PYCOLL_TUNING_FILE": "none"},
        prefix=("env",),
    )
    data = json.loads(job.to_json())
    assert (data["collective"], data["link_iters"], data["link_iface"]) == ("reduce_scatter", 5, "veth0")
    assert "env" not in data and "prefix" not in data  # they stay with the launcher
    again = Job.from_json(job.to_json())
    assert again.env is None and again.prefix == ()
    assert again == Job(**{**job.__dict__, "env": None, "prefix": ()})
    assert Job.from_json(json.dumps({**data, "something_newer": 1})) == again  # unknown keys ignored


def test_rank_command_runs_the_worker_of_this_pycoll() -> None:
    job = Job(ranks=2, maxbytes=8192)
    cmd = jobs.rank_command(job)
    assert cmd == module_command("pycoll.bench.worker", ["--job", job.to_json()])
    assert jobs.rank_arguments(job) == cmd[1:]
    assert jobs.job_command(job) == module_command("pycoll.bench.jobs", ["--job", job.to_json()])


def test_launch_command_under_pycoll_run_mpirun_and_a_prefix() -> None:
    plain = jobs.launch_command(Job(ranks=3))
    rank = jobs.rank_command(Job(ranks=3))
    assert plain == module_command("pycoll.run", ["-n", "3", *rank[1:]])
    assert plain == jobs.script_command(3, rank[1], rank[2:])
    wrapped = jobs.launch_command(Job(ranks=3, prefix=("ip", "netns", "exec", "h0")))
    assert wrapped == ["ip", "netns", "exec", "h0", *plain]
    mpi = jobs.launch_command(Job(ranks=2, baseline=("mpi",), prefix=("env",)))
    assert mpi[0] == "env" and Path(mpi[1]).name == "mpirun" and mpi[mpi.index("-n") + 1] == "2"
    assert mpi[-len(jobs.rank_command(Job(ranks=2, baseline=("mpi",)))) :] == jobs.rank_command(
        Job(ranks=2, baseline=("mpi",))
    )


def test_job_result() -> None:
    record = {
        "bytes": 4096,
        "count": 1024,
        "dtype": "float32",
        "redop": "sum",
        "time_us": 2.0,
        "algbw_GBps": 2.048,
        "busbw_GBps": 2.048,
        "wrong": 0,
        "world": 2,
        "iters": 5,
        "warmup": 2,
        "library": "pycoll",
        "algorithm": "ring",
        "host": "h",
    }
    done = jobs.JobResult(0, [record])
    assert done.ok and not jobs.JobResult(1, []).ok
    (result,) = done.results
    assert result.label == "pycoll/ring" and result.time_us == 2.0 and result.wrong == 0


@needs_native
def test_run_job_collects_rank_zeros_records(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    done = run_job(Job(ranks=2, minbytes=4096, maxbytes=8192, algorithm=("ring", "direct"), progress="off"))
    assert done.returncode == 0
    assert [(r.bytes, r.label, r.wrong) for r in done.results] == [
        (4096, "pycoll/ring", 0),
        (4096, "pycoll/direct", 0),
        (8192, "pycoll/ring", 0),
        (8192, "pycoll/direct", 0),
    ]
    assert all(r["host"] and r["library_version"].startswith("pycoll ") for r in done.records)
    out = capfd.readouterr().out
    assert "# Out of bounds values : 0" in out and "pycoll/direct" in out
    # with json= the records also stay in that file; table=False prints nothing; a prefix wraps the launcher
    path = tmp_path / "r.jsonl"
    quiet = run_job(Job(ranks=2, maxbytes=4096, json=str(path), table=False, prefix=("env",)))
    assert quiet.returncode == 0 and len(quiet.records) == 1
    assert [json.loads(line) for line in path.read_text().splitlines()] == quiet.records
    assert "Out of bounds" not in capfd.readouterr().out


@needs_native
def test_run_job_reports_a_failed_rank() -> None:
    # avg on an integer type leaves no sweep to run: every rank fails, and run_job says so
    done = run_job(Job(ranks=2, maxbytes=4096, op=("avg",), datatype=("int8",), progress="off"))
    assert done.returncode != 0 and done.records == [] and not done.ok


def test_jobs_module_runs_a_job_in_a_process_of_its_own() -> None:
    proc = subprocess.run(
        [*module_command("pycoll.bench.jobs"), "--help"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and "--job" in proc.stdout
