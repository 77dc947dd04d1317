"""The bytes a rank puts on its network link: the transmit counters of the network interface it sends
through (``/sys/class/net/IF/statistics/tx_bytes`` and ``tx_packets``), read around a block of calls.

With ``Job.link_iters = K`` (``pycoll bench --link-bytes K``), after timing each size and variant every
rank runs K more calls of that variant back to back, outside the timed iterations: a barrier, a read of
the counters, a barrier (no rank sends while another reads: ranks of one host share an interface), the
K calls, a barrier (by then every byte of the K calls has arrived: each rank's calls are done and so are
its peers'), a read, a barrier. The difference over K, divided among the ranks of the host (``share``:
they send through the same interface), is the result's ``link_tx_bytes`` / ``link_tx_packets``, per
rank. A barrier's few small messages may be in it too (a few hundred bytes, against megabytes per
call).

What the counters count: every frame the interface sent, headers included. On TCP over IPv4 and Ethernet
that is 66 bytes per packet (``HEADER_BYTES``: Ethernet 14 + IPv4 20 + TCP 20 + the timestamp option 12,
Linux's default), and the packets include the ACKs the host sends for what it receives. With TSO / GSO
(veth, most NICs) a counted packet is a super-packet of up to 64 KiB carrying one set of headers, so
``payload_bytes = tx_bytes - 66 * tx_packets`` is the TCP payload; a wire of 1500-byte frames would
carry one set of headers per 1448 bytes of payload (about 4.6% more), which these counters do not see.

Retransmissions are sent bytes too: the counters count them, and a lossy link (a shaped one whose queue
overflows when several peers send to one host at once) puts more than the formula on the wire. So the
TCP segments the host retransmitted in the same span are read as well (``RetransSegs`` of
/proc/net/snmp, all of the host's TCP sockets: ``link_tx_retrans``); each carries at most one MSS
(``mss``: the interface's MTU less 52 bytes of IPv4 and TCP headers), which bounds the retransmitted
bytes from above.

Reading the counters needs Linux; in a network namespace (``ip netns exec``) /sys and /proc/net show that
namespace's interfaces and TCP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["HEADER_BYTES", "LinkCounter", "LinkReading", "payload_bytes", "why_not"]

#: Header bytes of one TCP/IPv4/Ethernet packet as an interface's counters count it (no preamble, no
#: FCS): Ethernet 14, IPv4 20, TCP 20 + 12 (timestamps).
HEADER_BYTES = 66

#: IPv4 (20) and TCP with timestamps (32) headers: an interface's MTU less these is the MSS.
_IP_TCP_BYTES = 52
_STATS = "/sys/class/net/{}/statistics/{}"


class LinkReading(NamedTuple):
    """The counters at one moment: bytes and packets sent by the interface, TCP segments retransmitted."""

    tx_bytes: int
    tx_packets: int
    retrans_segs: int


@dataclass(frozen=True)
class LinkCounter:
    """Transmit counters of interface ``iface``, read around ``iters`` calls; ``share``: the ranks of
    this host, who send through it (each is credited its share)."""

    iface: str
    iters: int
    share: int = 1

    def read(self) -> LinkReading:
        """The counters now."""
        return LinkReading(_read(self.iface, "tx_bytes"), _read(self.iface, "tx_packets"), _retrans_segs())

    @property
    def mss(self) -> int:
        """The most TCP payload one segment on the interface carries: its MTU less 52."""
        with open(f"/sys/class/net/{self.iface}/mtu", encoding="ascii") as f:
            return int(f.read().strip()) - _IP_TCP_BYTES


def _read(iface: str, counter: str) -> int:
    with open(_STATS.format(iface, counter), encoding="ascii") as f:
        return int(f.read().strip())


def _retrans_segs() -> int:
    """``RetransSegs`` of /proc/net/snmp: TCP segments this host (network namespace) retransmitted."""
    with open("/proc/net/snmp", encoding="ascii") as f:
        tcp = [line.split()[1:] for line in f if line.startswith("Tcp:")]
    names, values = tcp[0], tcp[1]
    return int(values[names.index("RetransSegs")])


def why_not(iface: str | None) -> str | None:
    """Why interface ``iface``'s transmit counters cannot be read here (one line), or None."""
    if not iface:
        return "no network interface named (PYCOLL_SOCKET_IFNAME, or --link-iface)"
    if os.sep in iface or iface in (".", ".."):
        return f"not an interface name: {iface!r}"
    try:
        LinkCounter(iface, 1).read()
    except (OSError, ValueError, IndexError) as exc:
        return f"cannot read the transmit counters of {iface!r}: {exc}"
    return None


def payload_bytes(tx_bytes: float, tx_packets: float) -> float:
    """What of ``tx_bytes`` is TCP payload: ``tx_bytes - HEADER_BYTES * tx_packets`` (see the module doc)."""
    return tx_bytes - HEADER_BYTES * tx_packets
