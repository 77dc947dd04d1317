"""Run PyTorch's own generic distributed tests against a torch.distributed backend chosen by name.

    python -m tests.torch_suite.driver --backend gloo|pycoll --world-size 2 [-k PATTERN] [--list] [--json OUT]

The tests are ``DistributedTest._DistTestBase`` from ``torch.testing._internal.distributed.distributed_test``
(shipped in the torch wheel), combined with ``TestDistBackend`` exactly as torch's
test/distributed/test_distributed_spawn.py does. Each test runs as one unittest in this process, which
starts ``--world-size`` rank processes; the ranks run the test body, this process waits for them.

Wiring for a backend that is not built into torch (see ``_suite_class``):
  * gates (``--gates``): the suite reads BACKEND (and WORLD_SIZE, INIT_METHOD, TEMP_DIR) from the
    environment at import and decides its skips then, by backend name; many name gloo alone where the
    body is generic CPU code. ``--gates gloo`` (the default) imports it with BACKEND=gloo, so every test
    is skipped or run exactly as for gloo, then points the module's BACKEND at the backend under test,
    which every body and every ``init_process_group`` uses. ``--gates own`` decides them for the
    backend's own name (the backend added wherever the suite lists gloo), as torch would for a plugin;
  * tests the suite keeps for MPI although pycoll has the op (the CPU all-to-alls, ``UNGATED_FOR_PYCOLL``)
    are run for pycoll too;
  * tests whose bodies branch on the backend's name where nothing backend-specific follows
    (``BODY_AS_GLOO``: they build their model only for "gloo" or "mpi") run with the module's BACKEND
    reading "gloo" during the body: the process group is still the backend under test;
  * the rank processes find the test class by unpickling ``<this module>.TestDistBackendWithSpawn``;
    the module ``__getattr__`` below builds it on first use there too, and that build imports
    ``pycoll.torch`` (which registers the "pycoll" backend) before any ``init_process_group``;
  * ranks are started from a forkserver that has torch and the suite imported once (``--start-method
    forkserver``, the default), not by spawn: a spawned rank spends ~4 s importing them, which on a
    2-core machine costs more than most tests. Each rank takes the parent's environment as it was when
    the rank was started (what spawn gives it), as the suite sets TEMP_DIR/INIT_METHOD per test.
    ``--start-method spawn`` runs the suite as torch does;
  * one deadline for every test (``--timeout``, replacing the suite's 300-500 s), after which the parent
    kills the ranks; each rank also exits by itself (faulthandler, dumping its stacks) shortly after.

gloo_baseline.json beside this file: every test's status and seconds with gloo (world size 2, 2 cores).
"""

from __future__ import annotations

import argparse
import faulthandler
import fnmatch
import functools
import json
import os
import re
import sys
import tempfile
import time
import unittest
from typing import Any, Sequence, TextIO

# The broader set for a one-off full run: the collective, point-to-point, group and DDP tests.
FOCUS_PATTERNS: tuple[str, ...] = (
    "test_all_reduce*", "test_broadcast*", "test_all_gather*", "test_reduce_scatter*", "test_gather*",
    "test_scatter*", "test_reduce_*", "test_all_to_all*", "test_send_recv*", "test_isend*", "test_irecv*",
    "test_batch_isend_irecv*", "test_barrier*", "test_new_group*", "test_new_subgroups*", "test_*subgroup*",
    "test_DistributedDataParallel*", "test_ddp_*",
)  # fmt: skip

# Tests whose bodies build their model only when BACKEND is "gloo" or "mpi", although nothing after that
# is backend-specific (a CPU module under DDP): run with BACKEND reading "gloo" during the body.
BODY_AS_GLOO: tuple[str, ...] = ("test_accumulate_gradients_no_sync*",)

# Skips of the suite that name another backend as the only one with the op, for ops pycoll has: the CPU
# all-to-all tests ("Only MPI supports CPU all_to_all_single"). Run for pycoll.
UNGATED_FOR_PYCOLL: tuple[str, ...] = (
    "only mpi supports cpu all_to_all",
    "only mpi supports all_to_all",
    "only gloo backend supports timeouts",  # (with --gates own)
)

_CLASS = "TestDistBackendWithSpawn"
_BUILT: dict[str, type] = {}


