"""Calibration: fit the cost model's parameters to all-reduces measured on this machine, save, load.

``pycoll bench --calibrate`` (or ``python -m pycoll.tuning.calibrate``) times pycoll's all-reduce over
shared memory for every algorithm (and the codecs), on several world sizes, sizes 4 KiB..64 MiB, with the
timing loop of ``pycoll bench`` (pycoll/benchmark.py: slowest rank, median over iterations, variants
interleaved size by size). It then fits the shared-memory link and CPU parameters of
``pycoll.tuning.links`` — per-step latency ``alpha_s``, per-rank copy bandwidth ``copy_Bps``, host memory
bandwidth ``host_copy_Bps``, the per-algorithm ``efficiency`` and one factor on the codecs' rates — by
least squares on log(time) (Nelder-Mead, sizes of 1 MiB and up weighted double: that is where the
bandwidth parameters show), and saves them as JSON to ``tuning_file()``
(``$PYCOLL_TUNING_FILE``, default ``~/.cache/pycoll/tuning.json``). ``load_model`` reads them back for
``algorithm="auto"`` / ``compression="auto"``; a file written on another host is ignored.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pycoll.benchmark import parse_size
from pycoll.tuning.links import DeviceProfile, LinkProfile, device_for, link_named
from pycoll.tuning.model import Model, Timing, plan_costs

__all__ = [
    "Measurement",
    "fit",
    "load_model",
    "measure",
    "save_model",
    "last_level_cache_bytes",
    "shm_fragment_bytes",
    "shm_segment_bytes",
    "tuning_file",
]

ALGORITHMS = ("ring", "direct", "tree")
DEFAULT_WORLDS = (2, 3, 4)
DEFAULT_CODECS = ("none", "int8")
#: Sizes from which the bandwidth parameters dominate; weighted double in the fit.
LARGE_BYTES = 1 << 20


@dataclass(frozen=True)
class Measurement:
    """One measured point: median time of the slowest rank."""

    world: int
    algorithm: str
    codec: str
    bytes: int
    time_s: float


def tuning_file() -> Path:
    """Where calibrations are saved: ``$PYCOLL_TUNING_FILE`` or ``~/.cache/pycoll/tuning.json``.
    ``PYCOLL_TUNING_FILE=none`` makes ``load_model`` ignore any calibration (the built-in defaults)."""
    env = os.environ.get("PYCOLL_TUNING_FILE")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "pycoll" / "tuning.json"


def shm_segment_bytes(world: int) -> int:
    """The shared-memory transport's message size (half a ring of slots; csrc/transport/shm.h) under the
    current environment's settings."""
    from pycoll.env import Settings

    settings = Settings.from_environ()
    return settings.slot_bytes_for(world) * settings.shm_slots // 2


def shm_fragment_bytes(world: int) -> int:
    """The shared-memory transport's fragment: one ring slot (csrc/transport/shm.h)."""
    from pycoll.env import Settings

    return Settings.from_environ().slot_bytes_for(world)


def last_level_cache_bytes(sys_root: str = "/sys") -> int | None:
    """Size of the largest CPU cache (sysfs), or None when it cannot be read."""
    sizes = []
    base = Path(sys_root) / "devices/system/cpu/cpu0/cache"
    for index in sorted(base.glob("index*")):
        try:
            text = (index / "size").read_text().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes) if sizes else None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# ---------------------------------------------------------------------------------------------------
# Fitting.

# (name, getter, setter) of each fitted parameter; all are positive and fitted in log space.
_Param = tuple[
    str,
    Callable[[LinkProfile, DeviceProfile], float],
    Callable[[LinkProfile, DeviceProfile, float], tuple[LinkProfile, DeviceProfile]],
]


