"""What a benchmark prints and writes: the nccl-tests-style table (header, rows, footer), JSON lines,
the progress line on a terminal, and ``run_and_report``, one call for a benchmark program's rank (run
the sweeps, print the table on rank 0 row by row, write the JSON records)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, fields
from typing import IO, TYPE_CHECKING, Any

from pycoll.bench.inputs import resolve_dtype
from pycoll.bench.options import sweep_kwargs
from pycoll.bench.timing import (
    AllReduceFn,
    BarrierFn,
    ReduceMaxFn,
    Result,
    Variant,
    run_interleaved_sweep,
    sweep_sizes,
    variant_label,
)

if TYPE_CHECKING:
    from numpy.typing import DTypeLike

    from pycoll.bench.link import LinkCounter
else:
    DTypeLike = Any

__all__ = [
    "ProgressLine",
    "format_footer",
    "format_header",
    "format_json_lines",
    "format_row",
    "format_size",
    "format_table",
    "read_json_lines",
    "result_from_dict",
    "result_to_dict",
    "run_and_report",
]

# ---------------------------------------------------------------------------------------------------
# Output: an nccl-tests-style table and JSON lines.

_COLUMNS = (
    # (header, unit, width)
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 8),
    ("redop", "", 6),
    ("time", "(us)", 10),
    ("algbw", "(GB/s)", 7),
    ("busbw", "(GB/s)", 7),
    ("#wrong", "", 6),
)
#: With several libraries or algorithms: the series without its codec (``pycoll/ring``, ``gloo``),
#: after redop.
_VARIANT_COLUMN = ("variant", "", 19)  # fits "pycoll/hierarchical"
#: With a codec: which one (after redop and variant) and the relative error (before #wrong, which
#: stays last).
_CODEC_COLUMN = ("codec", "", 6)
_ERROR_COLUMN = ("error", "(rel)", 8)
_COLUMN_SEP = "  "


def _columns(codec_columns: bool, variant_column: bool = False) -> tuple[tuple[str, str, int], ...]:
    head: list[tuple[str, str, int]] = list(_COLUMNS[:4])
    if variant_column:
        head.append(_VARIANT_COLUMN)
    if codec_columns:
        head.append(_CODEC_COLUMN)
    head += _COLUMNS[4:7]
    if codec_columns:
        head.append(_ERROR_COLUMN)
    return (*head, *_COLUMNS[7:])


def _has_codec(results: Sequence[Result] | Sequence[Variant]) -> bool:
    return any(r.codec != "none" for r in results)


def _several_variants(results: Sequence[Result] | Sequence[Variant]) -> bool:
    """True when the results come from more than one (library, algorithm): the variant column."""
    return len({(r.library, r.algorithm) for r in results}) > 1


def _series_name(result: Result, full: bool) -> str:
    """How the footer names a result's series: the codec alone when only codecs differ."""
    return result.label if full else result.codec


def format_header(
    title: str | None = None, *, codec_columns: bool = False, variant_column: bool = False
) -> str:
    """The table's title (if any) and two header lines, each starting with '#' as in nccl-tests.
    ``codec_columns`` adds the codec and its relative error (compressed runs); ``variant_column`` the
    library/algorithm of each row (several variants)."""
    columns = _columns(codec_columns, variant_column)
    names = _COLUMN_SEP.join(f"{name:>{width}}" for name, _, width in columns)
    units = _COLUMN_SEP.join(f"{unit:>{width}}" for _, unit, width in columns)
    lines = [f"# {title}"] if title else []
    lines += ["#" + names[1:], "#" + units[1:]]
    return "\n".join(lines)


def _format_error(error: float | None) -> str:
    return "N/A" if error is None else f"{error:.2e}"


def format_row(result: Result, *, codec_columns: bool | None = None, variant_column: bool = False) -> str:
    """One table line for ``result`` (with codec columns when ``codec_columns``; by default when
    ``result`` was compressed; with its library/algorithm when ``variant_column``)."""
    if codec_columns is None:
        codec_columns = result.codec != "none"
    wrong = "N/A" if result.wrong is None else str(result.wrong)
    time_us = f"{result.time_us:.2f}" if result.time_us < 1e6 else f"{result.time_us:.4g}"
    values: tuple[str, ...] = (str(result.bytes), str(result.count), result.dtype, result.redop)
    if variant_column:
        values += (variant_label(result.library, result.algorithm),)
    if codec_columns:
        values += (result.codec,)
    values += (time_us, f"{result.algbw_GBps:.2f}", f"{result.busbw_GBps:.2f}")
    if codec_columns:
        values += (_format_error(result.rel_error),)
    values += (wrong,)
    columns = _columns(codec_columns, variant_column)
    cells = (f"{value:>{width}}" for value, (_, _, width) in zip(values, columns))
    return _COLUMN_SEP.join(cells)


