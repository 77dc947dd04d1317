"""The torch.distributed backend "pycoll" against gloo, and against pycoll's own API (issue 17).

    python bench/torch_backend.py                      # 2 and 4 ranks (started with `pycoll run`)
    python bench/torch_backend.py --ranks 2 --sizes 4K,1M,64M --rounds 3 --no-ddp
    python bench/torch_backend.py --netns              # 2 namespaced hosts, 1 rank each, 1 Gbit/s link
    python bench/torch_backend.py --quick              # smoke test: 2 ranks, 3 sizes, 2 short rounds
    pycoll run -n 4 bench/torch_backend.py             # launched by hand (or with torchrun)

The ranks' default group is the pycoll backend's (``pycoll.torch.init_process_group()``: torch's env://
under torchrun, the launcher's store under ``pycoll run``); ``dist.new_group(backend="gloo")`` is a gloo
group over the same ranks, in the same processes.

1. all-reduce (float32 sum), interleaved size by size, the order of the variants rotated from round to
   round: ``backend`` (``dist.all_reduce(t)`` on the pycoll default group), ``gloo``
   (``dist.all_reduce(t, group=gloo)``), ``api`` (``pycoll.allreduce(t, "sum", comm=pg.comm)``: pycoll's
   own API on the very communicator the backend uses) and ``int8`` (``dist.all_reduce`` on a pycoll group
   with ``Options("int8", algorithm="direct")``, error feedback on; busbw counts the uncompressed bytes,
   and its check is the codec's derived bound). Each call follows a pycoll barrier; its time is
   the slowest rank's; a variant's figure for a round is the median over its timed iterations (after
   ``--warmup`` untimed ones), as many as fill about ``--target-s`` seconds (at least ``--min-iters``;
   counted in the first round, kept after). The timed calls reduce zeros (the sum stays put); every
   round first checks one call per size and variant on rank-dependent inputs against the closed form.
   The table gives per size the median over rounds of each variant's time, its busbw (nccl-tests:
   2(n-1)/n * bytes / time), the median over rounds of the per-round gloo/backend time ratio (> 1: the
   backend is faster) and of the per-round backend - api time (the backend's overhead per call).
2. DDP step time (``--ddp``, the default on one host): the MLP of bench/ddp_hooks.py, plain
   ``DDP(model, process_group=group)`` (no comm hook) over the gloo group, the pycoll default group, and
   a pycoll group with ``Options("int8")`` (error feedback on); rounds as there (slowest rank's step,
   median over steps, median over rounds, ratio = median of per-round ratios to gloo).
3. ``--netns``: the all-reduce part between 2 "hosts" (network namespaces of tests/netns.py, one rank
   each, every link shaped with tbf to ``--rate`` both ways), one ``pycoll run --nnodes 2`` launcher per
   namespace; gloo binds to the namespace's veth (GLOO_SOCKET_IFNAME). Needs root and iproute2: skipped
   (exit 0, the reason on stderr) when network namespaces cannot be made.

Every wait has a deadline: ``--timeout`` for rendezvous and each collective, ``--job-timeout`` for each
launcher.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NoReturn

from pycoll.bench import jobs
from pycoll.bench.options import parse_size
from pycoll.bench.report import format_size

if TYPE_CHECKING:
    import torch

HERE = Path(__file__).resolve()
REPO = HERE.parents[1]
VARIANTS = ("backend", "gloo", "api", "int8")
LABELS = {"backend": "pycoll backend", "gloo": "gloo", "api": "pycoll API", "int8": "backend int8"}
DDP_VARIANTS = ("gloo", "pycoll", "int8")
DDP_LABELS = {
    "gloo": "DDP over the gloo group",
    "pycoll": "DDP over the pycoll default group (uncompressed)",
    "int8": 'DDP over a pycoll group, Options("int8") + error feedback',
}
SIZES = {"local": "4K,16K,64K,256K,1M,4M,16M,64M", "netns": "64K,256K,1M,4M,16M,64M"}
QUICK_SIZES = {"local": "4K,64K,1M", "netns": "64K,4M"}
SMALL = 64 << 10  # the summary's "small sizes": at most this many bytes
MAX_ITERS = 5000
#: Within this share of gloo counts as a tie (both saturate the same link; bench/netns_bench.py's GLOO_TIE).
TIE = 0.02
Call = Callable[["torch.Tensor"], Any]


# ---------------------------------------------------------------------------------------------------------
# Command line


def _sizes(text: str) -> list[int]:
    sizes = sorted({parse_size(w) for w in text.split(",") if w.strip()})
    if not sizes or any(s % 4 for s in sizes):
        raise argparse.ArgumentTypeError(f"sizes must be whole float32 counts in bytes (4K,1M): {text!r}")
    return sizes


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = ap.add_argument
    add("--ranks", default="2,4", help="rank counts on one host, a comma list (2,4)")
    add(
        "--sizes",
        type=_sizes,
        default=None,
        help=f"bytes: 4K,1M,... ({SIZES['local']}; --netns: {SIZES['netns']})",
    )
    add("--rounds", type=int, default=None, help="rounds (5; --quick: 2)")
    add("--target-s", type=float, default=None, help="timed seconds per size, variant and round (0.2)")
    add("--min-iters", type=int, default=5, help="timed iterations per size, variant and round, at least")
    add("--warmup", type=int, default=None, help="untimed iterations before them (3; --quick: 1)")
    add("--ddp", action=argparse.BooleanOptionalAction, default=True, help="the DDP step part (on)")
    add("--steps", type=int, default=None, help="timed DDP steps per variant per round (20; --quick: 5)")
    add("--features", type=int, default=512)
    add("--hidden", type=int, default=1024)
    add("--layers", type=int, default=3, help="hidden layers")
    add("--batch-size", type=int, default=32, help="samples per rank per step")
    add("--threads", type=int, default=0, help="torch threads per rank (0: cores / ranks on the machine)")
    add("--netns", action="store_true", help="all-reduce between 2 namespaced hosts on a shaped link")
    add("--rate", default="1gbit", help="--netns: tbf rate of each link, each way (1gbit)")
    add("--timeout", type=float, default=120.0, help="seconds for rendezvous and each collective (120)")
    add("--job-timeout", type=float, default=3600.0, help="seconds one launcher may run (3600)")
    add("--quick", action="store_true", help="smoke test: 2 ranks, few sizes, 2 short rounds")
    return ap


def _resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fills the defaults that depend on --quick and --netns."""
    where = "netns" if args.netns else "local"
    quick = args.quick
    if quick and args.ranks == "2,4":
        args.ranks = "2"
    args.sizes = args.sizes or _sizes((QUICK_SIZES if quick else SIZES)[where])
    args.rounds = args.rounds or (2 if quick else 5)
    args.target_s = args.target_s or (0.02 if quick else 0.2)
    args.warmup = (1 if quick else 3) if args.warmup is None else args.warmup
    args.steps = args.steps or (5 if quick else 20)
    args.ddp = args.ddp and not args.netns
    return args


