"""Calibration: fit the cost model's parameters to all-reduces measured on this machine.

``pycoll bench --calibrate`` (whose ``measure`` runs one ``pycoll.bench.jobs.Job`` per world size and
round) times pycoll's all-reduce over shared memory for every algorithm (and the codecs), on several
world sizes, sizes 4 KiB..64 MiB, with the timing loop of ``pycoll bench`` (pycoll/bench/timing.py:
slowest rank, median over iterations, variants interleaved size by size; rounds interleaved, median per
point). It then fits the shared-memory link and CPU parameters of ``pycoll.tuning.links`` (``fit``:
latency, copy and memory bandwidth, cache size, per-algorithm efficiencies, a factor on the codecs'
rates) by robust least squares on log(time) (scipy; sizes of 1 MiB and up weighted double).
``pycoll.tuning.persist`` saves the fit as JSON (``save_model``, to ``tuning_file()``:
``$PYCOLL_TUNING_FILE``, default ``~/.cache/pycoll/tuning.json``) and reads it back (``load_model``)
for ``algorithm="auto"`` / ``compression="auto"``; a file written on another host is ignored. This
module sits on top of the core (it imports the benchmark package and the launcher); the core never
imports it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pycoll.env import usable_cpus
from pycoll.tuning.links import device_for, link_named
from pycoll.tuning.model import (
    C_ALPHA,
    C_DECODED,
    C_ENCODED,
    C_MESSAGE,
    C_TRAFFIC,
    Model,
    codec_layout,
    correction_key,
    plan_costs,
)
from pycoll.tuning.persist import shm_fragment_bytes, shm_segment_bytes

__all__ = [
    "Measurement",
    "fit",
    "format_fit",
    "measure",
    "last_level_cache_bytes",
    "starting_model",
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


# ---------------------------------------------------------------------------------------------------
# Fitting.


def starting_model(workers: int | None = None, cache_bytes: int | None = None) -> Model:
    """Where ``fit`` starts by default: the built-in shared-memory profile with ``workers`` cores and a
    last-level cache of ``cache_bytes``, by default this machine's (usable CPUs; the cache from sysfs)."""
    link = link_named("shm")
    device = device_for(link, workers or usable_cpus())
    cache = cache_bytes or last_level_cache_bytes() or device.cache_bytes
    return Model(link, replace(device, cache_bytes=cache), shm_segment_bytes(2))