def _configure(backend: str, world_size: int, timeout: float, start_method: str, gates: str) -> None:
    """The environment the suite reads at import; the rank processes inherit it."""
    os.environ["BACKEND"] = "gloo" if gates == "gloo" else backend  # what the suite's gates see
    os.environ["TORCH_SUITE_BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["TORCH_SUITE_TIMEOUT"] = str(timeout)
    os.environ["TORCH_SUITE_START"] = start_method
    # As torch's run_test.py: a file:// init method (tests gated on it look at it at import time).
    os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(tempfile.gettempdir(), "torch_suite_init"))


def _suite_class() -> type:
    """TestDistBackend + DistributedTest._DistTestBase for $TORCH_SUITE_BACKEND, gated as $BACKEND says
    (built once)."""
    if _CLASS in _BUILT:
        return _BUILT[_CLASS]
    backend = os.environ["TORCH_SUITE_BACKEND"]
    gated_as = os.environ["BACKEND"]
    timeout = float(os.environ.get("TORCH_SUITE_TIMEOUT", "120"))
    start_method = os.environ.get("TORCH_SUITE_START", "forkserver")
    if backend == "pycoll":
        import pycoll.torch  # noqa: F401  (registers the "pycoll" backend)
    from torch.testing._internal import common_distributed as cd

    for supported in cd.DistTestCases.backend_feature.values():
        if "gloo" in supported:
            supported.add(backend)
    if backend not in ("gloo", "nccl", "ucc", "mpi"):
        cd.DistTestCases.backend_feature["plugin"].add(backend)
    cd.TIMEOUT_DEFAULT = int(timeout)
    cd.TIMEOUT_OVERRIDE.clear()

    import torch.multiprocessing as mp
    from torch.testing._internal.distributed import distributed_test as dt

    dt.BACKEND = backend  # the bodies' and init_process_group's backend, whatever the gates saw
    bodies_as_gloo: dict[str, Any] = {}
    for name, test in vars(dt.DistributedTest._DistTestBase).items():
        why = getattr(test, "__unittest_skip_why__", "")
        if backend == "pycoll" and why.lower().startswith(UNGATED_FOR_PYCOLL) and "cuda" not in name:
            del test.__unittest_skip__, test.__unittest_skip_why__
        if backend != gated_as and callable(test) and _matches(name, list(BODY_AS_GLOO)):
            bodies_as_gloo[name] = _body_as_gloo(dt, test)

    class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
        def setUp(self) -> None:
            super().setUp()
            self._spawn_processes()

        def _spawn_processes(self) -> None:
            if start_method == "spawn":
                return super()._spawn_processes()
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["__main__", dt.__name__])

            def process(**kw: Any) -> Any:
                kw["kwargs"] = {**kw["kwargs"], "environ": dict(os.environ)}
                return ctx.Process(**kw)

            self._start_processes(process)

        @classmethod
        def _run(cls, rank: int, test_name: str, file_name: str, pipe: Any, **kwargs: Any) -> None:  # type: ignore[override]
            environ = kwargs.pop("environ", None)
            if environ is not None:  # forkserver: the parent's environment of now, not the server's
                os.environ.clear()
                os.environ.update(environ)
                dt.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
            faulthandler.dump_traceback_later(timeout + 10, exit=True)  # this rank's own deadline
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    for name, body in bodies_as_gloo.items():
        setattr(TestDistBackendWithSpawn, name, body)
    TestDistBackendWithSpawn.__qualname__ = _CLASS
    TestDistBackendWithSpawn.__module__ = __name__
    _BUILT[_CLASS] = globals()[_CLASS] = TestDistBackendWithSpawn
    return TestDistBackendWithSpawn


def _body_as_gloo(dt: Any, test: Any) -> Any:
    """``test`` with the suite's BACKEND reading "gloo" while its body runs (``BODY_AS_GLOO``)."""

    @functools.wraps(test)
    def run(self: Any) -> Any:
        real, dt.BACKEND = dt.BACKEND, "gloo"
        try:
            return test(self)
        finally:
            dt.BACKEND = real

    return run