# ---------------------------------------------------------------------------------------------------------
# Launching (not under a launcher)


def _launch_local(argv: list[str], args: argparse.Namespace) -> int:
    """``pycoll run -n N`` of this script for each rank count."""
    for n in [int(w) for w in args.ranks.split(",") if w.strip()]:
        cmd = jobs.script_command(n, str(HERE), argv)
        try:
            code = subprocess.run(cmd, timeout=args.job_timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"torch_backend: {n} ranks did not finish in {args.job_timeout:g} s", file=sys.stderr)
            return 124
        if code != 0:
            return code
    return 0


def _netns() -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    import netns  # tests/netns.py

    return netns


def _launch_netns(argv: list[str], args: argparse.Namespace) -> int:
    """One ``pycoll run --nnodes 2`` launcher per namespaced host; prints node 0's output."""
    netns = _netns()
    problem = netns.why_no_netns(args.rate)
    if problem:
        print(f"torch_backend: --netns skipped: {problem}", file=sys.stderr)
        return 0
    try:
        with tempfile.TemporaryDirectory(prefix="pycoll-torch-netns-") as tmp:
            env = dict(os.environ)
            env.pop("PYCOLL_TRANSPORT", None)  # auto: TCP between the hosts
            with netns.virtual_hosts(2, args.rate) as hosts:
                nodes = netns.start_pycoll_job(hosts, 1, [str(HERE), *argv], Path(tmp), env=env, tag="tb-")
                try:
                    finished = netns.wait_job(nodes, args.job_timeout)
                finally:
                    netns.stop_job(nodes)
                return _netns_report(nodes, finished)
    except KeyboardInterrupt:
        print("torch_backend: interrupted; namespaces removed", file=sys.stderr)
        return 130
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:  # NetnsError is a RuntimeError
        print(f"torch_backend: {exc}", file=sys.stderr)
        return 1