def _params(algorithms: Sequence[str], with_codecs: bool) -> list[_Param]:
    params: list[_Param] = [
        (
            "cache_bytes",
            lambda lk, dv: float(dv.cache_bytes or 32 << 20),
            lambda lk, dv, v: (lk, replace(dv, cache_bytes=int(v))),
        ),
        ("alpha_s", lambda lk, dv: lk.alpha_s, lambda lk, dv, v: (replace(lk, alpha_s=v), dv)),
        ("copy_Bps", lambda lk, dv: dv.copy_Bps, lambda lk, dv, v: (lk, replace(dv, copy_Bps=v))),
        (
            "memory_Bps",
            lambda lk, dv: dv.memory_Bps or dv.host_copy_Bps or dv.copy_Bps,
            lambda lk, dv, v: (lk, replace(dv, memory_Bps=v)),
        ),
        (
            "host_copy_Bps",
            lambda lk, dv: dv.host_copy_Bps or 2 * dv.copy_Bps,
            lambda lk, dv, v: (lk, replace(dv, host_copy_Bps=v)),
        ),
    ]
    # The first algorithm's efficiency stays 1 (the bandwidths carry its scale); the others are relative.
    for algorithm in algorithms[1:]:

        def get(lk: LinkProfile, dv: DeviceProfile, a: str = algorithm) -> float:
            return lk.efficiency.get(a, 1.0)

        def put(
            lk: LinkProfile, dv: DeviceProfile, v: float, a: str = algorithm
        ) -> tuple[LinkProfile, DeviceProfile]:
            return replace(lk, efficiency={**lk.efficiency, a: v}), dv

        params.append((f"efficiency[{algorithm}]", get, put))

        def get_memory(lk: LinkProfile, dv: DeviceProfile, a: str = algorithm) -> float:
            return lk.memory_efficiency.get(a, 1.0)

        def put_memory(
            lk: LinkProfile, dv: DeviceProfile, v: float, a: str = algorithm
        ) -> tuple[LinkProfile, DeviceProfile]:
            return replace(lk, memory_efficiency={**lk.memory_efficiency, a: v}), dv

        params.append((f"memory_efficiency[{algorithm}]", get_memory, put_memory))
    if with_codecs:

        def get_codec_scale(lk: LinkProfile, dv: DeviceProfile) -> float:
            return 1.0

        def put_codec_scale(
            lk: LinkProfile, dv: DeviceProfile, v: float
        ) -> tuple[LinkProfile, DeviceProfile]:
            rates = {k: (e * v, d * v) for k, (e, d) in dv.codec_Bps.items()}
            return lk, replace(dv, codec_Bps=rates)

        params.append(("codec_scale", get_codec_scale, put_codec_scale))
    return params