def __getattr__(name: str) -> Any:
    """A rank process unpickles its target as <module>.TestDistBackendWithSpawn: build it there."""
    if name == _CLASS:
        return _suite_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _matches(name: str, patterns: list[str]) -> bool:
    """A pattern with a glob character is a glob, otherwise a substring."""
    return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else p in name for p in patterns)


def select(names: Sequence[str], which: str, patterns: list[str]) -> list[str]:
    if which == "focus":
        names = [n for n in names if _matches(n, list(FOCUS_PATTERNS))]
    return [n for n in names if not patterns or _matches(n, patterns)]


def _brief(text: str) -> str:
    """The exception lines of a failure (one per rank), for a summary line."""
    lines = [ln.strip() for ln in text.splitlines()]
    found = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?", ln)]
    return " | ".join(dict.fromkeys(found or [ln for ln in lines if ln][-1:]))[:400]


class _Result(unittest.TestResult):
    """Per test: status (pass/skip/fail), seconds, reason or brief error, full traceback."""

    def __init__(self, out: TextIO) -> None:
        super().__init__()
        self.out = out
        self.records: list[dict[str, Any]] = []
        self._start = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        self._start = time.monotonic()

    def _record(self, test: Any, status: str, detail: str = "", tb: str = "") -> None:
        name = getattr(test, "_testMethodName", str(test))
        secs = time.monotonic() - self._start
        self.records.append(
            {"name": name, "status": status, "seconds": round(secs, 2), "detail": detail, "traceback": tb}
        )
        why = f"  -- {detail}" if detail else ""
        print(f"{status.upper():5} {secs:6.1f}s  {name}{why}", file=self.out)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "pass")

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "fail", _brief(self.failures[-1][1]), self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "fail", _brief(self.errors[-1][1]), self.errors[-1][1])


def run(names: list[str], out: TextIO) -> list[dict[str, Any]]:
    cls = _suite_class()
    result = _Result(out)
    unittest.TestSuite([cls(n) for n in names]).run(result)
    return result.records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="gloo", help="a torch.distributed backend name (gloo, pycoll, ...)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument(
        "-k",
        dest="patterns",
        action="append",
        default=[],
        help="run the tests whose name holds this (or matches this glob); repeatable",
    )
    ap.add_argument(
        "--set",
        dest="which",
        choices=("focus", "all"),
        default="all",
        help="all: the whole suite (the default); focus: the collectives, point to point and DDP",
    )
    ap.add_argument(
        "--gates",
        choices=("gloo", "own"),
        default="gloo",
        help="decide the suite's skips as for gloo (the default), or for the backend's own name",
    )
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per test; then its ranks die")
    ap.add_argument("--start-method", choices=("forkserver", "spawn"), default="forkserver")
    ap.add_argument("--list", action="store_true", help="print the selected tests and exit")
    ap.add_argument("--json", metavar="OUT", help="write the per-test results and counts here")
    ap.add_argument(
        "--log",
        default=os.path.join(tempfile.gettempdir(), "torch_suite.log"),
        help="where the ranks' own output goes",
    )
    args = ap.parse_args(argv)

    _configure(args.backend, args.world_size, args.timeout, args.start_method, args.gates)
    cls = _suite_class()
    names = select(unittest.TestLoader().getTestCaseNames(cls), args.which, args.patterns)
    if args.list:
        print("\n".join(names))
        return 0

    # The suite and its ranks write a lot to fds 1 and 2: send that to --log, the report to the real stdout.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    with open(args.log, "w") as log:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        print(f"{args.backend}, world size {args.world_size}: {len(names)} tests (log: {args.log})", file=out)
        start = time.monotonic()
        records = run(names, out)
    counts = {s: sum(r["status"] == s for r in records) for s in ("pass", "skip", "fail")}
    total = round(time.monotonic() - start, 1)
    print(f"{counts['pass']} passed, {counts['skip']} skipped, {counts['fail']} failed in {total}s", file=out)
    if args.json:
        with open(args.json, "w") as f:
            import torch

            setup = {
                "backend": args.backend, "world_size": args.world_size, "gates": args.gates,
                "start": args.start_method, "torch": torch.__version__,
            }  # fmt: skip
            json.dump({**setup, "seconds": total, "counts": counts, "tests": records}, f, indent=1)
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