def _netns_report(nodes: list[Any], finished: bool) -> int:
    print(nodes[0].stdout(), end="", flush=True)
    failed = [n for n in nodes if n.proc.returncode != 0]
    if finished and not failed:
        return 0
    for n in nodes:
        print(
            f"--- node {n.node_rank} ({n.host.name}): exit {n.proc.returncode}\n{n.stdout()}{n.stderr()}",
            file=sys.stderr,
        )
    return 124 if not finished else 1


# ---------------------------------------------------------------------------------------------------------
# Rank side: process groups


def _init_process_group(timeout_s: float) -> None:
    import pycoll.torch

    pycoll.torch.init_process_group("pycoll", timeout=timedelta(seconds=timeout_s))


def _slowest(values: list[float], gloo: Any) -> list[float]:
    """The element-wise maximum over the ranks (over gloo, so that pycoll only runs what is timed)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo)
    return t.tolist()


# ---------------------------------------------------------------------------------------------------------
# Rank side: all-reduce


def _calls(pg: Any, gloo: Any, int8: Any) -> dict[str, Call]:
    import torch.distributed as dist

    import pycoll

    comm = pg.comm
    return {
        "backend": lambda t: dist.all_reduce(t),
        "gloo": lambda t: dist.all_reduce(t, group=gloo),
        "api": lambda t: pycoll.allreduce(t, "sum", comm=comm),
        "int8": lambda t: dist.all_reduce(t, group=int8),
    }


def _check_inputs(rank: int, world: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s input (rank + 1) / 4 + (i % 13) and the sum over the ranks; exact in float32."""
    import torch

    pattern = (torch.arange(count, dtype=torch.int64) % 13).to(torch.float32)
    return pattern + (rank + 1) / 4, pattern * world + world * (world + 1) / 8


def _wrong(call: Call, x: torch.Tensor, expected: torch.Tensor, world: int, lossy: bool) -> int:
    """Elements of the all-reduce of ``x`` that are wrong: not equal to ``expected``, or for the int8
    group outside the codec's derived bound (pycoll.compression.bounds, every rank's closed-form input)."""
    y = x.clone()
    call(y)
    if not lossy:
        return int((y != expected).sum())
    from pycoll.compression import Int8
    from pycoll.compression.bounds import error_bound

    inputs = [_check_inputs(r, world, x.numel())[0].numpy() for r in range(world)]
    bound = error_bound(Int8(), "direct", inputs, y.numpy())
    return int(((y - expected).abs().numpy() > bound).sum())


def _timed(call: Call, t: torch.Tensor, n: int, barrier: Callable[[], None]) -> list[float]:
    """This rank's seconds per call, each call after a barrier."""
    out = []
    for _ in range(n):
        barrier()
        t0 = time.perf_counter()
        call(t)
        out.append(time.perf_counter() - t0)
    return out


def _iterations(per_call_s: float, args: argparse.Namespace) -> int:
    return max(args.min_iters, min(MAX_ITERS, math.ceil(args.target_s / max(per_call_s, 1e-7))))