def _nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iters: int = 400
) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (a plain Nelder-Mead simplex; numpy only)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) < 1e-10:
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        if fr < values[0]:
            expanded = centroid + 2 * (centroid - simplex[-1])
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [best + 0.5 * (x - best) for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    return simplex[int(np.argmin(values))]


def fit(
    measurements: Sequence[Measurement], base: Model | None = None, *, workers: int | None = None
) -> tuple[Model, dict[str, Any]]:
    """The shared-memory model whose predictions best match ``measurements`` (see the module docstring),
    and a report: fitted values, and the relative error of every point.

    A prediction is the larger of the critical path and the host-memory bound, each a sum of components
    over the parameters (``Model.timing``). Which ops form the critical path depends on the parameters
    only a little, so the fit alternates: run the plans at the current parameters to get every point's
    composition, fit the parameters to those compositions (cheap: no plans run), and again, 4 times."""
    measurements = [m for m in measurements if "auto" not in (m.algorithm, m.codec)]
    if not measurements:
        raise ValueError("no measurements to fit")
    if base is None:
        link = link_named("shm")
        device = replace(device_for(link, workers or _usable_cpus()), cache_bytes=last_level_cache_bytes())
        base = Model(link, device, shm_segment_bytes(2))
    if base.device.memory_Bps is None:
        base = replace(base, device=replace(base.device, memory_Bps=base.device.host_copy_Bps))
    algorithms = sorted({m.algorithm for m in measurements}, key=lambda a: (a != "ring", a))
    params = _params(algorithms, any(m.codec != "none" for m in measurements))
    points = []
    for m in measurements:
        kind, bpe, block = _layout(m.codec)
        seg = shm_segment_bytes(m.world)
        costs = plan_costs("allreduce", m.algorithm, m.world, m.bytes // 4, 4, seg, bpe, block)
        weight = 2.0 if m.bytes >= LARGE_BYTES else 1.0
        points.append((m, kind, costs, weight))

    def model_at(x: np.ndarray) -> Model:
        link, device = base.link, base.device
        for (_, _, put), v in zip(params, np.exp(x)):
            link, device = put(link, device, float(v))
        return replace(base, link=link, device=device, _cache={})

    def timings(model: Model) -> list[Timing]:
        out = []
        for m, kind, costs, _ in points:
            at = replace(
                model, segment_bytes=shm_segment_bytes(m.world), fragment_bytes=shm_fragment_bytes(m.world)
            )
            out.append(at.timing(costs, m.algorithm, m.world, kind, m.bytes))
        return out

    def predicted(model: Model, fixed: Sequence[Timing]) -> np.ndarray:
        """Every point's time at ``model``'s parameters with the compositions ``fixed``."""
        out = np.empty(len(points))
        for k, ((m, kind, _, _), t) in enumerate(zip(points, fixed)):
            path = float(model.weights(m.algorithm, m.world, kind) @ t.path)
            out[k] = max(path, model.host_time(t.host, m.algorithm)) + t.extra
        return out

    measured = np.log([m.time_s for m, *_ in points])
    weights = np.array([w for *_, w in points])

    def loss_with(fixed: Sequence[Timing]) -> Callable[[np.ndarray], float]:
        def loss(x: np.ndarray) -> float:
            return float(weights @ (np.log(predicted(model_at(x), fixed)) - measured) ** 2)

        return loss

    x = np.log([get(base.link, base.device) for _, get, _ in params])
    for _ in range(4):
        fixed = timings(model_at(x))
        x = _nelder_mead(loss_with(fixed), x)
        x = _nelder_mead(loss_with(fixed), x, step=0.1)  # restart: the simplex may have collapsed early
    model = replace(model_at(x), origin="calibrated")
    final = timings(model)
    rows = []
    for (m, *_), t in zip(points, final):
        rows.append({**m.__dict__, "predicted_s": t.time_s, "rel_error": t.time_s / m.time_s - 1})
    errors = np.log([t.time_s for t in final]) - measured
    report = {
        "parameters": {name: float(v) for (name, _, _), v in zip(params, np.exp(x))},
        "cache_bytes": model.device.cache_bytes,
        "points": rows,
        "rms_log_error": math.sqrt(float(weights @ errors**2) / float(weights.sum())),
    }
    return model, report


def _layout(codec: str) -> tuple[str, float | None, int]:
    if codec == "none":
        return "none", None, 1
    from pycoll.compression import get_codec

    c = get_codec(codec)
    assert c is not None
    return c.kind, float(c.bytes_per_element), int(c.block_elems)


# ---------------------------------------------------------------------------------------------------
# Saving and loading.


def model_to_dict(model: Model) -> dict[str, Any]:
    """``model`` as plain JSON-able data (``model_from_dict`` reads it back)."""
    return {
        "link": model.link.to_dict(),
        "device": model.device.to_dict(),
        "segment_bytes": model.segment_bytes,
        "fragment_bytes": model.fragment_bytes,
        "origin": model.origin,
    }


def model_from_dict(data: dict[str, Any]) -> Model:
    fragment = data.get("fragment_bytes")
    return Model(
        LinkProfile.from_dict(data["link"]),
        DeviceProfile.from_dict(data["device"]),
        int(data["segment_bytes"]),
        None if fragment is None else int(fragment),
        origin=str(data.get("origin", "")),
    )


def save_model(model: Model, report: dict[str, Any] | None = None, path: Path | None = None) -> Path:
    """Write ``model``'s link and device to ``path`` (default ``tuning_file()``) for this host."""
    path = path or tuning_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "host": platform.node(),
        "cpus": _usable_cpus(),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "link": model.link.to_dict(),
        "device": model.device.to_dict(),
        "fit": report or {},
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tuning-")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)  # readers never see half a file
    return path


def load_model(
    path: Path | None = None,
    *,
    segment_bytes: int | None = None,
    fragment_bytes: int | None = None,
    workers: int | None = None,
) -> Model | None:
    """The calibrated shared-memory model saved on this host, or None (no file, another host's file, or
    an unreadable one)."""
    if path is None and os.environ.get("PYCOLL_TUNING_FILE", "").strip().lower() == "none":
        return None
    path = path or tuning_file()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("host") != platform.node():
            return None
        link = LinkProfile.from_dict(data["link"])
        device = DeviceProfile.from_dict(data["device"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if workers is not None:
        device = replace(device, workers=workers)
    return Model(link, device, segment_bytes or 512 * 1024, fragment_bytes, origin=str(path))


# ---------------------------------------------------------------------------------------------------
# Measuring: one job per world size, every (algorithm, codec) interleaved size by size.


def _worker(args: argparse.Namespace) -> int:
    import pycoll
    from pycoll import benchmark

    comm = pycoll.init()
    try:
        labels: list[tuple[str, str]] = []
        variants = []
        for algorithm in args.algorithms.split(","):
            for codec in args.codecs.split(","):
                if codec == "auto" and algorithm != "auto":
                    continue  # compression="auto" picks its algorithm too

                def run(x: np.ndarray, a: str = algorithm, c: str = codec) -> None:
                    if c == "auto":
                        pycoll.allreduce(x, compression="auto", error_budget=args.error_budget)
                    else:
                        pycoll.allreduce(x, algorithm=a, compression=None if c == "none" else c)

                labels.append((algorithm, codec))
                variants.append(benchmark.Variant(f"{algorithm}/{codec}", run))

        def reduce_max(a: np.ndarray) -> np.ndarray:
            pycoll.allreduce(a, op="max")
            return a

        results = benchmark.run_interleaved_sweep(
            variants,
            pycoll.barrier,
            reduce_max,
            comm.rank,
            comm.world_size,
            min_bytes=args.minbytes,
            max_bytes=args.maxbytes,
            factor=args.factor,
            check=False,
        )
        if comm.rank == 0:
            with open(args.out, "w", encoding="utf-8") as f:
                for i, result in enumerate(results):
                    algorithm, codec = labels[i % len(labels)]
                    point = Measurement(
                        comm.world_size, algorithm, codec, result.bytes, result.time_us * 1e-6
                    )
                    f.write(json.dumps(point.__dict__) + "\n")
    finally:
        pycoll.finalize(comm)
    return 0


def measure(
    worlds: Sequence[int] = DEFAULT_WORLDS,
    *,
    min_bytes: int = 4096,
    max_bytes: int = 64 << 20,
    factor: int = 4,
    algorithms: Sequence[str] = ALGORITHMS,
    codecs: Sequence[str] = DEFAULT_CODECS,
    rounds: int = 3,
    error_budget: float = 1e-2,
    env: dict[str, str] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[Measurement]:
    """Time every (algorithm, codec) at every size on each of ``worlds`` local ranks: one job per world
    size and round, rounds interleaved (w2 w3 w4, w2 w3 w4, ...: DESIGN.md, "Measuring"), and the
    median over rounds of each point. ``algorithms`` may include "auto" and ``codecs`` "auto"
    (``compression="auto"`` with ``error_budget``); ``env`` is added to the ranks' environment (e.g. a
    ``PYCOLL_TUNING_FILE`` for auto to choose by)."""
    from pycoll.cli.run import launch

    samples: dict[tuple[int, str, str, int], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="pycoll-calibrate-") as tmp:
        for round_ in range(rounds):
            for world in worlds:
                path = os.path.join(tmp, f"world{world}-{round_}.jsonl")
                cmd = [sys.executable, "-m", "pycoll.tuning.calibrate", "--worker", "--out", path,
                       "-b", str(min_bytes), "-e", str(max_bytes), "-f", str(factor),
                       "--algorithms", ",".join(algorithms), "--codecs", ",".join(codecs),
                       "--error-budget", repr(error_budget)]  # fmt: skip
                if log:
                    log(f"round {round_ + 1}/{rounds}: {world} ranks, {', '.join(algorithms)} x "
                        f"{', '.join(codecs)}, {min_bytes}..{max_bytes} bytes")  # fmt: skip
                code = launch(world, cmd, env=None if env is None else {**os.environ, **env})
                if code != 0:
                    raise RuntimeError(f"the calibration job on {world} ranks failed (exit code {code})")
                with open(path, encoding="utf-8") as f:
                    for line in f:
                        if line.strip():
                            m = Measurement(**json.loads(line))
                            samples.setdefault((m.world, m.algorithm, m.codec, m.bytes), []).append(m.time_s)
    return [Measurement(w, a, c, b, float(np.median(t))) for (w, a, c, b), t in samples.items()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pycoll.tuning.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("-b", "--minbytes", type=parse_size, default=4096)
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    parser.add_argument("-f", "--factor", type=int, default=4)
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--codecs", default=",".join(DEFAULT_CODECS))
    parser.add_argument("--worlds", default=",".join(map(str, DEFAULT_WORLDS)))
    parser.add_argument("--error-budget", type=float, default=1e-2, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is fitted (3)")
    parser.add_argument("--measurements", metavar="FILE", help="also write the measured points (JSON lines)")
    parser.add_argument("--from-measurements", metavar="FILE", help="fit these points instead of measuring")
    parser.add_argument("--no-save", action="store_true", help="fit and report, but do not save")
    args = parser.parse_args(argv)
    if args.worker:
        return _worker(args)
    return run_calibration(args)


def run_calibration(args: argparse.Namespace) -> int:
    """Measure (or read ``--from-measurements``), fit, print the fit, save unless ``--no-save``."""
    if args.from_measurements:
        with open(args.from_measurements, encoding="utf-8") as f:
            points = [Measurement(**json.loads(line)) for line in f if line.strip()]
    else:
        worlds = [int(w) for w in str(args.worlds).split(",") if w]
        points = measure(
            worlds,
            min_bytes=args.minbytes,
            max_bytes=args.maxbytes,
            factor=args.factor,
            algorithms=args.algorithms.split(","),
            codecs=args.codecs.split(","),
            rounds=args.rounds,
            log=lambda line: print(line, file=sys.stderr, flush=True),
        )
        if args.measurements:
            with open(args.measurements, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(p.__dict__) + "\n" for p in points)
    model, report = fit(points)
    print(format_fit(report))
    if not args.no_save:
        print(f"saved to {save_model(model, report)}")
    return 0


def format_fit(report: dict[str, Any]) -> str:
    """The fitted parameters and, per point, measured vs predicted time."""
    lines = ["fitted parameters:"]
    for name, value in report["parameters"].items():
        if name.endswith("Bps"):
            lines.append(f"  {name:<22} {value / 1e9:10.2f} GB/s")
        elif name == "alpha_s":
            lines.append(f"  {name:<22} {value * 1e6:10.2f} us")
        else:
            lines.append(f"  {name:<22} {value:10.3f}")
    lines.append(f"  rms log error          {report['rms_log_error']:10.3f}")
    lines.append(
        f"{'world':>5} {'algorithm':>9} {'codec':>14} {'bytes':>10} {'measured us':>12} "
        f"{'predicted us':>12} {'error':>7}"
    )
    for p in report["points"]:
        lines.append(
            f"{p['world']:>5} {p['algorithm']:>9} {p['codec']:>14} {p['bytes']:>10} "
            f"{p['time_s'] * 1e6:>12.1f} {p['predicted_s'] * 1e6:>12.1f} {p['rel_error']:>+7.0%}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
