"""Run PyTorch's own generic distributed tests against a torch.distributed backend chosen by name.

    python -m tests.torch_suite.driver --backend gloo|pycoll --world-size 2 [-k PATTERN] [--list] [--json OUT]

The tests are ``DistributedTest._DistTestBase`` from ``torch.testing._internal.distributed.distributed_test``
(shipped in the torch wheel), combined with ``TestDistBackend`` exactly as torch's
test/distributed/test_distributed_spawn.py does. Each test runs as one unittest in this process, which
starts ``--world-size`` rank processes; the ranks run the test body, this process waits for them.

Wiring for a backend that is not built into torch (see ``_suite_class``):
  * the suite reads BACKEND, WORLD_SIZE (and INIT_METHOD, TEMP_DIR) from the environment at import time
    and gates tests with ``DistTestCases.backend_feature`` sets at decoration time, so the environment is
    set and the backend's name added to every feature set that holds "gloo" (and to "plugin", which
    ``require_backend_is_available`` accepts) *before* distributed_test is imported;
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
  * tests the suite skips for every backend but gloo *by name*, although their bodies are generic (see
    ``UNGATED``), are un-skipped for the other backends. The rest gated so stay gloo-only: barrier_timeout*,
    monitored_barrier_gloo*, sparse all-reduce, accumulate_gradients_no_sync* (gloo-specific bodies).

gloo_baseline.json beside this file: every test's status and seconds with gloo (world size 2, 2 cores).
"""

from __future__ import annotations

import argparse
import faulthandler
import fnmatch
import json
import os
import re
import sys
import tempfile
import time
import unittest
from typing import Any, Sequence, TextIO

# The curated list: collective, point-to-point, group and DDP tests that pass with gloo on CPU at world size 2
# (91 of the suite's 285 do; the rest need CUDA, world size >= 3, or another backend). 28-42 s in all with
# gloo on a 2-core machine: 0.2-1.3 s a test, test_ddp_logging_data_cpu ~2 s, ~3 s for the first test (it
# starts the forkserver). Left out: tests that stay gloo-only by name (barrier_timeout*,
# monitored_barrier_gloo*, sparse all-reduce) and most profiler variants of send/recv.
CI_TESTS: tuple[str, ...] = (
    # all_reduce / reduce, default group and new_group(all ranks)
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex", "test_all_reduce_max",
    "test_all_reduce_min", "test_all_reduce_product", "test_all_reduce_complex_unsupported_ops",
    "test_all_reduce_full_group_sum", "test_all_reduce_full_group_max", "test_all_reduce_full_group_min",
    "test_all_reduce_full_group_product", "test_all_reduce_coalesced_sum", "test_all_reduce_coalesced_max",
    "test_all_reduce_coalesced_min", "test_all_reduce_coalesced_product",
    "test_all_reduce_coalesced_max_complex_unsupported", "test_all_reduce_coalesced_full_group_sum",
    "test_all_reduce_coalesced_full_group_max", "test_reduce_sum", "test_reduce_max", "test_reduce_min",
    "test_reduce_product", "test_reduce_sum_twice", "test_reduce_full_group_sum",
    "test_reduce_full_group_max",
    # broadcast, all_gather, gather, scatter (tensors and objects)
    "test_broadcast", "test_broadcast_full_group", "test_all_gather", "test_all_gather_complex",
    "test_all_gather_full_group", "test_all_gather_coalesced_simple", "test_all_gather_coalesced_complex",
    "test_all_gather_coalesced_full_group", "test_all_gather_coalesced_with_empty",
    "test_all_gather_object_default_pg", "test_all_gather_object_subgroup", "test_gather",
    "test_gather_checks", "test_gather_full_group", "test_scatter", "test_scatter_checks",
    "test_scatter_complex", "test_scatter_full_group", "test_scatter_object_list",
    # all-to-all (the suite lets only MPI run these on CPU: UNGATED_FOR_PYCOLL; gloo skips them)
    "test_all_to_all", "test_all_to_all_complex", "test_all_to_all_full_group",
    "test_all_to_all_single_equal_split", "test_all_to_all_single_equal_split_complex",
    "test_all_to_all_single_unequal_split", "test_all_to_all_single_unequal_split_full_group",
    # point to point
    "test_send_recv", "test_send_recv_with_tag", "test_send_recv_any_source",
    "test_send_recv_autograd_profiler",
    "test_isend", "test_irecv", "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags",
    # barrier, groups
    "test_barrier", "test_barrier_full_group", "test_barrier_timeout_global",
    "test_barrier_timeout_full_group", "test_get_rank", "test_get_rank_size_full_group",
    "test_destroy_group", "test_destroy_full_group",
    # DDP on CPU
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_DistributedDataParallel_requires_grad", "test_ddp_create_graph", "test_ddp_logging_data_cpu",
    "test_accumulate_gradients_no_sync", "test_accumulate_gradients_no_sync_grad_is_view",
    "test_accumulate_gradients_no_sync_allreduce_hook",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
    "test_grads_same_across_ranks_with_no_sync", "test_get_future", "test_static_graph_api_cpu",
)  # fmt: skip

