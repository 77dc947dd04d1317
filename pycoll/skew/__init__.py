"""Load imbalance made visible (docs/skew.md): per rank and collective kind, how late each rank enters the
collectives and how long the others wait for it, learnt from the entry times every rank announces as it
enters a collective (no message of its own). ``comm.skew()`` / ``pycoll.skew_report()`` give the
report, ``comm.on_straggler()`` a notice when one rank keeps the others waiting."""

from pycoll.skew.report import RankSkew, SkewReport, SkewSection
from pycoll.skew.tracker import Notice, StragglerEvent

__all__ = ["Notice", "RankSkew", "SkewReport", "SkewSection", "StragglerEvent"]
