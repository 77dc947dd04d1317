"""The benchmark timing loop (pycoll/bench/timing.py, inputs.py, report.py) with fake communicators."""

from __future__ import annotations

import argparse
import ast
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pycoll.bench import collectives, inputs, link, options, report, timing

REPO = Path(__file__).resolve().parents[2]
SMALL = {"min_bytes": 64, "max_bytes": 1024, "factor": 4, "iters": 3, "warmup": 1}


def _identity(x: np.ndarray) -> None:
    pass


def _nothing() -> None:
    pass


def _same(a: np.ndarray) -> np.ndarray:
    return a


class ThreadWorld:
    """``n`` ranks as threads of this process, with a correct sum / max all-reduce and a barrier."""

    def __init__(self, n: int) -> None:
        self.n = n
        self._barrier = threading.Barrier(n, timeout=30)
        self._slots: list[np.ndarray | None] = [None] * n

    def barrier(self) -> None:
        self._barrier.wait()

    def _reduce(self, rank: int, x: np.ndarray, op: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
        self._slots[rank] = x.copy()
        self._barrier.wait()
        total = self._slots[0]
        assert total is not None
        for other in self._slots[1:]:
            assert other is not None
            total = op(total, other)
        self._barrier.wait()  # everyone has read every slot before anyone writes the next one
        x[...] = total

    def allreduce(self, rank: int, x: np.ndarray) -> None:
        self._reduce(rank, x, np.add)

    def reduce_max(self, rank: int, a: np.ndarray) -> np.ndarray:
        self._reduce(rank, a, np.maximum)
        return a

    def reduce_scatter(self, rank: int, x: np.ndarray, out: np.ndarray) -> None:
        total = x.copy()
        self.allreduce(rank, total)
        out[...] = total[rank * out.size : (rank + 1) * out.size]

    def all_gather(self, rank: int, x: np.ndarray, out: np.ndarray) -> None:
        self._slots[rank] = x.copy()
        self._barrier.wait()
        out[...] = np.concatenate([s for s in self._slots if s is not None])
        self._barrier.wait()

    def run(self, body: Callable[[int], list[timing.Result]]) -> list[list[timing.Result]]:
        """Run ``body(rank)`` on every rank; return each rank's results, re-raising a rank's error."""
        out: list[list[timing.Result] | None] = [None] * self.n
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            try:
                out[rank] = body(rank)
            except BaseException as e:  # forwarded to the test below
                errors.append(e)
                self._barrier.abort()

        threads = [threading.Thread(target=target, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        if errors:
            raise errors[0]
        assert all(r is not None for r in out)
        return [r for r in out if r is not None]


def _sweep_world(
    n: int, allreduce: Callable[[ThreadWorld, int, np.ndarray], None] | None = None, **kwargs: object
) -> list[list[timing.Result]]:
    world = ThreadWorld(n)
    reduce_fn = allreduce or (lambda w, r, x: w.allreduce(r, x))

    def body(rank: int) -> list[timing.Result]:
        return timing.run_allreduce_sweep(
            lambda x: reduce_fn(world, rank, x),
            world.barrier,
            lambda a: world.reduce_max(rank, a),
            rank,
            n,
            **{**SMALL, **kwargs},  # type: ignore[arg-type]
        )

    return world.run(body)


# ---------------------------------------------------------------------------------------------------
# The sweep


def test_identity_on_world_1_is_correct() -> None:
    results = timing.run_allreduce_sweep(_identity, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert [r.bytes for r in results] == [64, 256, 1024]
    assert [r.count for r in results] == [16, 64, 256]
    for r in results:
        assert r.wrong == 0
        assert r.dtype == "float32"
        assert r.redop == "sum"
        assert r.world == 1
        assert (r.iters, r.warmup) == (3, 1)
        assert r.time_us > 0
        assert r.busbw_GBps == 0.0  # nothing crosses a link on one rank


def test_default_sweep_is_4k_to_64m() -> None:
    sizes = timing.sweep_sizes(4096, 64 << 20, 2)
    assert sizes[0] == 4096 and sizes[-1] == 64 << 20 and len(sizes) == 15


def test_wrong_allreduce_counts_every_element() -> None:
    def off_by_one(x: np.ndarray) -> None:
        x += 1

    results = timing.run_allreduce_sweep(off_by_one, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert [r.wrong for r in results] == [r.count for r in results]


def test_wrong_allreduce_counts_single_element() -> None:
    def last_wrong(x: np.ndarray) -> None:
        x[-1] = -5

    results = timing.run_allreduce_sweep(last_wrong, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert [r.wrong for r in results] == [1, 1, 1]


def test_nan_counts_as_wrong() -> None:
    def nan_first(x: np.ndarray) -> None:
        x[0] = np.nan

    results = timing.run_allreduce_sweep(nan_first, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert all(r.wrong == 1 for r in results)


def test_one_bad_iteration_is_reported_not_multiplied() -> None:
    calls = 0

    def wrong_once(x: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:  # a timed iteration of the first size (1 warm-up, then 3 timed)
            x[:5] = 0

    results = timing.run_allreduce_sweep(wrong_once, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert [r.wrong for r in results] == [5, 0, 0]


def test_wrong_warmup_iteration_is_reported() -> None:
    calls = 0

    def wrong_first(x: np.ndarray) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            x[:2] = 0

    results = timing.run_allreduce_sweep(wrong_first, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert results[0].wrong == 2


def test_input_is_refilled_between_iterations_only_when_checking() -> None:
    seen: list[float] = []

    def double(x: np.ndarray) -> None:
        seen.append(float(x[0]))
        x *= 2

    kwargs = {**SMALL, "max_bytes": 64}
    timing.run_allreduce_sweep(double, _nothing, _same, 0, 1, check=True, **kwargs)  # type: ignore[arg-type]
    assert seen == [1.0] * 4  # rank 0's x[0] is 1 before every call
    seen.clear()
    results = timing.run_allreduce_sweep(double, _nothing, _same, 0, 1, check=False, **kwargs)  # type: ignore[arg-type]
    assert seen == [1.0, 2.0, 4.0, 8.0]
    assert results[0].wrong is None


def test_same_array_object_within_a_size() -> None:
    ids: dict[int, set[int]] = {}

    def record(x: np.ndarray) -> None:
        ids.setdefault(x.size, set()).add(id(x))

    timing.run_allreduce_sweep(record, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert all(len(s) == 1 for s in ids.values())


def test_barrier_before_every_iteration() -> None:
    events: list[str] = []
    kwargs = {**SMALL, "max_bytes": 64}
    timing.run_allreduce_sweep(
        lambda x: events.append("a"),
        lambda: events.append("b"),
        _same,
        0,
        1,
        **kwargs,  # type: ignore[arg-type]
    )
    assert events == ["b", "a"] * 4


def test_threaded_world_correct() -> None:
    per_rank = _sweep_world(3)
    for results in per_rank:
        assert [r.wrong for r in results] == [0, 0, 0]
        assert all(r.world == 3 for r in results)
    # every rank returns the same combined measurements
    assert per_rank[0] == per_rank[1] == per_rank[2]


def test_threaded_world_counts_wrong_across_ranks() -> None:
    def rank1_skips(world: ThreadWorld, rank: int, x: np.ndarray) -> None:
        saved = x.copy()
        world.allreduce(rank, x)
        if rank == 1:
            x[...] = saved  # rank 1 keeps its own input: every element wrong on one rank

    per_rank = _sweep_world(3, rank1_skips)
    assert [r.wrong for r in per_rank[0]] == [16, 64, 256]

    def all_off(world: ThreadWorld, rank: int, x: np.ndarray) -> None:
        world.allreduce(rank, x)
        x[0] += 1

    per_rank = _sweep_world(4, all_off)
    assert [r.wrong for r in per_rank[0]] == [4, 4, 4]


def _collective_world(
    n: int, name: str, call: Callable[..., None], **kwargs: object
) -> list[list[timing.Result]]:
    """A sweep of ``call(world, rank, x, out)`` as collective ``name`` on ``n`` thread ranks."""
    world = ThreadWorld(n)
    op = "sum" if collectives.get_collective(name).reduces else "none"

    def body(rank: int) -> list[timing.Result]:
        variant = timing.Variant("none", lambda *a: call(world, rank, *a), collective=name, op=op)
        reduce_max = lambda a: world.reduce_max(rank, a)  # noqa: E731
        return timing.run_interleaved_sweep(
            [variant], world.barrier, reduce_max, rank, n, **{**SMALL, **kwargs}
        )  # type: ignore[arg-type]

    return world.run(body)


@pytest.mark.parametrize("name", ["reduce_scatter", "all_gather"])
def test_threaded_reduce_scatter_and_all_gather(name: str) -> None:
    per_rank = _collective_world(3, name, getattr(ThreadWorld, name))
    results = per_rank[0]
    # 64, 256, 1024 bytes: float32 elements rounded down to a multiple of the 3 ranks, as nccl-tests
    assert [(r.count, r.bytes) for r in results] == [(15, 60), (63, 252), (255, 1020)]
    assert all(r.wrong == 0 and r.collective == name and r.world == 3 for r in results)
    assert {r.redop for r in results} == {"sum" if name == "reduce_scatter" else "none"}
    assert all(r.busbw_GBps == pytest.approx(r.algbw_GBps * 2 / 3) for r in results)
    assert per_rank[0] == per_rank[1] == per_rank[2]


def test_wrong_reduce_scatter_and_all_gather_are_caught() -> None:
    def next_ranks_chunk(world: ThreadWorld, rank: int, x: np.ndarray, out: np.ndarray) -> None:
        total = x.copy()
        world.allreduce(rank, total)
        r = (rank + 1) % world.n
        out[...] = total[r * out.size : (r + 1) * out.size]

    # 15 elements, chunks of 5: chunk r+1 of n(n+1)/2 + n (i % 7) differs from chunk r everywhere
    (results, _, _) = _collective_world(3, "reduce_scatter", next_ranks_chunk, max_bytes=64)
    assert [r.wrong for r in results] == [15]

    def leaves_out_alone(world: ThreadWorld, rank: int, x: np.ndarray, out: np.ndarray) -> None:
        world.barrier()

    (results, _, _) = _collective_world(3, "all_gather", leaves_out_alone, max_bytes=64)
    assert [r.wrong for r in results] == [45]  # the poisoned (NaN) result, 15 elements on 3 ranks

    def own_chunk_twice(world: ThreadWorld, rank: int, x: np.ndarray, out: np.ndarray) -> None:
        world.all_gather(rank, x, out)
        if rank == 2:
            out[: x.size] = x  # rank 2 puts its own chunk first: 5 elements wrong (3 + k, not 1 + k)

    (results, _, _) = _collective_world(3, "all_gather", own_chunk_twice, max_bytes=64)
    assert [r.wrong for r in results] == [5]


def test_link_counters() -> None:
    assert link.payload_bytes(10_066, 1) == 10_000 and link.HEADER_BYTES == 14 + 20 + 32
    assert "no network interface" in (link.why_not(None) or "")
    assert "not an interface name" in (link.why_not("../lo") or "")
    assert "cannot read the transmit counters of 'pycoll-none0'" in (link.why_not("pycoll-none0") or "")
    if not Path("/sys/class/net/lo").exists():
        pytest.skip("no /sys/class/net/lo (not Linux)")
    assert link.why_not("lo") is None
    before = link.LinkCounter("lo", 1).read()
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(b"x" * 1000, ("127.0.0.1", 9))  # the discard port: nothing need listen
    after = link.LinkCounter("lo", 1).read()
    assert after.tx_bytes - before.tx_bytes >= 1000 + 28 and after.tx_packets > before.tx_packets
    assert after.retrans_segs >= before.retrans_segs >= 0
    assert link.LinkCounter("lo", 1).mss == int(Path("/sys/class/net/lo/mtu").read_text()) - 52


def test_collectives_are_what_pycoll_and_its_cost_model_say() -> None:
    from pycoll.algorithms import ALGORITHMS
    from pycoll.tuning.model import bus_factor

    assert set(collectives.COLLECTIVES) == {"allreduce", "reduce_scatter", "all_gather"}
    for name, coll in collectives.COLLECTIVES.items():
        assert set(coll.algorithms) == set(ALGORITHMS[name])
        for world in (2, 3, 8):
            assert coll.bus_factor(world) == pytest.approx(bus_factor(name, world))
    assert collectives.get_collective("all_gather") is collectives.COLLECTIVES["all_gather"]
    with pytest.raises(ValueError, match="allreduce, reduce_scatter, all_gather"):
        collectives.get_collective("broadcast")


def test_sent_bytes_is_the_bus_factor_in_encoded_chunks() -> None:
    float32 = lambda m: 4 * m  # noqa: E731
    for world in (2, 4):
        for name, share in (("allreduce", 2), ("reduce_scatter", 1), ("all_gather", 1)):
            coll = collectives.get_collective(name)
            assert coll.sent_bytes(1 << 20, world, float32) == share * (world - 1) / world * (4 << 20)
    # a codec's chunks: int8's blocks of 64 elements in 68 bytes (a 4-byte scale); 16 MiB of float32, 4 ranks
    int8 = lambda m: (m // 64) * 68 + (4 + m % 64 if m % 64 else 0)  # noqa: E731
    rs = collectives.get_collective("reduce_scatter")
    assert rs.sent_bytes(4 << 20, 4, int8) == 3 * (1 << 20) // 64 * 68
    assert rs.sent_bytes(4 << 20, 1, int8) == 0


def test_time_is_the_slowest_rank() -> None:
    delay = 0.02

    def rank2_slow(world: ThreadWorld, rank: int, x: np.ndarray) -> None:
        world.allreduce(rank, x)
        if rank == 2:
            time.sleep(delay)

    per_rank = _sweep_world(3, rank2_slow, max_bytes=64)
    assert per_rank[0][0].time_us >= delay * 1e6
    assert per_rank[1][0].time_us == per_rank[2][0].time_us


def test_time_is_median_over_iterations() -> None:
    durations = iter([0.0, 0.001, 0.05, 0.001, 0.001])  # warm-up (slow or not), then 4 timed

    def variable(x: np.ndarray) -> None:
        time.sleep(next(durations))

    results = timing.run_allreduce_sweep(
        variable, _nothing, _same, 0, 1, min_bytes=64, max_bytes=64, iters=4, warmup=1
    )
    assert 1000 <= results[0].time_us < 20000  # the one 50 ms outlier does not move the median


def test_default_iteration_counts_scale_down_with_size() -> None:
    sizes = timing.sweep_sizes(4096, 64 << 20, 2)
    iters = [timing.default_iters(s) for s in sizes]
    assert iters == sorted(iters, reverse=True)
    assert iters[0] == 100 and iters[-1] == 5
    assert all(timing.default_warmup(s) >= 2 for s in sizes)
    # the whole default sweep moves a bounded amount of data per rank
    moved = sum(s * (timing.default_iters(s) + timing.default_warmup(s)) for s in sizes)
    assert moved < 3 << 30


@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 8, 16])
def test_closed_form_matches_sum_of_inputs(world: int) -> None:
    count = 1000
    total = np.zeros(count, dtype=np.float32)
    for r in range(world):
        total += inputs.rank_input(r, count)
    np.testing.assert_array_equal(total, inputs.expected_sum(world, count))


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        timing.run_allreduce_sweep(_identity, _nothing, _same, 1, 1)
    with pytest.raises(ValueError):
        timing.run_allreduce_sweep(_identity, _nothing, _same, 0, 1, iters=0)
    with pytest.raises(ValueError):
        timing.sweep_sizes(4096, 1024, 2)
    with pytest.raises(ValueError):
        timing.sweep_sizes(4096, 8192, 1)
    assert timing.sweep_sizes(1, 3, 1.1) == [1, 2, 3]  # a small factor still makes progress


# ---------------------------------------------------------------------------------------------------
# Figures and output


@pytest.mark.parametrize(("world", "factor"), [(1, 0.0), (2, 1.0), (3, 4 / 3), (4, 1.5), (8, 1.75)])
def test_busbw_formula(world: int, factor: float) -> None:
    assert timing.bus_factor(world) == pytest.approx(factor)
    r = timing.make_result(1_000_000, 250_000, np.float32, 100.0, world, wrong=0)
    assert r.algbw_GBps == pytest.approx(10.0)  # 1e6 B in 100 us = 1e10 B/s
    assert r.busbw_GBps == pytest.approx(10.0 * factor)
    # nccl-tests' reduce-scatter and all-gather: busbw = algbw * (n-1)/n, half the all-reduce's factor
    for name in ("reduce_scatter", "all_gather"):
        assert timing.bus_factor(world, name) == pytest.approx(factor / 2)
        r = timing.make_result(1_000_000, 250_000, np.float32, 100.0, world, wrong=0, collective=name)
        assert r.collective == name and r.busbw_GBps == pytest.approx(5.0 * factor)
    with pytest.raises(ValueError, match="unknown collective"):
        timing.bus_factor(4, "alltoall")


def test_format_table() -> None:
    results = [
        timing.make_result(4096, 1024, np.float32, 2.5, 4, wrong=0),
        timing.make_result(64 << 20, 16 << 20, np.float32, 12345.678, 4, wrong=3),
    ]
    text = report.format_table(results, "pycoll, 4 ranks")
    lines = text.splitlines()
    assert lines[0] == "# pycoll, 4 ranks"
    for name in ("size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"):
        assert name in lines[1]
    assert "(us)" in lines[2] and "(GB/s)" in lines[2]
    assert lines[3].split() == ["4096", "1024", "float32", "sum", "2.50", "1.64", "2.46", "0"]
    assert lines[4].split() == ["67108864", "16777216", "float32", "sum", "12345.68", "5.44", "8.15", "3"]
    assert lines[5] == "# Out of bounds values : 3"
    assert lines[6].startswith("# Avg bus bandwidth")
    # the columns line up: every value ends where its header ends
    assert _word_ends(" " + lines[1][1:]) == _word_ends(lines[3]) == _word_ends(lines[4])


def _word_ends(line: str) -> list[int]:
    return [i + 1 for i, c in enumerate(line) if c != " " and (i + 1 == len(line) or line[i + 1] == " ")]


def test_format_unchecked_row() -> None:
    r = timing.make_result(4096, 1024, np.float32, 2.5, 2, wrong=None)
    assert report.format_row(r).split()[-1] == "N/A"
    assert "N/A" in report.format_footer([r])


def test_json_lines_round_trip() -> None:
    results = [timing.make_result(4096, 1024, np.float32, 2.5, 4, wrong=0, iters=10, warmup=2)]
    text = report.format_json_lines(results, library="mpi", algorithm="default")
    assert text.endswith("\n") and text.count("\n") == 1
    (record,) = report.read_json_lines(text)
    assert record["library"] == "mpi" and record["algorithm"] == "default" and record["label"] == "mpi"
    assert report.result_from_dict({**record, "library": "", "algorithm": ""}) == results[0]
    json.dumps(record)
    # a result that names its series keeps it; times_us survive the round trip
    named = timing.make_result(
        4096,
        1024,
        np.float32,
        2.5,
        2,
        wrong=0,
        library="pycoll",
        algorithm="ring",
        codec="int8",
        times_us=[2.0, 2.5, 3.0],
    )
    (record,) = report.read_json_lines(report.format_json_lines([named], library="x", host="h"))
    assert (record["library"], record["algorithm"], record["codec"]) == ("pycoll", "ring", "int8")
    assert record["label"] == "pycoll/ring/int8" and record["host"] == "h"
    assert record["times_us"] == [2.0, 2.5, 3.0]
    assert report.result_from_dict(record) == named


def test_run_and_report(tmp_path: Path) -> None:
    lines: list[str] = []
    parser = argparse.ArgumentParser()
    options.add_sweep_arguments(parser)
    out = tmp_path / "r.jsonl"
    args = parser.parse_args(["-b", "64", "-e", "256", "-f", "4", "-n", "2", "-w", "0", "--json", str(out)])
    results = report.run_and_report(
        _identity, _nothing, _same, 0, 1, args, title="t", meta={"library": "x"}, print_fn=lines.append
    )
    assert len(results) == 2
    printed = "\n".join(lines).splitlines()
    assert printed[0] == "# t" and len(printed) == 3 + 2 + 2  # title + header, 2 rows, footer
    records = report.read_json_lines(out.read_text())
    assert [r["bytes"] for r in records] == [64, 256] and all(r["library"] == "x" for r in records)


# ---------------------------------------------------------------------------------------------------
# Command-line helpers


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("4K", 4096),
        ("4k", 4096),
        ("4KiB", 4096),
        ("4KB", 4096),
        ("64M", 64 << 20),
        ("1G", 1 << 30),
        ("0.5K", 512),
        ("100B", 100),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert options.parse_size(text) == value


@pytest.mark.parametrize("text", ["", "K", "abc", "-4K", "0", "1.5"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        options.parse_size(text)


def test_format_size() -> None:
    assert report.format_size(4096) == "4 KiB"
    assert report.format_size(64 << 20) == "64 MiB"
    assert report.format_size(1000) == "1000 B"


def test_sweep_arguments() -> None:
    parser = argparse.ArgumentParser()
    options.add_sweep_arguments(parser)
    kwargs = options.sweep_kwargs(parser.parse_args([]))
    assert kwargs == {
        "min_bytes": 4096,
        "max_bytes": 64 << 20,
        "factor": 2,
        "iters": None,
        "warmup": None,
        "check": True,
    }
    kwargs = options.sweep_kwargs(parser.parse_args("-b 1M -e 8M -f 4 -n 7 -w 0 -c 0".split()))
    assert kwargs == {
        "min_bytes": 1 << 20,
        "max_bytes": 8 << 20,
        "factor": 4,
        "iters": 7,
        "warmup": 0,
        "check": False,
    }


def test_memcpy_bandwidth() -> None:
    figures = timing.memcpy_bandwidth(1 << 20, repeats=3)
    assert figures["copy_GBps"] > 0
    assert figures["rw_GBps"] == pytest.approx(2 * figures["copy_GBps"])


# ---------------------------------------------------------------------------------------------------
# Independence from the rest of pycoll (the baselines load this file without pycoll's native module)


#: The timing loop's modules: they import nothing of pycoll but each other.
_TIMING_MODULES = ("timing", "inputs", "report", "options", "collectives", "link")
#: The functions of collectives.py that run pycoll itself, the only ones that may import the rest of it.
_PYCOLL_SIDE = {"pycoll_call", "compressed_plan", "codec_reference", "_chunked_compressed_plan"}


def _pycoll_imports(nodes: list[ast.stmt]) -> list[str]:
    """The modules of pycoll outside the timing modules that ``nodes`` import (walked in depth)."""
    own = {f"pycoll.bench.{name}" for name in _TIMING_MODULES}
    found = []
    for node in (n for top in nodes for n in ast.walk(top)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0
            names = [node.module or ""]
        found += [n for n in names if n.split(".")[0] == "pycoll" and n not in own]
    return found


@pytest.mark.parametrize("module", _TIMING_MODULES)
def test_benchmark_module_imports_nothing_from_pycoll(module: str) -> None:
    tree = ast.parse((REPO / "pycoll" / "bench" / f"{module}.py").read_text())
    if module != "collectives":
        assert _pycoll_imports(tree.body) == []
        return
    # collectives.py: only where pycoll's own collective is called, planned or bounded
    outside, inside = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            (inside if node.name in _PYCOLL_SIDE else outside).append(node)
    assert _pycoll_imports([n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.ClassDef))]) == []
    assert all(_pycoll_imports([f]) == [] for f in outside if f.name not in _PYCOLL_SIDE)
    assert "pycoll" in _pycoll_imports(inside)  # the test looks where the imports are


@pytest.mark.parametrize("script", ["gloo_allreduce.py", "mpi_allreduce.py"])
def test_baseline_scripts_take_the_sweep_flags(script: str) -> None:
    """The scripts in bench/baselines are thin wrappers over pycoll/bench/baselines.py: --help needs neither
    torch nor MPI started, and lists the flags of pycoll bench's sweep."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "baselines" / script), "--help"],
        cwd=REPO / "bench",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    for flag in ("--minbytes", "--maxbytes", "--iters", "--json", "--op", "--datatype"):
        assert flag in out.stdout


def test_time_budget_lowers_automatic_iteration_counts() -> None:
    def slow(x: np.ndarray) -> None:
        time.sleep(0.002)

    (r,) = timing.run_allreduce_sweep(
        slow, _nothing, _same, 0, 1, min_bytes=4096, max_bytes=4096, time_budget_s=0.02
    )
    assert r.warmup == 20 and 5 <= r.iters <= 10  # 100 by default; ~0.02 s / 2 ms
    (r,) = timing.run_allreduce_sweep(
        _identity, _nothing, _same, 0, 1, min_bytes=4096, max_bytes=4096, time_budget_s=0.02
    )
    assert r.iters == 100  # fast enough: the default count stands
    (r,) = timing.run_allreduce_sweep(
        slow, _nothing, _same, 0, 1, min_bytes=4096, max_bytes=4096, iters=30, time_budget_s=0.02
    )
    assert r.iters == 30  # an explicit count is never changed


def test_time_budget_gives_every_rank_the_same_count() -> None:
    def rank0_slow(world: ThreadWorld, rank: int, x: np.ndarray) -> None:
        world.allreduce(rank, x)
        if rank == 0:
            time.sleep(0.002)

    per_rank = _sweep_world(
        3, rank0_slow, min_bytes=4096, max_bytes=4096, iters=None, warmup=None, time_budget_s=0.02
    )
    counts = {results[0].iters for results in per_rank}
    assert len(counts) == 1 and counts.pop() <= 10
    assert all(results[0].wrong == 0 for results in per_rank)


# ---------------------------------------------------------------------------------------------------
# Lossy all-reduce: custom inputs, relative error, interleaved variants, codec columns


class _NoisyInputs(inputs.Inputs):
    """Gaussian inputs judged against the exact float64 sum with a fixed absolute tolerance."""

    def __init__(self, tol: float) -> None:
        self.tol = tol

    def input(self, rank: int, world: int, count: int, dtype: object) -> np.ndarray:
        return inputs.gaussian_input(rank, count, 5, dtype)  # type: ignore[arg-type]

    def judge(self, rank: int, world: int, count: int, dtype: object) -> inputs.JudgeFn:
        exact = np.sum([inputs.gaussian_input(r, count, 5).astype(np.float64) for r in range(world)], axis=0)

        def judge(x: np.ndarray) -> tuple[int, float | None]:
            return int(np.count_nonzero(~(np.abs(x - exact) <= self.tol))), inputs.relative_error(x, exact)

        return judge


def test_gaussian_input_and_relative_error() -> None:
    a = inputs.gaussian_input(1, 10000, 3)
    assert a.dtype == np.float32 and np.array_equal(a, inputs.gaussian_input(1, 10000, 3))
    assert not np.array_equal(a, inputs.gaussian_input(2, 10000, 3))
    assert not np.array_equal(a, inputs.gaussian_input(1, 10000, 4))
    assert abs(float(a.mean())) < 0.05 and 0.95 < float(a.std()) < 1.05
    exact = np.array([3.0, 4.0])
    assert inputs.relative_error(exact, exact) == 0.0
    assert inputs.relative_error(np.array([3.0, 4.5]), exact) == pytest.approx(0.1)
    assert inputs.relative_error(np.zeros(2), np.zeros(2)) == 0.0
    assert inputs.relative_error(np.ones(2), np.zeros(2)) == float("inf")


def test_exact_inputs_report_zero_error() -> None:
    results = timing.run_allreduce_sweep(_identity, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert all(r.rel_error == 0.0 and r.codec == "none" for r in results)

    def off(x: np.ndarray) -> None:
        x[0] += 1

    results = timing.run_allreduce_sweep(off, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert all(r.wrong == 1 and r.rel_error is not None and r.rel_error > 0 for r in results)
    results = timing.run_allreduce_sweep(_identity, _nothing, _same, 0, 1, check=False, **SMALL)  # type: ignore[arg-type]
    assert all(r.rel_error is None and r.wrong is None for r in results)


def test_lossy_inputs_wrong_and_error_across_ranks() -> None:
    def clean(world: ThreadWorld, rank: int, x: np.ndarray) -> None:
        world.allreduce(rank, x)
        x[:] = x.astype(np.float16)  # a lossy all-reduce, identical on every rank

    def lossy(world: ThreadWorld, rank: int, x: np.ndarray) -> None:
        clean(world, rank, x)
        if rank == 2:
            x[0] += 1  # one rank also gets one element far off

    per_rank = _sweep_world(3, lossy, inputs=_NoisyInputs(tol=0.01), codec="fp16")
    for results in per_rank:
        assert [r.codec for r in results] == ["fp16"] * 3
        assert [r.wrong for r in results] == [1, 1, 1]  # within tol but rank 2's element 0
        assert all(r.rel_error is not None and 1e-5 < r.rel_error < 0.2 for r in results)
    assert per_rank[0] == per_rank[1] == per_rank[2]
    # the error is the worst rank's: rank 2's off element makes it larger than the float16 rounding alone
    fine = _sweep_world(3, clean, inputs=_NoisyInputs(tol=0.01), codec="fp16")
    assert [r.wrong for r in fine[0]] == [0, 0, 0]
    assert all(a.rel_error > b.rel_error for a, b in zip(per_rank[0], fine[0]))  # type: ignore[operator]


def test_unknown_error_on_one_rank_is_unknown() -> None:
    class Partial(_NoisyInputs):
        def judge(self, rank: int, world: int, count: int, dtype: object) -> inputs.JudgeFn:
            inner = super().judge(rank, world, count, dtype)
            return (lambda x: (inner(x)[0], None)) if rank == 1 else inner

    per_rank = _sweep_world(2, inputs=Partial(tol=1e-3), codec="x")
    assert all(r.rel_error is None and r.wrong == 0 for r in per_rank[0])


def test_interleaved_variants_size_by_size() -> None:
    calls: list[tuple[str, int]] = []

    def make(name: str) -> Callable[[np.ndarray], None]:
        return lambda x: calls.append((name, x.size))

    variants = [timing.Variant("none", make("a")), timing.Variant("int8", make("b"), _NoisyInputs(tol=100.0))]
    results = timing.run_interleaved_sweep(variants, _nothing, _same, 0, 1, **SMALL)  # type: ignore[arg-type]
    assert [(r.bytes, r.codec) for r in results] == [
        (size, codec) for size in (64, 256, 1024) for codec in ("none", "int8")
    ]
    assert [name for name, _ in calls] == (["a"] * 4 + ["b"] * 4) * 3  # 1 warm-up + 3 timed each
    assert results[0].rel_error == 0.0 and results[1].rel_error == 0.0  # identity on one rank is exact
    with pytest.raises(ValueError):
        timing.run_interleaved_sweep([], _nothing, _same, 0, 1)


def test_format_table_with_codec_columns() -> None:
    results = [
        timing.make_result(4096, 1024, np.float32, 2.5, 4, wrong=0, rel_error=0.0),
        timing.make_result(4096, 1024, np.float32, 5.0, 4, wrong=0, codec="int8", rel_error=7.9e-3),
        timing.make_result(
            64 << 20, 16 << 20, np.float32, 12345.678, 4, wrong=2, codec="int4", rel_error=None
        ),
    ]
    lines = report.format_table(results, "t").splitlines()
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
    assert "(rel)" in lines[2]
    head = ["4096", "1024", "float32", "sum"]
    assert lines[3].split() == [*head, "none", "2.50", "1.64", "2.46", "0.00e+00", "0"]
    assert lines[4].split() == [*head, "int8", "5.00", "0.82", "1.23", "7.90e-03", "0"]
    assert lines[5].split()[4] == "int4" and lines[5].split()[-2:] == ["N/A", "2"]
    ends = _word_ends(" " + lines[1][1:])
    assert ends == _word_ends(lines[3]) == _word_ends(lines[4]) == _word_ends(lines[5])
    assert lines[6] == "# Out of bounds values : 2"
    assert lines[7] == "# Avg bus bandwidth    : none 2.458, int8 1.229, int4 8.154"
    assert lines[8] == "# Max rel. error       : none 0.00e+00, int8 7.90e-03, int4 N/A"
    # a compressed row formats with codec columns on its own; an uncompressed one without
    assert report.format_row(results[1]).split()[4] == "int8"
    assert len(report.format_row(results[0]).split()) == 8


def test_run_and_report_variants(tmp_path: Path) -> None:
    lines: list[str] = []
    parser = argparse.ArgumentParser()
    options.add_sweep_arguments(parser)
    out = tmp_path / "r.jsonl"
    args = parser.parse_args(["-b", "64", "-e", "256", "-f", "4", "-n", "2", "-w", "0", "--json", str(out)])
    variants = [timing.Variant("none", _identity), timing.Variant("fp16", _identity, _NoisyInputs(tol=1.0))]
    results = report.run_and_report(
        None,
        _nothing,
        _same,
        0,
        1,
        args,
        title="t",
        meta={"library": "x"},
        print_fn=lines.append,
        variants=variants,
    )
    assert [r.codec for r in results] == ["none", "fp16", "none", "fp16"]
    printed = "\n".join(lines).splitlines()
    assert printed[0] == "# t" and "codec" in printed[1] and len(printed) == 3 + 4 + 3
    records = report.read_json_lines(out.read_text())
    assert [r["codec"] for r in records] == ["none", "fp16"] * 2
    assert all("rel_error" in r and r["library"] == "x" for r in records)
    with pytest.raises(ValueError):
        report.run_and_report(None, _nothing, _same, 0, 1, args, title="t", print_fn=lines.append)
