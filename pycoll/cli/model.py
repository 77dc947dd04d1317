"""``pycoll model``: the cost model's predicted all-reduce time and bus bandwidth, per link class.

    pycoll model --link pcie4 --ranks 8                    # one link: every algorithm, auto's choice
    pycoll model --ranks 8                                 # PCIe 4 vs NVLink 4 vs InfiniBand NDR
    pycoll model --link shm,eth10 --ranks 4 --compression none,fp16,int8 --plot model.png

For each link (``pycoll.tuning.links.LINKS``; ``shm`` uses this machine's calibration when
``pycoll bench --calibrate`` saved one) a table gives, per size, the predicted busbw (GB/s, nccl-tests'
definition) of every algorithm and of every codec (with its best algorithm), and what ``auto`` picks.
With several links a last table puts auto's predictions side by side. ``--plot FILE.png`` draws busbw
against size for every link and algorithm (matplotlib). The model is described in pycoll/tuning/model.py.
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
        default="none",
        metavar="CODEC[,CODEC...]",
        help="also predict these codecs (fp16, bf16, int8, int4), each with its best algorithm",
    )
    parser.add_argument(
        "--error-budget",
        type=float,
        default=None,
        help="let auto compress within this relative error (e.g. 1e-2); default: no codec",
    )
    parser.add_argument("--plot", metavar="FILE.png", help="draw busbw against size (needs matplotlib)")
    parser.add_argument("--json", metavar="FILE", help="write every prediction as JSON lines")
    parser.add_argument("--list", action="store_true", help="list the link classes and their parameters")
    parser.set_defaults(func=main)
    return parser


def _model(name: str, ranks: int) -> Any:
    from pycoll.tuning import Model
    from pycoll.tuning.persist import load_model, shm_fragment_bytes, shm_segment_bytes

    if name == "shm":
        segment, fragment = shm_segment_bytes(ranks), shm_fragment_bytes(ranks)
        calibrated = load_model(segment_bytes=segment, fragment_bytes=fragment)
        if calibrated is not None:
            return calibrated
        return replace(Model.for_link("shm", segment_bytes=segment), fragment_bytes=fragment)
    return Model.for_link(name)


def _list_links() -> str:
    from pycoll.tuning import LINKS

    lines = [f"{'link':<8} {'alpha':>7} {'beta GB/s':>10}  {'device':<6} description (source)"]
    for link in LINKS.values():
        beta = "memory" if link.beta_Bps is None else f"{link.beta_Bps / 1e9:.1f}"
        lines.append(
            f"{link.name:<8} {link.alpha_s * 1e6:>5.1f}us {beta:>10}  {link.device:<6} "
            f"{link.description} ({link.source})"
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from pycoll.tuning import LINKS
    from pycoll.tuning.model import CODEC_ALGORITHMS

    if args.list:
        print(_list_links())
        return 0
    links = [name.strip().lower() for name in args.link.split(",") if name.strip()]
    bad = [name for name in links if name not in LINKS]
    codecs = [c.strip().lower() for c in args.compression.split(",") if c.strip() and c.strip() != "none"]
    bad_codecs = [c for c in codecs if c not in ("fp16", "bf16", "int8", "int4")]
    if bad or not links or bad_codecs or args.ranks < 1:
        what = (
            f"unknown link {', '.join(bad)} (choose from {', '.join(LINKS)})"
            if bad or not links
            else f"unknown codec {', '.join(bad_codecs)} (fp16, bf16, int8, int4)"
            if bad_codecs
            else f"--ranks must be >= 1, got {args.ranks}"
        )
        print(f"pycoll model: {what}", file=sys.stderr)
        return 2
    sizes = sweep_sizes(args.minbytes, args.maxbytes, args.stepfactor)
    algorithms = ("ring", "tree", "direct")
    records: list[dict[str, Any]] = []
    auto_rows: dict[str, list[tuple[int, str, float]]] = {}
    series: dict[str, list[tuple[int, float]]] = {}
    for name in links:
        model = _model(name, args.ranks)
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
