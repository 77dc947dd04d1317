"""Network helpers of the launch path: the address of a named interface (PYCOLL_SOCKET_IFNAME)."""

from __future__ import annotations

import socket
import struct
import sys

from pycoll.errors import InvalidUsageError

__all__ = ["interface_address", "listen_address", "reachable_address"]

_SIOCGIFADDR = 0x8915  # Linux ioctl: the IPv4 address of an interface
_IF_INET6 = "/proc/net/if_inet6"


def _interface_names() -> list[str]:
    try:
        return [name for _, name in socket.if_nameindex()]
    except OSError:
        return []


def _ipv4_address(name: str) -> str | None:
    if not sys.platform.startswith("linux"):
        return None
    import fcntl  # POSIX only

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:
            return None  # no IPv4 address on it (EADDRNOTAVAIL) or no such interface
    return socket.inet_ntoa(packed[20:24])


def _ipv6_address(name: str) -> str | None:
    """A global-scope IPv6 address of ``name`` from /proc/net/if_inet6 (link-local ones need a scope id,
    which the launch variables cannot carry, so they are skipped)."""
    try:
        with open(_IF_INET6) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) == 6 and fields[5] == name and fields[3] == "00":  # scope 00: global
            raw = bytes.fromhex(fields[0])
            return socket.inet_ntop(socket.AF_INET6, raw)
    return None


def interface_address(name: str) -> str:
    """The address (IPv4 first, else a global IPv6 one) of the network interface ``name``.

    Raises InvalidUsageError naming the interfaces there are when ``name`` does not exist or has no
    usable address.
    """
    names = _interface_names()
    if names and name not in names:
        raise InvalidUsageError(
            f"PYCOLL_SOCKET_IFNAME={name!r}: no such network interface (this host has: {', '.join(names)})"
        )
    address = _ipv4_address(name) or _ipv6_address(name)
    if address is None:
        raise InvalidUsageError(
            f"PYCOLL_SOCKET_IFNAME={name!r}: the interface has no IPv4 or global IPv6 address"
            + ("" if sys.platform.startswith("linux") else " (interfaces are looked up on Linux only)")
        )
    return address


def listen_address(master_addr: str, ifname: str | None) -> str:
    """Where a store that ranks of other hosts reach listens: the address of ``ifname`` when given, else
    every interface (of the family of ``master_addr``)."""
    if ifname is not None:
        return interface_address(ifname)
    return "::" if ":" in master_addr else "0.0.0.0"


def _store_host(store: object) -> str | None:
    """The host of the TCP store under ``store``'s wrappers (PrefixStore, TorchStoreAdapter), if any."""
    seen = 0
    while store is not None and seen < 8:
        host = getattr(store, "host", None)
        if isinstance(host, str):
            return host
        store = getattr(store, "store", None) or getattr(store, "_store", None)
        seen += 1
    return None


def reachable_address(store: object) -> str:
    """This host's IPv4 address on the route to the rendezvous store's host: the address the other hosts
    of the job can reach it at (set PYCOLL_SOCKET_IFNAME to choose another interface)."""
    host = _store_host(store)
    if host:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((socket.gethostbyname(host), 9))  # a UDP "connection" sends nothing
                address = sock.getsockname()[0]
            if not address.startswith("127.") or host in ("localhost",) or host.startswith("127."):
                return address
        except OSError:
            pass
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = "127.0.0.1"
    if address.startswith("127."):
        raise InvalidUsageError(
            "cannot tell which address the other hosts reach this rank at (the rendezvous store is on "
            f"{host or 'an unknown host'} and the hostname resolves to {address}); "
            "set PYCOLL_SOCKET_IFNAME to the network interface to use (e.g. eth0)"
        )
    return address