# The broader set for a one-off full run: the collective, point-to-point, group and DDP tests.
FOCUS_PATTERNS: tuple[str, ...] = (
    "test_all_reduce*", "test_broadcast*", "test_all_gather*", "test_reduce_scatter*", "test_gather*",
    "test_scatter*", "test_reduce_*", "test_all_to_all*", "test_send_recv*", "test_isend*", "test_irecv*",
    "test_batch_isend_irecv*", "test_barrier*", "test_new_group*", "test_new_subgroups*", "test_*subgroup*",
    "test_DistributedDataParallel*", "test_ddp_*",
)  # fmt: skip

# Tests the suite skips for any backend but gloo by name (the skip's reason names gloo), although their bodies
# are generic CPU code: these are run for the other backends too. (Not so test_accumulate_gradients_no_sync*:
# their bodies build the model only if BACKEND is "gloo" or "mpi".)
UNGATED: tuple[str, ...] = (
    "test_batch_isend_irecv_gloo*", "test_all_reduce_coalesced_*", "test_scatter_object_list",
    "test_get_future", "test_grads_same_across_ranks_with_no_sync",
)  # fmt: skip

# Skips of the suite that name another backend as the only one with the op, for ops pycoll has: the CPU
# all-to-all tests ("Only MPI supports CPU all_to_all_single"). Run for pycoll.
UNGATED_FOR_PYCOLL: tuple[str, ...] = (
    "only mpi supports cpu all_to_all",
    "only mpi supports all_to_all",
    "only gloo backend supports timeouts",
)

_CLASS = "TestDistBackendWithSpawn"
_BUILT: dict[str, type] = {}


def _configure(backend: str, world_size: int, timeout: float, start_method: str) -> None:
    """The environment the suite reads at import; the rank processes inherit it."""
    os.environ["BACKEND"] = backend
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["TORCH_SUITE_TIMEOUT"] = str(timeout)
    os.environ["TORCH_SUITE_START"] = start_method
    # As torch's run_test.py: a file:// init method (tests gated on it look at it at import time).
    os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(tempfile.gettempdir(), "torch_suite_init"))


def _suite_class() -> type:
    """TestDistBackend + DistributedTest._DistTestBase for the backend in $BACKEND (built once)."""
    if _CLASS in _BUILT:
        return _BUILT[_CLASS]
    backend = os.environ["BACKEND"]
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
    if backend == "pycoll":  # no receive from any source (docs/torch-backend.md): the suite's own skip
        cd.DistTestCases.skip_collective["sendrecv anysource"].add(backend)
    cd.TIMEOUT_DEFAULT = int(timeout)
    cd.TIMEOUT_OVERRIDE.clear()

    import torch.multiprocessing as mp
    from torch.testing._internal.distributed import distributed_test as dt

    for name, test in vars(dt.DistributedTest._DistTestBase).items():
        why = getattr(test, "__unittest_skip_why__", "")
        if backend != "gloo" and _matches(name, list(UNGATED)) and "gloo" in why.lower():
            del test.__unittest_skip__, test.__unittest_skip_why__
        elif backend == "pycoll" and why.lower().startswith(UNGATED_FOR_PYCOLL) and "cuda" not in name:
            del test.__unittest_skip__, test.__unittest_skip_why__

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

    TestDistBackendWithSpawn.__qualname__ = _CLASS
    TestDistBackendWithSpawn.__module__ = __name__
    _BUILT[_CLASS] = globals()[_CLASS] = TestDistBackendWithSpawn
    return TestDistBackendWithSpawn


def __getattr__(name: str) -> Any:
    """A rank process unpickles its target as <module>.TestDistBackendWithSpawn: build it there."""
    if name == _CLASS:
        return _suite_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _matches(name: str, patterns: list[str]) -> bool:
    """A pattern with a glob character is a glob, otherwise a substring."""
    return any(fnmatch.fnmatchcase(name, p) if any(c in p for c in "*?[") else p in name for p in patterns)


def select(names: Sequence[str], which: str, patterns: list[str]) -> list[str]:
    if which == "ci":
        missing = [n for n in CI_TESTS if n not in names]
        if missing:
            raise SystemExit(f"CI_TESTS names unknown to this torch: {missing}")
        names = list(CI_TESTS)
    elif which == "focus":
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
        choices=("ci", "focus", "all"),
        default=None,
        help="ci: CI_TESTS (the default); focus: collectives + DDP; all (the default with -k)",
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

    _configure(args.backend, args.world_size, args.timeout, args.start_method)
    cls = _suite_class()
    which = args.which or ("all" if args.patterns else "ci")
    names = select(unittest.TestLoader().getTestCaseNames(cls), which, args.patterns)
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
            setup = {"backend": args.backend, "world_size": args.world_size, "start": args.start_method}
            json.dump({**setup, "seconds": total, "counts": counts, "tests": records}, f, indent=1)
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
