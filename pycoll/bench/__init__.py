"""pycoll's benchmark package: the tools layer, above the core (the core never imports it).

=================  ==================================================================================
module             what it holds
=================  ==================================================================================
``collectives``    what differs between the all-reduce, the reduce-scatter and the all-gather: size and
                   bus factor (nccl-tests'), buffers, how pycoll / torch / MPI call each, exact and
                   compressed checks
``timing``         the clock: warm-up, per-iteration slowest-rank times, medians; ``Result``,
                   ``Variant``, ``run_interleaved_sweep``; a large memcpy beside the run
``inputs``         rank-dependent inputs and expected values (exact for every op and type; Gaussian
                   with a codec's error bound for compressed runs)
``variants``       the collectives one sweep times: pycoll's (algorithm x codec) and the baselines'
``baselines``      Gloo, Open MPI and NCCL timed in the same ranks
``link``           the bytes a rank puts on its network interface (its transmit counters)
``report``         the nccl-tests-style table, JSON lines, the progress line, ``run_and_report``
``options``        the flags every benchmark program takes (-b/-e/-f, -n/-w, -c, --json, -o, -d...)
``plots``          busbw against size (matplotlib)
``jobs``           the job protocol: a ``Job`` and ``run_job(job)``, which starts the ranks and
                   collects their results
``worker``         the rank side: what a launched rank runs for a ``Job``
=================  ==================================================================================

Importing any of these loads neither numpy nor pycoll's native module (``pycoll --help`` and the
baselines' scripts load them); each loads what it needs when it runs.
"""