def fit(
    measurements: Sequence[Measurement], base: Model | None = None, *, workers: int | None = None
) -> tuple[Model, dict[str, Any]]:
    """The shared-memory model whose predictions best match ``measurements`` (see the module docstring),
    and a report: fitted values, and the relative error of every point. The fit starts from ``base``,
    by default ``starting_model(workers)``.

    A prediction is ``Model.weights . composition`` of the plans' critical path (``Model.timing``), and
    which ops form that path depends on the parameters only a little. So the fit alternates: run the
    plans at the current parameters to get every point's composition, fit the parameters to those
    compositions (cheap: no plans run), and again, 4 times.

    Fitted: the last-level cache size, alpha and the extra cost of a hop when ranks outnumber cores,
    the per-rank copy bandwidth, the memory bandwidth, one factor on the codec rates, and for every
    algorithm and measured world size but the reference (the ring on the fewest ranks) an efficiency
    in cache, one beyond it and one for hops and messages ("tree@2"); an algorithm's factors at the
    largest measured world also stand for larger worlds. Last, the residual of every measured point
    (measured / fitted time, clamped to 1/5..5) is kept as a correction (``LinkProfile.corrections``),
    interpolated in log(size) by the model's predictions."""
    measurements = [m for m in measurements if "auto" not in (m.algorithm, m.codec)]
    if not measurements:
        raise ValueError("no measurements to fit")
    if base is None:
        base = starting_model(workers)
    device = base.device
    workers_n = device.workers or 1
    kinds = sorted({codec_layout(m.codec)[0] for m in measurements} - {"none"})
    # Every (algorithm, world) but the reference, the ring on the fewest ranks, gets its own efficiencies.
    reference = ("ring", min(m.world for m in measurements))
    others = sorted({(m.algorithm, m.world) for m in measurements} - {reference})
    names = ["cache_bytes", "alpha_s", "copy_Bps", "memory_Bps", "codec_scale", "switch_s", "message_s"]
    names += [
        f"{kind}[{a}@{w}]"
        for kind in ("efficiency", "memory_efficiency", "latency_efficiency")
        for a, w in others
    ]
    # The cache starts where the measurements can see it: below the largest working set (the ranks'
    # buffers together). From above every working set (a 300 MiB last-level cache read from sysfs, say,
    # against 4 x 64 MiB) no point misses it, nothing moves the fit and memory_Bps stays unfitted.
    largest = max(m.world * m.bytes for m in measurements)
    cache_start = min(float(device.cache_bytes or 32 << 20), largest / 2)
    start = [cache_start, base.link.alpha_s, device.copy_Bps]
    start += [device.memory_Bps or device.copy_Bps, 1.0, device.switch_s or 5e-6, device.message_s or 1e-6]
    x = np.log(start + [1.0] * (3 * len(others)))

    points = []
    for m in measurements:
        kind, bpe, block = codec_layout(m.codec)
        costs = plan_costs(
            "allreduce", m.algorithm, m.world, m.bytes // 4, 4, shm_segment_bytes(m.world), bpe, block
        )
        points.append((m, kind, costs))
    world = np.array([m.world for m, *_ in points], dtype=float)
    nbytes = np.array([m.bytes for m, *_ in points], dtype=float)
    share = np.maximum(1.0, world / workers_n)
    active = np.minimum(world, workers_n)
    pairs = [(m.algorithm, m.world) for m, *_ in points]
    slot = np.array([0 if pair == reference else 1 + others.index(pair) for pair in pairs])
    encode = np.array([device.codec_rates(k)[0] if k != "none" else np.inf for _, k, _ in points])
    decode = np.array([device.codec_rates(k)[1] if k != "none" else np.inf for _, k, _ in points])
    measured = np.log([m.time_s for m, *_ in points])
    weight = np.array([2.0 if m.bytes >= LARGE_BYTES else 1.0 for m, *_ in points])
    n_other = len(others)

    def model_at(v: np.ndarray) -> Model:
        e = np.exp(v)
        tables = []
        for t in range(3):
            table = {f"{a}@{w}": float(e[7 + t * n_other + k]) for k, (a, w) in enumerate(others)}
            table[f"{reference[0]}@{reference[1]}"] = 1.0
            for a in {a for a, _ in others}:  # the largest measured world stands for larger ones
                table[a] = table[f"{a}@{max(w for b, w in [*others, reference] if b == a)}"]
            tables.append(table)
        link = replace(
            base.link,
            alpha_s=float(e[1]),
            efficiency=tables[0],
            memory_efficiency=tables[1],
            latency_efficiency=tables[2],
        )
        rates = {k: (r[0] * float(e[4]), r[1] * float(e[4])) for k, r in device.codec_Bps.items()}
        dev = replace(
            device,
            cache_bytes=int(e[0]),
            copy_Bps=float(e[2]),
            memory_Bps=float(e[3]),
            codec_Bps=rates,
            switch_s=float(e[5]),
            message_s=float(e[6]),
        )
        return replace(base, link=link, device=dev, _cache={})

    def timings(model: Model) -> np.ndarray:
        rows = []
        for m, kind, costs in points:
            at = replace(
                model, segment_bytes=shm_segment_bytes(m.world), fragment_bytes=shm_fragment_bytes(m.world)
            )
            t = at.timing(costs, m.algorithm, m.world, kind, m.bytes)
            assert t.path is not None  # asked for: timing's composition is on by default
            rows.append([*t.path, t.extra])
        return np.array(rows)

    def predicted(v: np.ndarray, comp: np.ndarray) -> np.ndarray:
        """Every point's time at parameters ``v`` with the compositions ``comp`` (Model.weights, in
        numpy over all points at once)."""
        e = np.exp(v)
        eff = np.concatenate([[1.0], e[7 : 7 + n_other]])[slot]
        meff = np.concatenate([[1.0], e[7 + n_other : 7 + 2 * n_other]])[slot]
        lat = np.concatenate([[1.0], e[7 + 2 * n_other :]])[slot]
        miss = np.maximum(0.0, 1.0 - e[0] / np.maximum(world * nbytes, 1.0))
        traffic_s = (1 - miss) / (e[2] * eff) + miss * active / (e[3] * meff)
        message = share * (e[6] + e[5] * (1.0 - 1.0 / share))
        return (
            e[1] / lat * comp[:, C_ALPHA]
            + message / lat * comp[:, C_MESSAGE]
            + share * traffic_s * comp[:, C_TRAFFIC]
            + share * comp[:, C_ENCODED] / (encode * e[4] * eff)
            + share * comp[:, C_DECODED] / (decode * e[4] * eff)
            + comp[:, -1]
        )

    try:
        from scipy.optimize import least_squares
    except ImportError as exc:
        raise ImportError("calibration fits with scipy: pip install scipy") from exc
    root_weight = np.sqrt(weight)
    # Physical ranges (log space), so that parameters that trade off against each other (a huge switch
    # cost against a huge latency efficiency) cannot run away together.
    # cache_bytes, alpha_s, copy_Bps, memory_Bps, codec_scale, switch_s, message_s, then the efficiencies
    ranges = [(1 << 20, 1 << 30), (1e-8, 1e-4), (1e9, 1e12), (1e9, 1e12), (0.1, 10.0), (1e-8, 1e-3)]
    ranges += [(1e-8, 1e-4)]
    ranges += [(0.1, 10.0)] * (2 * n_other) + [(0.25, 4.0)] * n_other
    lower, upper = np.log([r[0] for r in ranges]), np.log([r[1] for r in ranges])
    x = np.clip(x, lower + 1e-9, upper - 1e-9)

    def refine(v: np.ndarray) -> tuple[np.ndarray, float]:
        for _ in range(4):
            comp = timings(model_at(v))
            # Robust (soft L1) least squares on log time: a point the machine disturbed does not drag
            # the fit far.
            result = least_squares(
                lambda u, comp=comp: root_weight * (np.log(predicted(u, comp)) - measured),
                v,
                loss="soft_l1",
                f_scale=0.3,
                bounds=(lower, upper),
            )
            v = result.x
        return v, float(result.cost)

    # A few starts for the latency terms (alpha, switch, message), which trade off against each other.
    starts = []
    for alpha, switch, message in ((2e-6, 5e-6, 1e-6), (5e-6, 1e-7, 1e-7), (1e-7, 2e-5, 3e-6)):
        guess = x.copy()
        guess[[1, 5, 6]] = np.log([alpha, switch, message])
        starts.append(refine(np.clip(guess, lower + 1e-9, upper - 1e-9)))
    x = min(starts, key=lambda pair: pair[1])[0]
    model = replace(model_at(x), origin="calibrated")
    # What the fitted structure still misses, point by point: the residual factors (clamped to 5x
    # either way, so one disturbed point cannot make an algorithm look absurd).
    final = timings(model)
    raw = np.array(
        [
            model.weights(m.algorithm, m.world, k, m.bytes) @ row[:-1] + row[-1]
            for (m, k, _), row in zip(points, final)
        ]
    )
    corrections: dict[str, list[tuple[float, float]]] = {}
    for (m, kind, _), t in sorted(zip(points, raw), key=lambda pair: pair[0][0].bytes):
        key = correction_key("allreduce", m.algorithm, m.world, kind)
        factor = float(np.clip(m.time_s / t, 0.2, 5.0))
        corrections.setdefault(key, []).append((math.log2(m.bytes), factor))
    model = replace(model, link=replace(model.link, corrections=corrections), _cache={})
    times = raw  # the report shows how well the structure fits, before the residual corrections
    rows = [
        {**m.__dict__, "predicted_s": float(t), "rel_error": float(t / m.time_s - 1)}
        for (m, *_), t in zip(points, times)
    ]
    errors = np.log(times) - measured
    report = {
        "parameters": dict(zip(names, map(float, np.exp(x)))),
        "codecs": kinds,
        "points": rows,
        "rms_log_error": math.sqrt(float(weight @ errors**2) / float(weight.sum())),
        "note": "predicted_s and rms_log_error are the fitted structure's, before the residual corrections",
    }
    return model, report