def format_footer(results: Sequence[Result]) -> str:
    """Summary lines: wrong-result count and average bus bandwidth, as nccl-tests ends its output.

    With several series (codecs, libraries, algorithms) the average bus bandwidth is given per series
    (named by the codec alone when only codecs differ), and with compressed results the largest
    relative error too; "out of bounds" then also counts elements outside a codec's error bound."""
    known = [r.wrong for r in results if r.wrong is not None]
    wrong = str(sum(known)) if known else "N/A"
    full = _several_variants(results)
    names = list(dict.fromkeys(_series_name(r, full) for r in results))
    if len(names) <= 1 and not _has_codec(results):
        avg = statistics.fmean(r.busbw_GBps for r in results) if results else 0.0
        return f"# Out of bounds values : {wrong}\n# Avg bus bandwidth    : {avg:.3f}"
    avgs, errors = [], []
    for name in names:
        rows = [r for r in results if _series_name(r, full) == name]
        avgs.append(f"{name} {statistics.fmean(r.busbw_GBps for r in rows):.3f}")
        errs = [r.rel_error for r in rows]
        worst = None if any(e is None for e in errs) else max(e for e in errs if e is not None)
        errors.append(f"{name} {_format_error(worst)}")
    lines = [f"# Out of bounds values : {wrong}", f"# Avg bus bandwidth    : {', '.join(avgs)}"]
    if _has_codec(results):
        lines.append(f"# Max rel. error       : {', '.join(errors)}")
    return "\n".join(lines)


def format_table(results: Sequence[Result], title: str | None = None) -> str:
    """The whole table: header, one row per result, footer (codec columns if any result has a codec,
    the variant column if the results come from several libraries or algorithms)."""
    codec_columns = _has_codec(results)
    variant_column = _several_variants(results)
    parts = [format_header(title, codec_columns=codec_columns, variant_column=variant_column)]
    parts += [format_row(r, codec_columns=codec_columns, variant_column=variant_column) for r in results]
    parts.append(format_footer(results))
    return "\n".join(parts)


def result_to_dict(result: Result, **extra: Any) -> dict[str, Any]:
    """``result`` as a JSON-ready dict, with ``extra`` keys (host, library_version...) merged in.

    The ``Result`` fields win over ``extra``, except an empty ``library`` / ``algorithm`` (a caller
    that did not name them in its variants), which ``extra`` may then give. ``label`` (the series'
    name, ``variant_label``) is added; ``times_us`` and the ``link_tx_*`` fields are lists."""
    record = dict(extra)
    for key, value in asdict(result).items():
        if key in ("library", "algorithm") and not value and key in extra:
            continue
        record[key] = list(value) if key in _TUPLE_FIELDS else value
    record["label"] = variant_label(record.get("library", ""), record.get("algorithm", ""), result.codec)
    return record


_RESULT_FIELDS = tuple(f.name for f in fields(Result))
#: ``Result`` fields that are tuples (lists in JSON).
_TUPLE_FIELDS = ("times_us", "link_tx_bytes", "link_tx_packets", "link_tx_retrans")


def result_from_dict(record: Mapping[str, Any]) -> Result:
    """The ``Result`` a JSON record (``result_to_dict``) was made from; other keys are ignored."""
    values = {key: record[key] for key in _RESULT_FIELDS if key in record}
    for key in _TUPLE_FIELDS:
        if key in values:
            values[key] = tuple(float(t) for t in values[key])
    return Result(**values)


def format_json_lines(results: Iterable[Result], **extra: Any) -> str:
    """One JSON object per line per result, each carrying ``extra`` (e.g. host=...)."""
    return "".join(json.dumps(result_to_dict(r, **extra), sort_keys=True) + "\n" for r in results)


def read_json_lines(text: str) -> list[dict[str, Any]]:
    """Parse what ``format_json_lines`` wrote (blank lines ignored)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------------
# Progress on a terminal


class ProgressLine:
    """A one-line progress display for long sweeps, redrawn in place with a carriage return:

        [ 37%]  size 5/15 (64 KiB)  pycoll/ring  float32 sum  12.3 s

    Drawn only when ``enabled`` (default: when ``stream``, default stderr, is a terminal), so logs and
    pipes get nothing. Call it as ``run_interleaved_sweep``'s ``progress``; ``context`` (e.g. the type
    and op of the current sweep) is shown after the variant; ``total_steps`` (every (size, variant) of
    every sweep) gives the percentage. ``clear()`` wipes the line (before printing a row) and
    ``close()`` ends it."""

    def __init__(
        self,
        total_steps: int = 0,
        stream: IO[str] | None = None,
        *,
        enabled: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            try:
                enabled = bool(isatty()) if isatty is not None else False
            except (OSError, ValueError):
                enabled = False
        self.enabled = enabled
        self.total_steps = total_steps
        self.context = ""
        self.steps = 0
        self._clock = clock
        self._start = clock()
        self._width = 0

    def __call__(self, index: int, n_sizes: int, nbytes: int, variant: Variant) -> None:
        self.steps += 1
        if not self.enabled:
            return
        parts = []
        if self.total_steps > 0:
            parts.append(f"[{min(100, 100 * (self.steps - 1) // self.total_steps):3d}%]")
        parts.append(f"size {index + 1}/{n_sizes} ({format_size(nbytes)})")
        parts.append(variant.label)
        if self.context:
            parts.append(self.context)
        parts.append(f"{self._clock() - self._start:.1f} s")
        self._draw("  ".join(parts))

    def _draw(self, text: str) -> None:
        pad = max(0, self._width - len(text))
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()
        self._width = len(text)

    def clear(self) -> None:
        """Wipe the line (the cursor goes back to its start)."""
        if self.enabled and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0

    def close(self) -> None:
        self.clear()


def format_size(nbytes: int) -> str:
    """4096 -> '4 KiB', 67108864 -> '64 MiB' (exact binary multiples only, else bytes)."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


