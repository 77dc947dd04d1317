"""The job protocol: a ``Job`` says what to benchmark on how many local ranks, and ``run_job(job)``
runs it and collects the results. Every program that times collectives over several ranks goes
through here: ``pycoll bench``, calibration (pycoll/tuning/calibrate.py), the pytest-benchmark suites
and the scripts in bench/.

``run_job`` builds the ranks' command (``rank_command``: ``pycoll.bench.worker --job JSON`` through
``pycoll.bootstrap.spawn.module_command``, so a rank imports the very pycoll that started it),
launches it (``pycoll run``'s launcher; ``mpirun`` when the job times the MPI baseline), waits, and
reads back the JSON records rank 0 wrote (``Job.json``, else a temporary file). A failed rank is
reported by the launcher in one line and gives a non-zero ``JobResult.returncode``.

``Job``'s fields carry the names of ``pycoll bench``'s flags (``minbytes``, ``stepfactor``,
``warmup_iters``, ``op``, ``datatype``, ``compression``...), so a job reads like its command line and
``report.run_and_report`` takes it where it takes the parsed flags. ``env`` (added to the ranks'
environment) and ``prefix`` (a wrapper command the launcher runs under, e.g. ``["ip", "netns",
"exec", "ns0"]`` or ``["taskset", "-c", "0"]``) stay on the launcher's side; everything else travels to
the ranks as JSON (``to_json`` / ``from_json``).

``python -m pycoll.bench.jobs --job JSON`` runs ``run_job`` in a process of its own (what a script
with a timeout on the whole job starts: ``job_command``). A benchmark whose ranks run a script of its
own starts them with ``script_command`` (``pycoll run -n N script``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from pycoll.bootstrap.spawn import module_command

if TYPE_CHECKING:
    from pycoll.bench.timing import Result

__all__ = [
    "Job",
    "JobResult",
    "job_command",
    "launch_command",
    "rank_arguments",
    "rank_command",
    "run_job",
    "script_command",
]

#: The module a rank runs (``pycoll.bench.worker``).
WORKER_MODULE = "pycoll.bench.worker"
#: Fields that stay with the launcher (not sent to the ranks).
_LAUNCHER_FIELDS = ("env", "prefix")
_LIST_FIELDS = ("op", "datatype", "algorithm", "compression", "baseline", "prefix")


@dataclass(frozen=True)
class Job:
    """One benchmark job: ``ranks`` local ranks timing every variant (algorithm x codec, and the
    baselines) of ``collective`` for every (type, op) interleaved, size by size, as ``pycoll bench``
    does."""

    #: Local rank processes to start.
    ranks: int = 4
    #: "allreduce", "reduce_scatter" or "all_gather" (``--collective``; ``pycoll.bench.collectives``).
    collective: str = "allreduce"
    #: Sizes: ``minbytes``, ``minbytes * stepfactor``, ... up to ``maxbytes`` (``-b`` / ``-e`` / ``-f``).
    minbytes: int = 4096
    maxbytes: int = 64 << 20
    stepfactor: float = 2.0
    #: Timed / warm-up iterations per size (``-n`` / ``-w``; None: automatic).
    iters: int | None = None
    warmup_iters: int | None = None
    #: 1: check every result (``-c``).
    check: int = 1
    #: nccl-tests' ops and numpy's type names (``-o`` / ``-d``).
    op: tuple[str, ...] = ("sum",)
    datatype: tuple[str, ...] = ("float32",)
    #: pycoll's algorithms and codecs (``--algorithm`` / ``--compression``; a codec "auto" times
    #: ``compression="auto"`` within ``error_budget``), and the baselines (``--baseline``).
    algorithm: tuple[str, ...] = ("auto",)
    compression: tuple[str, ...] = ("none",)
    baseline: tuple[str, ...] = ()
    #: Where rank 0 writes the JSON records (``--json``; None: a temporary file of ``run_job``).
    json: str | None = None
    #: ``--plot`` / ``--plot-yscale`` / ``--progress``.
    plot: str | None = None
    plot_yscale: str = "linear"
    progress: str = "auto"
    #: Rank 0 prints the table (False: only the records are written; calibration).
    table: bool = True
    #: The error budget of the codec "auto".
    error_budget: float = 1e-2
    #: Calls per (size, variant) whose network traffic is counted (``--link-bytes``; 0: none), on
    #: interface ``link_iface`` (None: the one PYCOLL_SOCKET_IFNAME names): ``pycoll.bench.link``.
    link_iters: int = 0
    link_iface: str | None = None
    #: Added to the ranks' environment (launcher side only).
    env: Mapping[str, str] | None = field(default=None, compare=False)
    #: A wrapper command the launcher (or mpirun) runs under (launcher side only).
    prefix: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in _LIST_FIELDS:
            value = getattr(self, name)
            object.__setattr__(self, name, (value,) if isinstance(value, str) else tuple(value))

    @property
    def uses_mpirun(self) -> bool:
        """The ranks are started by ``mpirun`` (the MPI baseline needs it)."""
        return "mpi" in self.baseline

    def to_json(self) -> str:
        """The rank-side fields as one line of JSON (``from_json`` reads it back)."""
        data = {k: v for k, v in asdict(self).items() if k not in _LAUNCHER_FIELDS}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        known = {f.name for f in fields(cls)} - set(_LAUNCHER_FIELDS)
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass(frozen=True)
class JobResult:
    """What ``run_job`` gives back: the launcher's exit code and rank 0's JSON records."""

    returncode: int
    records: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    @property
    def results(self) -> list[Result]:
        """The records as ``timing.Result`` objects (other keys dropped)."""
        from pycoll.bench.report import result_from_dict

        return [result_from_dict(r) for r in self.records]


def rank_command(job: Job) -> list[str]:
    """The command one rank of ``job`` runs: ``pycoll.bench.worker --job JSON`` in a new interpreter
    that imports the same pycoll as this process (``module_command``)."""
    return module_command(WORKER_MODULE, ["--job", job.to_json()])


def rank_arguments(job: Job) -> list[str]:
    """``rank_command`` without the interpreter: the program for a launcher that adds it itself
    (``pycoll run ... PROGRAM``, e.g. the multi-host jobs of tests/netns.py)."""
    return rank_command(job)[1:]


def launch_command(job: Job) -> list[str]:
    """The one command that starts all of ``job``'s ranks, under ``job.prefix``: ``mpirun -n ranks``
    with the rank command (``job.uses_mpirun``), else ``pycoll run -n ranks`` (``python -m
    pycoll.run``) with it. Without a prefix or mpirun ``run_job`` calls the launcher in-process."""
    if job.uses_mpirun:
        from pycoll.bench.baselines import mpirun_command

        cmd = mpirun_command(job.ranks, rank_command(job))
    else:
        rank = rank_arguments(job)
        cmd = script_command(job.ranks, rank[0], rank[1:])
    return [*job.prefix, *cmd]


def job_command(job: Job) -> list[str]:
    """The command that runs ``run_job(job)`` in a process of its own (``python -m
    pycoll.bench.jobs``), for a caller that puts a timeout on the whole job or captures its output;
    ``job.env`` must then be given to that process."""
    return module_command("pycoll.bench.jobs", ["--job", job.to_json()])


def script_command(ranks: int, script: str, args: Sequence[str] = ()) -> list[str]:
    """The command that starts ``ranks`` local copies of a Python script of the caller's own with
    ``args`` under ``pycoll run`` (of the pycoll running this), for a benchmark whose ranks run code
    other than ``pycoll.bench.worker`` (bench/codec_accuracy.py, bench/ddp_hooks.py)."""
    return module_command("pycoll.run", ["-n", str(ranks), script, *args])


def run_job(job: Job) -> JobResult:
    """Start ``job``'s ranks, wait for them, and collect rank 0's records (see the module docstring).
    The ranks' output (rank 0's table) goes to this process's stdout and stderr."""
    from pycoll.bench.report import read_json_lines
    from pycoll.env import environ_with

    env = None if job.env is None else environ_with(job.env)
    with tempfile.TemporaryDirectory(prefix="pycoll-job-") as tmp:
        path = os.path.abspath(job.json or os.path.join(tmp, "results.jsonl"))
        sent = replace(job, json=path)
        if sent.uses_mpirun or sent.prefix:
            cmd = launch_command(sent)
            try:
                code = subprocess.call(cmd, env=env)
            except KeyboardInterrupt:  # mpirun got the terminal's SIGINT too and stops the ranks
                code = 130
        else:
            from pycoll.cli.run import launch

            code = launch(sent.ranks, rank_command(sent), env=env)
        records = []
        if code == 0:  # a failed job's file may be cut short, or an older run's (``job.json``)
            try:
                with open(path, encoding="utf-8") as f:
                    records = read_json_lines(f.read())
            except (OSError, ValueError):
                records = []
    return JobResult(code, records)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pycoll.bench.jobs --job JSON``: ``run_job`` in this process; its exit code."""
    parser = argparse.ArgumentParser(prog="python -m pycoll.bench.jobs")
    parser.add_argument("--job", required=True, help="the job, as Job.to_json() wrote it")
    return run_job(Job.from_json(parser.parse_args(argv).job)).returncode


if __name__ == "__main__":
    sys.exit(main())