class AllreduceBench:
    """The all-reduce part in one rank: ``run_round`` per round, then ``allreduce_table`` (rank 0)."""

    def __init__(self, pg: Any, gloo: Any, int8: Any, args: argparse.Namespace) -> None:
        import pycoll

        self.pg, self.gloo, self.args = pg, gloo, args
        self.rank, self.world = pg.rank(), pg.size()
        self.calls = _calls(pg, gloo, int8)
        self.barrier = lambda: pycoll.barrier(comm=pg.comm)
        self.iters: dict[tuple[int, str], int] = {}
        self.times: dict[tuple[int, str], list[float]] = {}  # per round: slowest-rank median, seconds
        self.wrong: dict[tuple[int, str], int] = {}

    def run_round(self, r: int) -> None:
        order = VARIANTS[r % len(VARIANTS) :] + VARIANTS[: r % len(VARIANTS)]
        for size in self.args.sizes:
            x, expected = _check_inputs(self.rank, self.world, size // 4)
            for name in order:
                wrong = _wrong(self.calls[name], x, expected, self.world, name == "int8")
                self.wrong[size, name] = self.wrong.get((size, name), 0) + wrong
            del x, expected
            t = _zeros(size)
            for name in order:
                self.times.setdefault((size, name), []).append(self._one(size, name, t))

    def _one(self, size: int, name: str, t: torch.Tensor) -> float:
        call, args = self.calls[name], self.args
        warm = _timed(call, t, max(1, args.warmup), self.barrier)
        if (size, name) not in self.iters:
            per_call = max(_slowest([statistics.median(warm)], self.gloo))
            self.iters[size, name] = _iterations(per_call, args)
        mine = _timed(call, t, self.iters[size, name], self.barrier)
        return statistics.median(_slowest(mine, self.gloo))

    def wrong_total(self) -> dict[tuple[int, str], int]:
        return {
            k: int(v)
            for k, v in zip(self.wrong, _slowest([float(v) for v in self.wrong.values()], self.gloo))
        }


def _zeros(size: int) -> torch.Tensor:
    import torch

    return torch.zeros(size // 4, dtype=torch.float32)


def _busbw(size: int, world: int, seconds: float) -> float:
    return 2 * (world - 1) / world * size / seconds / 1e9


def _med_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def allreduce_table(bench: AllreduceBench, title: str) -> list[str]:
    """The markdown table and the summary lines (rank 0)."""
    t, world, sizes = bench.times, bench.world, bench.args.sizes
    lines = [
        title,
        "",
        "| size | "
        + " | ".join(f"{LABELS[v]} µs" for v in VARIANTS)
        + " | "
        + " | ".join(f"{LABELS[v]} busbw GB/s" for v in VARIANTS)
        + " | backend speed / gloo | int8 speed / gloo | backend − API µs | iters (b/g/a/i) |",
        "|---:|" + "---:|" * (2 * len(VARIANTS) + 4),
    ]
    overhead, speed = {}, {}
    for s in sizes:
        med = {v: statistics.median(t[s, v]) for v in VARIANTS}
        speed[s] = _med_ratio(t[s, "gloo"], t[s, "backend"])
        overhead[s] = 1e6 * statistics.median(b - a for b, a in zip(t[s, "backend"], t[s, "api"]))
        lines.append(
            f"| {format_size(s)} | "
            + " | ".join(f"{1e6 * med[v]:.1f}" for v in VARIANTS)
            + " | "
            + " | ".join(f"{_busbw(s, world, med[v]):.3f}" for v in VARIANTS)
            + f" | {speed[s]:.2f}× | {_med_ratio(t[s, 'gloo'], t[s, 'int8']):.2f}× | {overhead[s]:+.1f} | "
            + "/".join(str(bench.iters[s, v]) for v in VARIANTS)
            + " |"
        )
    return lines + [""] + _summary(overhead, speed)


def _summary(overhead: dict[int, float], speed: dict[int, float]) -> list[str]:
    small = [o for s, o in overhead.items() if s <= SMALL]
    large = {s: x for s, x in speed.items() if s >= SMALL}
    misses = [
        f"{format_size(s)}: {x:.2f}×{' (a tie)' if x >= 1 - TIE else ''}" for s, x in large.items() if x <= 1
    ]
    out = []
    if small:
        out.append(
            "- backend overhead over pycoll's API, median over sizes ≤ 64 KiB: "
            f"{statistics.median(small):+.1f} µs per call"
        )
    if large:
        verdict = "yes" if not misses else f"no (not at {', '.join(misses)})"
        out.append(f"- backend faster than gloo at every size ≥ 64 KiB: {verdict}")
    return out


def _check_lines(wrong: dict[tuple[int, str], int]) -> list[str]:
    bad = [f"{format_size(s)} {LABELS[v]}: {n} wrong element(s)" for (s, v), n in wrong.items() if n]
    if bad:
        return ["- CHECK FAILED: " + "; ".join(bad)]
    return [
        f"- results checked: {len(wrong)} (size, variant) pairs, each once per round, "
        "all exact (int8: within its derived bound)"
    ]


# ---------------------------------------------------------------------------------------------------------
# Rank side: DDP step time


def _mlp(args: argparse.Namespace) -> Any:
    """The MLP of bench/ddp_hooks.py."""
    sys.path.insert(0, str(HERE.parent))
    from ddp_hooks import mlp

    return mlp(args.features, args.hidden, args.layers)


class DdpBench:
    """The DDP part in one rank: one DDP model and optimizer per variant, made up front."""

    def __init__(self, groups: dict[str, Any], gloo: Any, args: argparse.Namespace) -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.gloo, self.args = gloo, args
        self.runs = {}
        for name, group in groups.items():
            model = DDP(_mlp(args), process_group=group)
            self.runs[name] = (model, torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
        self.n_params = sum(p.numel() for p in self.runs["gloo"][0].parameters())
        g = torch.Generator().manual_seed(1 + groups["gloo"].rank())
        self.x = torch.randn(args.batch_size, args.features, generator=g)
        self.y = torch.randint(0, 10, (args.batch_size,), generator=g)
        self.times: dict[str, list[float]] = {name: [] for name in groups}  # per round, seconds

    def _step(self, name: str) -> float:
        import torch.nn.functional as F

        model, opt = self.runs[name]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(self.x), self.y).backward()
        opt.step()
        return time.perf_counter() - t0

    def run_round(self, r: int, barrier: Callable[[], None]) -> None:
        names = list(self.runs)
        for name in names[r % len(names) :] + names[: r % len(names)]:
            for _ in range(self.args.warmup + (5 if r == 0 else 0)):
                self._step(name)
            barrier()
            mine = [self._step(name) for _ in range(self.args.steps)]
            self.times[name].append(statistics.median(_slowest(mine, self.gloo)))

    def table(self, world: int) -> list[str]:
        a, t = self.args, self.times
        lines = [
            f"## DDP step time, {world} ranks, {a.rounds} rounds x {a.steps} steps; MLP {a.features}-"
            f"{'-'.join([str(a.hidden)] * a.layers)}-10: {self.n_params / 1e6:.2f}M parameters, "
            f"{4 * self.n_params / 1e6:.1f} MB of float32 gradients; batch {a.batch_size} per rank; SGD",
            "",
            "| process group | ms / step (median) | × gloo (median of per-round ratios) | range |",
            "|---|---:|---:|---:|",
        ]
        for name in self.runs:
            ratios = [m / g for m, g in zip(t[name], t["gloo"])]
            lines.append(
                f"| {DDP_LABELS[name]} | {1e3 * statistics.median(t[name]):.1f} | "
                f"{statistics.median(ratios):.2f}× | {min(ratios):.2f}–{max(ratios):.2f} |"
            )
        return lines


# ---------------------------------------------------------------------------------------------------------
# Rank side: main


def _title(args: argparse.Namespace, world: int, threads: int) -> str:
    where = (
        f"2 hosts (network namespaces, 1 rank each, every link tbf {args.rate} each way; pycoll and gloo "
        f"over TCP)"
        if args.netns
        else f"{world} ranks on one host (pycoll: shared memory; gloo: TCP loopback)"
    )
    return (
        f"## all_reduce float32 sum, {where}, {threads} torch thread(s) per rank, {args.rounds} round(s), "
        f"~{args.target_s:g} s per size, variant and round; time = slowest rank, median over iterations"
    )


def _rank_main(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    import pycoll.torch as pt

    _init_process_group(args.timeout)
    world = dist.get_world_size()
    on_machine = world if args.netns else int(os.environ.get("LOCAL_WORLD_SIZE", world))
    threads = args.threads or max(1, (os.cpu_count() or 1) // on_machine)
    torch.set_num_threads(threads)
    gloo = dist.new_group(backend="gloo", timeout=timedelta(seconds=args.timeout))
    pg = dist.group.WORLD
    if not isinstance(pg, pt.ProcessGroupPycoll):
        raise RuntimeError(f"the default group is {type(pg).__name__}, not ProcessGroupPycoll")
    ok, int8 = _allreduce_part(pg, gloo, args, _title(args, world, threads))
    pycoll_groups = [pg, int8]
    if args.ddp:
        pycoll_groups.append(_ddp_part(pg, gloo, args))
    dist.barrier(group=gloo)
    _exit(0 if ok else 1, pycoll_groups)


def _allreduce_part(pg: Any, gloo: Any, args: argparse.Namespace, title: str) -> tuple[bool, Any]:
    """Runs and prints (rank 0) the all-reduce part; whether every result was right, and the int8 group."""
    import torch.distributed as dist

    import pycoll.torch as pt

    # Compressed (error feedback on, as in training); direct, the algorithm the bound of _wrong assumes.
    options = pt.Options("int8", algorithm="direct")
    int8 = dist.new_group(backend="pycoll", pg_options=options, timeout=timedelta(seconds=args.timeout))
    bench = AllreduceBench(pg, gloo, int8, args)
    for r in range(args.rounds):
        bench.run_round(r)
    wrong = bench.wrong_total()
    if pg.rank() == 0:
        print("\n".join(allreduce_table(bench, title) + _check_lines(wrong)) + "\n", flush=True)
    return not any(wrong.values()), int8


def _ddp_part(pg: Any, gloo: Any, args: argparse.Namespace) -> Any:
    """Runs and prints (rank 0) the DDP part; the int8 group it made."""
    import torch.distributed as dist

    import pycoll.torch as pt

    delta = timedelta(seconds=args.timeout)
    int8 = dist.new_group(backend="pycoll", pg_options=pt.Options("int8"), timeout=delta)
    ddp = DdpBench({"gloo": gloo, "pycoll": pg, "int8": int8}, gloo, args)
    for r in range(args.rounds):
        ddp.run_round(r, lambda: dist.barrier(group=gloo))
    if pg.rank() == 0:
        print("\n".join(ddp.table(pg.size())) + "\n", flush=True)
    return int8


def _exit(code: int, pycoll_groups: list[Any]) -> NoReturn:
    """Closes the pycoll groups and leaves without Python's
    finalization: torch 2.13's gloo run-loop thread may still be dropping a finished work's tensors
    then, and a thread that needs the GIL while the interpreter finalizes aborts the process
    (std::terminate in ~AsyncBarrierWork, about one exit in five here; dist.destroy_process_group() has
    the same problem, bench/ddp_hooks.py)."""
    for group in pycoll_groups:
        group.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _resolve(_parser().parse_args(argv))
    if "RANK" in os.environ:
        return _rank_main(args)
    if args.netns:
        return _launch_netns(argv, args)
    return _launch_local(argv, args)


if __name__ == "__main__":
    sys.exit(main())