# ---------------------------------------------------------------------------------------------------
# One call for a benchmark program's rank: run the sweep, print the table on rank 0, write JSON lines.


def _print_flush(line: str) -> None:
    print(line, flush=True)


def run_and_report(
    allreduce: AllReduceFn | None,
    barrier: BarrierFn,
    reduce_max: ReduceMaxFn,
    rank: int,
    world: int,
    args: Any,
    *,
    title: str,
    meta: Mapping[str, Any] | None = None,
    print_fn: Callable[[str], None] | None = None,
    variants: Sequence[Variant] | None = None,
    sweeps: Sequence[tuple[DTypeLike, Sequence[Variant]]] | None = None,
    record_meta: Callable[[Result], Mapping[str, Any]] | None = None,
    progress: ProgressLine | None = None,
    link: LinkCounter | None = None,
) -> list[Result]:
    """Run ``run_allreduce_sweep`` with the flags of ``add_sweep_arguments`` (``args``: their parsed
    namespace, or a ``pycoll.bench.jobs.Job``, which has the same attributes); rank 0 prints the table
    row by row as sizes finish and, with ``--json FILE``, writes one JSON line per size carrying
    ``meta`` (host, versions...) and ``record_meta(result)`` besides the ``Result`` fields.

    With ``variants`` (then ``allreduce`` is ignored and may be None) they are timed interleaved
    (``run_interleaved_sweep``), one row per size and variant, with codec columns if any variant has a
    codec and the variant column if they come from several libraries or algorithms. ``sweeps``, a list
    of (dtype, variants), runs one interleaved sweep after the other (e.g. one per type and op) into one
    table. ``progress`` (used on rank 0 only) is drawn while the sweeps run and wiped before each row.
    ``link``: count each rank's network traffic per call (``run_interleaved_sweep``)."""
    lead = rank == 0
    if print_fn is None:
        print_fn = _print_flush
    if sweeps is None:
        if variants is None:
            if allreduce is None:
                raise ValueError("run_and_report needs allreduce, variants or sweeps")
            variants = [Variant("none", allreduce)]
        sweeps = [(getattr(args, "dtype", None) or "float32", variants)]
    sweeps = [(dtype, list(group)) for dtype, group in sweeps if group]
    if not sweeps:
        raise ValueError("no variants to time")
    every = [v for _, group in sweeps for v in group]
    codec_columns = _has_codec(every)
    variant_column = _several_variants(every)
    kwargs = sweep_kwargs(args)
    if not lead:
        progress = None
    if progress is not None:
        n_sizes = len(sweep_sizes(kwargs["min_bytes"], kwargs["max_bytes"], kwargs["factor"]))
        progress.total_steps = n_sizes * len(every)

    def show(result: Result) -> None:
        if lead:
            if progress is not None:
                progress.clear()
            print_fn(format_row(result, codec_columns=codec_columns, variant_column=variant_column))

    if lead:
        print_fn(format_header(title, codec_columns=codec_columns, variant_column=variant_column))
    results: list[Result] = []
    try:
        for dtype, group in sweeps:
            if progress is not None:
                ops = "/".join(dict.fromkeys(v.op for v in group))
                progress.context = f"{resolve_dtype(dtype).name} {ops}"
            results += run_interleaved_sweep(
                group,
                barrier,
                reduce_max,
                rank,
                world,
                dtype=dtype,
                on_result=show,
                progress=progress,
                link=link,
                **kwargs,
            )
    finally:
        if progress is not None:
            progress.close()
    if lead:
        print_fn(format_footer(results))
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                for result in results:
                    extra = dict(meta or {})
                    if record_meta is not None:
                        extra.update(record_meta(result))
                    f.write(format_json_lines([result], **extra))
    return results
