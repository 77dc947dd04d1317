"""Fault tolerance in the core: each communicator's fault plane (failure detector, revocation,
eviction), fault-tolerant agreement, and membership changes (shrink, grow, join). One concern per module:

- ``wire.py``: frames (length + JSON) and the HMAC proof of a connection.
- ``listener.py``: the process's control socket, where plane links and join requests arrive.
- ``plane.py``: one rank's end of a communicator's fault plane: links, heartbeat, detector, revoke.
- ``agreement.py``: the agreement protocol over a plane.
- ``kvstore.py``: the key-value store a new communicator is set up through after a shrink or grow.
- ``membership.py``: the plane made at ``init``, shrink, grow and a joining process's side.

``pycoll.comm.Communicator`` exposes them (``revoke``, ``agree``, ``shrink``, ``grow``); the elastic
training loop above them is ``pycoll.elastic``. The guide is docs/fault-tolerance.md.
"""
