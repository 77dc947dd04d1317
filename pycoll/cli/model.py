"""``pycoll model``: the cost model's predicted all-reduce time and bus bandwidth, per link class or for a
machine of GPU nodes.

    pycoll model --link pcie4 --ranks 8                    # one link: every algorithm, auto's choice
    pycoll model --ranks 8                                 # PCIe 4 vs NVLink 4 vs InfiniBand NDR
    pycoll model --link shm,eth10 --ranks 4 --compression none,fp16,int8 --plot model.png
    pycoll model --nodes 2 --gpus-per-node 8 --intra nvlink3 --inter ib_hdr --nics-per-node 8
    pycoll model --gpus-per-node 8 --intra pcie4 --p2p no --error-budget 1e-2 --json out.jsonl
    pycoll model --list [--links-file my_links.json]       # the link classes

One link (``--link``; ``pycoll.tuning.links.LINKS``; ``shm`` uses this machine's calibration when
``pycoll bench --calibrate`` saved one): a table per link gives, per size, the predicted busbw (GB/s,
nccl-tests' definition) of every algorithm and of every codec (with its best algorithm), and what
``auto`` picks; with several links a last table puts auto's predictions side by side.

A machine (``--nodes``, ``--gpus-per-node``, ``--intra``, ``--inter``, ``--nics-per-node``, ``--p2p``;
pycoll.tuning.topology): per size, NCCL's own ring, tree and NVLS (pycoll.tuning.nccl, the baseline) and
pycoll's ring, tree, direct and hierarchical, uncompressed and with each codec, as time, algbw and
busbw; then what ``compression="auto"`` runs on GPUs there (within ``--error-budget``, default the
library's) against NCCL. ``--json FILE`` writes one JSON line per prediction; ``--plot FILE.png`` draws
busbw against size (matplotlib). The models are described in pycoll/tuning/model.py and topology.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from pycoll.bench.options import parse_size
from pycoll.bench.report import format_size
from pycoll.bench.timing import sweep_sizes

__all__ = ["add_parser", "main"]

DEFAULT_LINKS = "pcie4,nvlink4,ib_ndr"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "model",
        help="predicted all-reduce time and busbw per link class (the cost model)",
        description="Predicted all-reduce time and bus bandwidth from pycoll's cost model.",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--link",
        default=DEFAULT_LINKS,
        metavar="LINK[,LINK...]",
        help=f"link classes (default {DEFAULT_LINKS}); see the list with --list",
    )
    parser.add_argument("--ranks", type=int, default=8, metavar="N", help="world size (8)")
    parser.add_argument("-b", "--minbytes", type=parse_size, default=4096, help="smallest size (4K)")
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=1 << 30, help="largest size (1G)")
    parser.add_argument("-f", "--stepfactor", type=float, default=4, help="size multiplier (4)")
    parser.add_argument(
        "--compression",
        default=None,
        metavar="CODEC[,CODEC...]",
        help="also predict these codecs (fp16, bf16, int8, int4), each with its best algorithm "
        "(default: none for --link, all four for a machine)",
    )
    parser.add_argument(
        "--error-budget",
        type=float,
        default=None,
        help="let auto compress within this relative error (e.g. 1e-2); default: no codec for --link, "
        "the library's default budget for a machine",
    )
    machine = parser.add_argument_group("a machine of GPU nodes (instead of --link / --ranks)")
    machine.add_argument("--nodes", type=int, default=None, metavar="N", help="nodes (1)")
    machine.add_argument("--gpus-per-node", type=int, default=None, metavar="G", help="GPUs per node (8)")
    machine.add_argument("--intra", default=None, metavar="LINK", help="link between a node's GPUs (nvlink4)")
    machine.add_argument("--inter", default=None, metavar="LINK", help="NIC class between nodes")
    machine.add_argument(
        "--nics-per-node", type=int, default=None, metavar="K", help="NICs per node (default: one per GPU)"
    )
    machine.add_argument("--p2p", choices=("yes", "no"), default=None, help="PCIe peer-to-peer (yes)")
    machine.add_argument(
        "--gpu", default=None, help="GPU model (a100, h100, h200, b200; default: the intra link's)"
    )
    parser.add_argument(
        "--links-file",
        default=None,
        metavar="FILE",
        help="your own link classes (JSON or TOML; docs/tuning.md)",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw busbw against size (needs matplotlib)")
    parser.add_argument("--json", metavar="FILE", help="write every prediction as JSON lines")
    parser.add_argument("--list", action="store_true", help="list the link classes and their parameters")
    parser.set_defaults(func=main)
    return parser


def _model(name: str, ranks: int, extra: dict[str, Any]) -> Any:
    from pycoll.tuning import Model
    from pycoll.tuning.persist import load_model, shm_fragment_bytes, shm_segment_bytes

    if name == "shm":
        segment, fragment = shm_segment_bytes(ranks), shm_fragment_bytes(ranks)
        calibrated = load_model(segment_bytes=segment, fragment_bytes=fragment)
        if calibrated is not None:
            return calibrated
        return replace(Model.for_link("shm", segment_bytes=segment), fragment_bytes=fragment)
    return Model.for_link(name, links=extra)


def _list_links(extra: dict[str, Any]) -> str:
    from pycoll.tuning import LINKS

    lines = [f"{'link':<8} {'kind':<6} {'alpha':>7} {'beta GB/s':>10}  {'device':<6} description (source)"]
    for link in [*LINKS.values(), *extra.values()]:
        beta = "memory" if link.beta_Bps is None else f"{link.beta_Bps / 1e9:.1f}"
        lines.append(
            f"{link.name:<8} {link.kind:<6} {link.alpha_s * 1e6:>5.1f}us {beta:>10}  {link.device:<6} "
            f"{link.description} ({link.source})"
        )
    return "\n".join(lines)


def _fail(what: str) -> int:
    print(f"pycoll model: {what}", file=sys.stderr)
    return 2


def _codecs(text: str | None, default: str) -> list[str] | str:
    """The codecs asked for, or an error message."""
    codecs = [c.strip().lower() for c in (text or default).split(",") if c.strip() and c.strip() != "none"]
    bad = [c for c in codecs if c not in ("fp16", "bf16", "int8", "int4")]
    return f"unknown codec {', '.join(bad)} (fp16, bf16, int8, int4)" if bad else codecs


def main(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {}
    if args.links_file:
        from pycoll.tuning.topology import load_links

        try:
            extra = load_links(args.links_file)
        except ValueError as exc:
            return _fail(str(exc))
    if args.list:
        print(_list_links(extra))
        return 0
    machine = (args.nodes, args.gpus_per_node, args.intra, args.inter, args.nics_per_node, args.p2p, args.gpu)
    if any(x is not None for x in machine):
        return _main_topology(args, extra)
    return _main_links(args, extra)


def _main_links(args: argparse.Namespace, extra: dict[str, Any]) -> int:
    from pycoll.tuning import LINKS
    from pycoll.tuning.model import CODEC_ALGORITHMS

    links = [name.strip().lower() for name in args.link.split(",") if name.strip()]
    bad = [name for name in links if name not in LINKS and name not in extra]
    codecs = _codecs(args.compression, "none")
    if bad or not links:
        return _fail(f"unknown link {', '.join(bad)} (choose from {', '.join([*LINKS, *extra])})")
    if isinstance(codecs, str):
        return _fail(codecs)
    if args.ranks < 1:
        return _fail(f"--ranks must be >= 1, got {args.ranks}")
    sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    algorithms = ("ring", "tree", "direct")
    records: list[dict[str, Any]] = []
    auto_rows: dict[str, list[tuple[int, str, float]]] = {}
    series: dict[str, list[tuple[int, float]]] = {}
    for name in links:
        model = _model(name, args.ranks, extra)
        header = [f"{'size':>9}"] + [f"{a:>8}" for a in algorithms] + [f"{c:>14}" for c in codecs]
        header += [f"{'auto':>20}", f"{'time':>10}"]
        print(
            f"# {name}: {model.link.description}; {args.ranks} ranks; predicted busbw GB/s "
            f"(parameters: {model.origin})"
        )
        print(" ".join(header))
        for nbytes in sizes:
            cells = [f"{format_size(nbytes):>9}"]
            for a in algorithms:
                p = model.predict("allreduce", a, args.ranks, nbytes)
                cells.append(f"{p.busbw_GBps:>8.2f}")
                records.append(_record(name, p))
                series.setdefault(f"{name} {a}", []).append((nbytes, p.busbw_GBps))
            for c in codecs:
                best = min(
                    (model.predict("allreduce", a, args.ranks, nbytes, codec=c) for a in CODEC_ALGORITHMS),
                    key=lambda p: p.time_s,
                )
                cells.append(f"{best.busbw_GBps:>8.2f} {best.algorithm:>5}")
                records.append(_record(name, best))
                series.setdefault(f"{name} {c}", []).append((nbytes, best.busbw_GBps))
            if args.error_budget is not None:
                codec, algo = model.choose_compression(args.ranks, nbytes, error_budget=args.error_budget)
            else:
                codec, algo = "none", model.choose_algorithm("allreduce", args.ranks, nbytes)
            chosen = model.predict(
                "allreduce", algo, args.ranks, nbytes, codec=None if codec == "none" else codec
            )
            label = algo if codec == "none" else f"{algo}+{codec}"
            cells.append(f"{chosen.busbw_GBps:>8.2f} {label:>11}")
            cells.append(f"{_format_time(chosen.time_s):>10}")
            auto_rows.setdefault(name, []).append((nbytes, label, chosen.busbw_GBps))
            print(" ".join(cells))
        print()
    if len(links) > 1:
        print(f"# auto's choice and predicted busbw GB/s, {args.ranks} ranks, side by side")
        print(f"{'size':>9} " + " ".join(f"{name:>22}" for name in links))
        for i, nbytes in enumerate(sizes):
            cells = [f"{auto_rows[name][i][2]:>9.2f} {auto_rows[name][i][1]:>12}" for name in links]
            print(f"{format_size(nbytes):>9} " + " ".join(cells))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if args.plot:
        from pycoll.bench.plots import plot_busbw

        try:
            plot_busbw(
                series, args.plot, title=f"pycoll cost model: predicted all-reduce busbw, {args.ranks} ranks"
            )
        except ImportError as exc:
            print(f"pycoll model: --plot needs matplotlib ({exc}); pip install matplotlib", file=sys.stderr)
            return 2
        print(f"plot written to {args.plot}")
    return 0


def _record(link: str, p: Any) -> dict[str, Any]:
    return {
        "link": link,
        "collective": p.collective,
        "algorithm": p.algorithm,
        "codec": p.codec,
        "world": p.world,
        "bytes": p.bytes,
        "time_us": p.time_s * 1e6,
        "algbw_GBps": p.algbw_GBps,
        "busbw_GBps": p.busbw_GBps,
        "expected_error": p.error,
    }


def _format_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f}ms"
    return f"{seconds:.3f}s"


def _main_topology(args: argparse.Namespace, extra: dict[str, Any]) -> int:
    """Predictions for a machine of GPU nodes (module docstring)."""
    from pycoll.auto import DEFAULT_ERROR_BUDGET
    from pycoll.tuning.topology import Topology, TopologyModel

    codecs = _codecs(args.compression, "fp16,bf16,int8,int4")
    if isinstance(codecs, str):
        return _fail(codecs)
    nodes = 1 if args.nodes is None else args.nodes
    gpus = 8 if args.gpus_per_node is None else args.gpus_per_node
    if nodes == 1 and (args.inter is not None or args.nics_per_node is not None):
        return _fail("--inter and --nics-per-node describe the links between nodes: give --nodes 2 or more")
    try:
        topology = Topology.describe(
            nodes=nodes,
            gpus_per_node=gpus,
            intra=args.intra or "nvlink4",
            inter=args.inter,
            nics_per_node=gpus if args.nics_per_node is None else args.nics_per_node,
            p2p=args.p2p != "no",
            gpu=args.gpu,
            links=extra,
        )
    except ValueError as exc:
        return _fail(str(exc))
    budget = DEFAULT_ERROR_BUDGET if args.error_budget is None else args.error_budget
    model = TopologyModel(topology)
    sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    records: list[dict[str, Any]] = []
    series: dict[str, list[tuple[int, float]]] = {}
    print(
        f"# {topology.label}: {topology.world} GPUs ({topology.gpu.name}); predicted all-reduce of float32, "
        "busbw GB/s per codec, and the uncompressed call's algbw and time (codecs: pycoll's algorithms only)"
    )
    print(
        f"{'size':>9}  {'algorithm':<13}"
        + "".join(f"{c:>9}" for c in ["none", *codecs])
        + f"{'algbw':>9}{'time':>11}"
    )
    for nbytes in sizes:
        for algorithm in model.algorithms():
            plain = model.predict(algorithm, nbytes)
            cells = [f"{plain.busbw_GBps:>9.2f}"]
            records.append(_topology_record(topology, plain))
            series.setdefault(algorithm, []).append((nbytes, plain.busbw_GBps))
            for codec in codecs:
                if algorithm not in model.codec_algorithms():
                    cells.append(f"{'-':>9}")
                    continue
                p = model.predict(algorithm, nbytes, codec)
                cells.append(f"{p.busbw_GBps:>9.2f}")
                records.append(_topology_record(topology, p))
            size = f"{format_size(nbytes):>9}  {algorithm:<13}"
            print(size + "".join(cells) + f"{plain.algbw_GBps:>9.2f}{_format_time(plain.time_s):>11}")
        for codec in codecs:
            best = model.best_compressed(nbytes, codec)
            series.setdefault(f"best with {codec}", []).append((nbytes, best.busbw_GBps))
    print()
    print(f"# compression=\"auto\" on GPUs (error budget {budget:g}) against NCCL (its fastest algorithm)")
    print(
        f"{'size':>9}  {'NCCL busbw':>10} {'time':>10}  {'auto runs':<20} {'busbw':>8} {'time':>10} "
        f"{'speed-up':>9}"
    )
    for nbytes in sizes:
        nccl = model.nccl(nbytes)
        codec, algorithm = model.choose_compression(nbytes, error_budget=budget)
        if algorithm == "nccl":
            chosen, label = nccl, nccl.algorithm
        else:
            chosen = model.predict(algorithm, nbytes, None if codec == "none" else codec)
            label = algorithm if codec == "none" else f"{algorithm}+{codec}"
        records.append({**_topology_record(topology, chosen), "auto": True, "error_budget": budget})
        series.setdefault("auto", []).append((nbytes, chosen.busbw_GBps))
        print(
            f"{format_size(nbytes):>9}  {nccl.busbw_GBps:>10.2f} {_format_time(nccl.time_s):>10}  "
            f"{label:<20} {chosen.busbw_GBps:>8.2f} {_format_time(chosen.time_s):>10} "
            f"{nccl.time_s / chosen.time_s if chosen.time_s > 0 else 1.0:>8.2f}x"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    if args.plot:
        from pycoll.bench.plots import plot_busbw

        styles = {name: "--" for name in series if name.startswith("nccl")}
        try:
            title = f"pycoll cost model: all-reduce on {topology.label}"
            plot_busbw(series, args.plot, title=title, styles=styles)
        except ImportError as exc:
            return _fail(f"--plot needs matplotlib ({exc}); pip install matplotlib")
        print(f"plot written to {args.plot}")
    return 0


def _topology_record(topology: Any, p: Any) -> dict[str, Any]:
    return {
        "topology": topology.label,
        "machine": topology.to_dict(),
        "algorithm": p.algorithm,
        "codec": p.codec,
        "world": p.world,
        "bytes": p.bytes,
        "time_s": p.time_s,
        "algbw_GBps": p.algbw_GBps,
        "busbw_GBps": p.busbw_GBps,
        "expected_error": p.error,
    }
