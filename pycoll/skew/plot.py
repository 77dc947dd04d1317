"""``SkewReport.plot()``: per rank, mean and p99 lateness (whole run and recent window) and the wait it
inflicted on the others. matplotlib is imported only here, with the Agg backend (no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pycoll.errors import InvalidUsageError


class Report(Protocol):
    """What the figure reads of a report (pycoll/skew/report.py ``SkewReport``, whose ``plot`` calls here)."""

    @property
    def world(self) -> int: ...
    @property
    def ranks(self) -> Sequence[Any]: ...
    @property
    def run(self) -> Any: ...
    @property
    def window(self) -> Any: ...

MISSING = "plotting the skew report needs matplotlib: pip install matplotlib"


def plot_report(report: Report, path: str | None = None) -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(MISSING) from e
    if not report.ranks:
        raise InvalidUsageError("the skew report has no ranks to plot")
    ranks = [r.rank for r in report.ranks]
    fig, (ax_late, ax_wait) = plt.subplots(2, 1, figsize=(max(6.0, 0.5 * len(ranks) + 3), 6.5), sharex=True)
    width = 0.4
    spans = [("whole run", report.run, -width / 2)]
    if report.window.collectives:
        spans.append((f"last {report.window.collectives}", report.window, width / 2))
    for label, section, shift in spans:
        xs = [r + shift for r in ranks]
        mean = [r.late_ms["mean"] for r in section.ranks]
        p99 = [r.late_ms["p99"] for r in section.ranks]
        ax_late.bar(xs, mean, width, label=f"mean, {label}")
        ax_late.scatter(xs, p99, marker="_", s=120, color="black", zorder=3, label=f"p99, {label}")
    ax_late.set_ylabel("lateness (ms)")
    ax_late.set_title(f"skew: {report.run.collectives} collectives on {report.world} ranks")
    ax_late.legend(fontsize="small")
    ax_wait.bar(ranks, [r.wait_inflicted_ms / 1000 for r in report.ranks], 0.6, color="tab:red")
    ax_wait.set_ylabel("wait inflicted on the others (s)")
    ax_wait.set_xlabel("rank")
    ax_wait.set_xticks(ranks)
    ax_wait.set_xticklabels([f"{r.rank}\n{r.host[:10]}" for r in report.ranks], fontsize="small")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig
