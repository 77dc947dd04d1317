"""Plots of bandwidth against message size: ``pycoll bench --plot`` (measured busbw), reusable for
predicted curves (a dashed line per predicted series).

    from pycoll.bench import plots
    plots.plot_busbw(
        {"pycoll/ring": [(4096, 1.2), (1 << 20, 20.5)], "model": [(4096, 1.5), (1 << 20, 22.0)]},
        "busbw.png",
        "all-reduce busbw: 4 ranks on host",
        styles={"model": "--"},
    )

matplotlib is imported only when a plot is drawn, with the Agg backend (no display needed); without it
``plot_busbw`` raises ``ImportError`` whose message is ``MISSING`` (one line: ``pip install
matplotlib``), and ``available()`` says so beforehand without importing it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pycoll.bench.timing import Result

__all__ = ["MISSING", "available", "plot_busbw", "plot_results", "results_series"]

#: The one-line error when matplotlib is missing.
MISSING = "plotting needs matplotlib: pip install matplotlib"


def available() -> bool:
    """Whether matplotlib can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def _size_label(nbytes: float) -> str:
    """4096 -> '4K', 1048576 -> '1M' (binary multiples, as -b/-e take them); others in bytes."""
    n = int(round(nbytes))
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def plot_busbw(
    series: Mapping[str, Sequence[tuple[int, float]]],
    path: str,
    title: str,
    *,
    ylabel: str = "busbw (GB/s)",
    xlabel: str = "message size (bytes)",
    yscale: str = "linear",
    styles: Mapping[str, str] | None = None,
) -> None:
    """Draw one line per series (label -> (bytes, GB/s) points, in any order) against message size on
    a log2 x axis, into the image file ``path`` (format from its extension, e.g. .png, .svg).

    ``yscale``: "linear" or "log". ``styles``: a matplotlib line style per label ("--" dashed for
    predictions, ":" dotted...; default solid). Raises ImportError(``MISSING``) without matplotlib."""
    if yscale not in ("linear", "log"):
        raise ValueError(f"yscale must be 'linear' or 'log', got {yscale!r}")
    try:
        import matplotlib
    except ImportError:
        raise ImportError(MISSING) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    styles = dict(styles or {})
    fig, ax = plt.subplots(figsize=(9, 5.5))
    try:
        sizes: set[int] = set()
        for label, points in series.items():
            ordered = sorted((int(b), float(v)) for b, v in points)
            if not ordered:
                continue
            sizes.update(b for b, _ in ordered)
            xs = [b for b, _ in ordered]
            ys = [v for _, v in ordered]
            ax.plot(xs, ys, linestyle=styles.get(label, "-"), marker="o", markersize=3, label=label)
        ax.set_xscale("log", base=2)
        if sizes:
            ticks = sorted(sizes)
            if len(ticks) > 16:  # thin the labels out, keeping the first and the last
                step = -(-len(ticks) // 16)
                ticks = ticks[::step] + ([ticks[-1]] if ticks[-1] not in ticks[::step] else [])
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _size_label(v)))
        ax.set_yscale(yscale)
        if yscale == "linear":
            ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)
        if series:
            ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def results_series(results: Iterable[Result]) -> dict[str, list[tuple[int, float]]]:
    """``timing.Result`` rows as plot series: label (``pycoll/ring``, ``gloo``...; with the type and
    op appended when the results hold several) -> (bytes, busbw GB/s) points."""
    rows = list(results)
    several = len({(r.dtype, r.redop) for r in rows}) > 1
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        label = r.label + (f" {r.dtype} {r.redop}" if several else "")
        out.setdefault(label, []).append((r.bytes, r.busbw_GBps))
    return out


def plot_results(results: Iterable[Result], path: str, title: str, **kwargs: Any) -> None:
    """``plot_busbw`` of ``results_series(results)`` (keyword arguments as ``plot_busbw``'s)."""
    plot_busbw(results_series(results), path, title, **kwargs)
