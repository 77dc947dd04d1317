"""Where every rank is: the flight recorder, probes, and the reports built from them (docs/diagnosis.md).

    recorder   pycoll/flight/recorder.py   every process keeps its last collectives, natively
                                           (csrc/engine/flight_recorder.h): communicator, collective
                                           number, call, call site, enqueue / start / end, state
    probe      pycoll/flight/probe.py      asks another process where it is; its control listener
                                           answers natively (csrc/fault/probe.h): its records, its
                                           threads' Python stacks, its main thread's state
    analysis   pycoll/flight/analysis.py   what the records of several ranks say: who is behind, ahead or
                                           elsewhere, where each one is, the first divergence
    explain    pycoll/flight/explain.py    a timeout, lost peer or mismatch, explained in its error, with
                                           every rank's records written to a dump file

``pycoll trace dump`` and ``pycoll trace analyze`` (pycoll/cli/trace.py) use the same parts on a live job.
"""

from pycoll.flight.analysis import analyze_dumps
from pycoll.flight.recorder import local_report

__all__ = ["analyze_dumps", "local_report"]
