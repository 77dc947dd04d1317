"""Bootstrap: launch-environment parsing, the rendezvous key-value store, and rendezvous itself.

``env.py`` reads the launcher's variables, ``store/`` is the key-value store (its ``__init__`` says how
its protocol, server, client and adapters fit), and ``rendezvous.py`` connects the ranks through it.
Pure Python and stdlib only (torch is never imported here; ``TorchStoreAdapter`` is duck typed).
The launcher (``pycoll run``) lives in ``pycoll/cli/run.py``.
"""

from pycoll.bootstrap.env import LaunchInfo, detect_launch, explicit_launch, launcher_hosts_store
from pycoll.bootstrap.rendezvous import rendezvous, rendezvous_file_path, store_barrier
from pycoll.bootstrap.store import PrefixStore, Store, TCPStoreClient, TCPStoreServer, TorchStoreAdapter

__all__ = [
    "LaunchInfo",
    "PrefixStore",
    "Store",
    "TCPStoreClient",
    "TCPStoreServer",
    "TorchStoreAdapter",
    "detect_launch",
    "explicit_launch",
    "launcher_hosts_store",
    "rendezvous",
    "rendezvous_file_path",
    "store_barrier",
]