# ---------------------------------------------------------------------------------------------------
# Saving and loading.


# ---------------------------------------------------------------------------------------------------
# Measuring: one job per world size, every (algorithm, codec) interleaved size by size.


def measure(worlds: Sequence[int] = DEFAULT_WORLDS, **options: Any) -> list[Measurement]:
    """``measure_rounds(worlds, **options)``, and the median over the rounds of each point."""
    return median_of(measure_rounds(worlds, **options))


def median_of(rounds: Sequence[Sequence[Measurement]]) -> list[Measurement]:
    """Each point's median time over ``rounds``."""
    samples: dict[tuple[int, str, str, int], list[float]] = {}
    for points in rounds:
        for m in points:
            samples.setdefault((m.world, m.algorithm, m.codec, m.bytes), []).append(m.time_s)
    return [Measurement(w, a, c, b, float(np.median(t))) for (w, a, c, b), t in samples.items()]


def measure_rounds(
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
) -> list[list[Measurement]]:
    """Time every (algorithm, codec) at every size on each of ``worlds`` local ranks: one job per world
    size and round, rounds interleaved (w2 w3 w4, w2 w3 w4, ...: docs/benchmarking.md#measuring); the points
    of each round. ``algorithms`` may include "auto" and ``codecs`` "auto" (``compression="auto"``
    with ``error_budget``); ``env`` is added to the ranks' environment (e.g. a ``PYCOLL_TUNING_FILE``
    for auto to choose by)."""
    from pycoll.bench.jobs import Job, run_job

    out: list[list[Measurement]] = []
    for round_ in range(rounds):
        points: list[Measurement] = []
        for world in worlds:
            job = Job(
                ranks=world,
                minbytes=min_bytes,
                maxbytes=max_bytes,
                stepfactor=factor,
                check=0,
                algorithm=tuple(algorithms),
                compression=tuple(codecs),
                error_budget=error_budget,
                table=False,
                progress="off",
                env=env,
            )
            if log:
                log(
                    f"round {round_ + 1}/{rounds}: {world} ranks, {', '.join(algorithms)} x "
                    f"{', '.join(codecs)}, {min_bytes}..{max_bytes} bytes"
                )
            done = run_job(job)
            if not done.ok:
                raise RuntimeError(
                    f"the calibration job on {world} ranks failed (exit code {done.returncode})"
                )
            points.extend(
                Measurement(world, r.algorithm, r.codec, r.bytes, r.time_us * 1e-6) for r in done.results
            )
        out.append(points)
    return out


def read_measurements(path: str) -> list[Measurement]:
    """Measured points from a JSON-lines file (``write_measurements``)."""
    with open(path, encoding="utf-8") as f:
        return [Measurement(**json.loads(line)) for line in f if line.strip()]


def write_measurements(path: str, points: Sequence[Measurement]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(p.__dict__) + "\n" for p in points)


def format_fit(report: dict[str, Any]) -> str:
    """The fitted parameters and, per point, measured vs predicted time."""
    lines = ["fitted parameters:"]
    for name, value in report["parameters"].items():
        if name.endswith("Bps"):
            lines.append(f"  {name:<22} {value / 1e9:10.2f} GB/s")
        elif name.endswith("_s"):
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
