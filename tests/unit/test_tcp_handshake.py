"""The TCP transport's connection handshake (csrc/transport/tcp_links.cc, tcp_handshake.cc, hmac.cc),
driven from Python.

Two native communicators of one job (TCP only, loopback) make their link (at first use: here
``_C.testing.tcp_link_now``, as a collective's first message would) while this test throws connections
at a listener: junk, a silent socket, half a Hello, a Hello with a wrong proof, a Hello for another job.
The two ranks still link at once (handshakes run side by side), and every intruder is closed and
counted. Two ranks that dial each other at the same moment end with one link (the lower rank's). A rank
that dials an impostor (a listener without the key) never sends its own proof and gives up naming why;
one that dials a rank whose process is gone loses it (PeerLostError naming it). The wire format is
rebuilt here from tcp_internal.h's description, so the proofs are checked against Python's own ``hmac``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import pycoll
from pycoll import _C

HELLO = struct.Struct("<Qiiii16s")  # magic, rank, world, to, reserved, nonce
CHALLENGE = struct.Struct("<Q16s32s")  # magic, nonce, proof
VERDICT = struct.Struct("<Q")
HELLO_MAGIC = 0x33706374637970
CHALLENGE_MAGIC = 0x33686374637970
VERDICT_LINK = 0x6B6E696C746376
VERDICT_DOUBLE = 0x6C627564746376
KEY = bytes(range(32))


def _proof(key: bytes, role: bytes, hello: bytes, listener_nonce: bytes) -> bytes:
    return hmac.new(key, role + hello + listener_nonce, hashlib.sha256).digest()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _native(rank: int, world: int) -> _C.NativeCommunicator:
    return _C.NativeCommunicator(rank, world, 65536, 4, 0, 0, 1 << 30, tcp_bind="127.0.0.1")


def _link_in_thread(comm, peer, timeout):
    outcome: dict = {}

    def run():
        try:
            _C.testing.tcp_link_now(comm, peer, timeout)
            outcome["ok"] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def _handshake(listener, rank: int, world: int, to: int, key: bytes) -> tuple[socket.socket, int]:
    """A dialer that holds ``key``: the whole handshake; the socket and the listener's verdict."""
    sock = socket.create_connection(listener)
    hello = HELLO.pack(HELLO_MAGIC, rank, world, to, 0, os.urandom(16))
    sock.sendall(hello)
    magic, nonce, proof = CHALLENGE.unpack(_recv_exactly(sock, CHALLENGE.size))
    assert magic == CHALLENGE_MAGIC and proof == _proof(key, b"L", hello, nonce)
    sock.sendall(_proof(key, b"D", hello, nonce))
    (verdict,) = VERDICT.unpack(_recv_exactly(sock, VERDICT.size))
    return sock, verdict


@pytest.mark.parametrize(
    "key,message,digest",
    [  # RFC 4231, test cases 1, 2 and 6 (a key longer than a block)
        (b"\x0b" * 20, b"Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
        (b"Jefe", b"what do ya want for nothing?",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    ],
)
def test_hmac_sha256_matches_rfc_4231(key, message, digest):
    assert _C.testing.hmac_sha256(key, message).hex() == digest


def test_hmac_sha256_matches_python_across_block_boundaries():
    for n in (0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 1000):
        message, key = os.urandom(n), os.urandom(n % 97)
        assert _C.testing.hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest()


def test_intruders_are_dropped_and_the_job_still_links_at_once():
    rank0, rank1 = _native(0, 2), _native(1, 2)
    addresses = [f"127.0.0.1:{rank0.tcp_port}", f"127.0.0.1:{rank1.tcp_port}"]
    for comm in (rank0, rank1):
        comm.set_tcp_peers(addresses, KEY, 20.0)
    listener = ("127.0.0.1", rank0.tcp_port)
    intruders = []
    try:
        junk = socket.create_connection(listener)
        junk.sendall(os.urandom(200))
        silent = socket.create_connection(listener)  # says nothing: must not hold the job back
        half = socket.create_connection(listener)
        half.sendall(HELLO.pack(HELLO_MAGIC, 1, 2, 0, 0, os.urandom(16))[:20])
        intruders += [junk, silent, half]

        # A Hello in the right format: the listener proves itself with the right key ...
        liar = socket.create_connection(listener)
        intruders.append(liar)
        hello = HELLO.pack(HELLO_MAGIC, 1, 2, 0, 0, os.urandom(16))
        liar.sendall(hello)
        magic, nonce, proof = CHALLENGE.unpack(_recv_exactly(liar, CHALLENGE.size))
        assert magic == CHALLENGE_MAGIC
        assert proof == _proof(KEY, b"L", hello, nonce)
        # ... but a proof under another key (or the listener's own proof sent back) is refused
        liar.sendall(_proof(b"not the job's key" * 2, b"D", hello, nonce))
        assert _recv_exactly(liar, 1) == b"", "the listener kept a connection with a wrong proof"
        mirror = socket.create_connection(listener)
        intruders.append(mirror)
        hello = HELLO.pack(HELLO_MAGIC, 1, 2, 0, 0, os.urandom(16))
        mirror.sendall(hello)
        _, nonce, proof = CHALLENGE.unpack(_recv_exactly(mirror, CHALLENGE.size))
        mirror.sendall(proof)
        assert _recv_exactly(mirror, 1) == b""

        other_job = socket.create_connection(listener)  # a world of 3: not this job
        intruders.append(other_job)
        other_job.sendall(HELLO.pack(HELLO_MAGIC, 1, 3, 0, 0, os.urandom(16)))
        assert _recv_exactly(other_job, 1) == b""

        started = time.monotonic()
        thread1, outcome1 = _link_in_thread(rank1, 0, 20.0)
        thread1.join(30)
        assert "error" not in outcome1, outcome1
        # well before the silent connections' 5 s handshake limit: they did not block the listener
        assert outcome1["ok"] - started < 4.0
        assert _C.testing.tcp_linked(rank1) == [0]
        deadline = time.monotonic() + 10
        while _C.testing.tcp_linked(rank0) != [1] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _C.testing.tcp_linked(rank0) == [1]
        assert _C.testing.tcp_rejected(rank0) >= 4  # junk, liar, mirror, other_job (half, silent: at 5 s)
        assert _C.testing.tcp_rejected(rank1) == 0
        # The listener stays open (links are made at first use), and a proven dial from a rank already
        # linked is told the link exists: the connection is closed, the link kept.
        extra, verdict = _handshake(listener, 1, 2, 0, KEY)
        intruders.append(extra)
        assert verdict == VERDICT_DOUBLE and _recv_exactly(extra, 1) == b""
        assert _C.testing.tcp_linked(rank0) == [1]
    finally:
        for s in intruders:
            s.close()
        del rank0, rank1


def test_two_ranks_dialling_each_other_at_once_keep_one_link():
    for _ in range(10):
        rank0, rank1 = _native(0, 2), _native(1, 2)
        addresses = [f"127.0.0.1:{rank0.tcp_port}", f"127.0.0.1:{rank1.tcp_port}"]
        for comm in (rank0, rank1):
            comm.set_tcp_peers(addresses, KEY, 20.0)
        (t0, o0), (t1, o1) = _link_in_thread(rank0, 1, 20.0), _link_in_thread(rank1, 0, 20.0)
        t0.join(30)
        t1.join(30)
        assert "error" not in o0 and "error" not in o1, (o0, o1)
        assert _C.testing.tcp_linked(rank0) == [1] and _C.testing.tcp_linked(rank1) == [0]
        assert _C.testing.tcp_rejected(rank0) == 0 and _C.testing.tcp_rejected(rank1) == 0
        del rank0, rank1


def _impostor(key: bytes, seen: dict, ready: threading.Event, port_box: list) -> None:
    """Listens like rank 0 but proves itself with ``key``; records what dialers send after its challenge."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port_box.append(server.getsockname()[1])
        ready.set()
        server.settimeout(10)
        conn, _ = server.accept()
        with conn:
            hello = _recv_exactly(conn, HELLO.size)
            nonce = os.urandom(16)
            conn.sendall(CHALLENGE.pack(CHALLENGE_MAGIC, nonce, _proof(key, b"L", hello, nonce)))
            conn.settimeout(3)
            try:
                seen["after_challenge"] = _recv_exactly(conn, 32)
            except OSError:
                seen["after_challenge"] = b""


def test_a_dialer_does_not_prove_itself_to_a_listener_without_the_key():
    seen: dict = {}
    ready, port_box = threading.Event(), []
    impostor = threading.Thread(target=_impostor, args=(b"x" * 32, seen, ready, port_box), daemon=True)
    impostor.start()
    assert ready.wait(10)
    rank1 = _native(1, 2)
    rank1.set_tcp_peers([f"127.0.0.1:{port_box[0]}", f"127.0.0.1:{rank1.tcp_port}"], KEY, 1.5)
    with pytest.raises(pycoll.PeerLostError, match="did not prove it holds this job's key") as info:
        _C.testing.tcp_link_now(rank1, 0, 10.0)
    assert info.value.rank == 0
    impostor.join(10)
    assert seen["after_challenge"] == b"", "the dialer sent its proof to a listener that did not prove itself"


def test_ranks_with_different_keys_do_not_connect():
    rank0, rank1 = _native(0, 2), _native(1, 2)
    addresses = [f"127.0.0.1:{rank0.tcp_port}", f"127.0.0.1:{rank1.tcp_port}"]
    rank0.set_tcp_peers(addresses, KEY, 2.0)
    rank1.set_tcp_peers(addresses, bytes(32), 2.0)
    with pytest.raises(pycoll.PeerLostError, match="could not connect to rank 0"):
        _C.testing.tcp_link_now(rank1, 0, 10.0)
    deadline = time.monotonic() + 10  # rank 0 drops the dialer that never proved itself (5 s)
    while _C.testing.tcp_rejected(rank0) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _C.testing.tcp_rejected(rank0) >= 1
    assert _C.testing.tcp_linked(rank0) == []


def test_a_peer_whose_process_is_gone_is_lost_by_name():
    """Dialling a rank whose listening socket is gone (its process exited): refused at once, the peer
    lost, PeerLostError naming it, well before the dial timeout."""
    rank0, rank1 = _native(0, 2), _native(1, 2)
    addresses = [f"127.0.0.1:{rank0.tcp_port}", f"127.0.0.1:{rank1.tcp_port}"]
    rank1.set_tcp_peers(addresses, KEY, 60.0)
    del rank0  # closes its listening socket, as the kernel does when its process dies
    started = time.monotonic()
    with pytest.raises(pycoll.PeerLostError, match="rank 0 cannot be reached") as info:
        _C.testing.tcp_link_now(rank1, 0, 30.0)
    assert info.value.rank == 0 and time.monotonic() - started < 5.0


def test_failed_set_up_leaks_no_descriptor():
    """A transport whose set-up throws after its listening socket exists (here: a bind address that is
    not one) closes that socket: the descriptors are owned from their creation (csrc/transport/fd.h)."""
    before = _open_sockets()
    for _ in range(20):
        with pytest.raises(pycoll.InvalidUsageError, match="not an IPv4 address"):
            _C.NativeCommunicator(0, 2, 65536, 4, 0, 0, 1 << 30, tcp_bind="not-an-address")
    # Sockets open now that were not before (threads of earlier tests may close their own descriptors
    # meanwhile, so the count alone can fall).
    assert _open_sockets() - before == set()


def _open_sockets() -> set[tuple[str, str]]:
    """(descriptor, socket inode) of this process's open sockets."""
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:"):
            out.add((fd, target))
    return out


# Rank 1 of the test below, in a process of its own: the rank it talks to finalizes with the GIL held (a
# destructor), as a rank's exit does. It listens on the socket it is handed, answers the dial up to the
# dialler's proof, holds its verdict a moment (the dialler must not close meanwhile), gives it, and prints
# the types of the frames that came before the connection closed.
_HOLDING_PEER = """
import hashlib, hmac, json, os, socket, struct, sys, time
HELLO, CHALLENGE, FRAME = struct.Struct("<Qiiii16s"), struct.Struct("<Q16s32s"), struct.Struct("<II40x")
key, fd = bytes.fromhex(sys.argv[1]), int(sys.argv[2])
def proof(role, hello, nonce):
    return hmac.new(key, role + hello + nonce, hashlib.sha256).digest()
def recv_exactly(sock, n):
    data = b""
    while len(data) < n and (chunk := sock.recv(n - len(data))):
        data += chunk
    return data
server = socket.socket(fileno=fd)
server.settimeout(10)
conn, _ = server.accept()
hello = recv_exactly(conn, HELLO.size)
nonce = os.urandom(16)
conn.sendall(CHALLENGE.pack(0x33686374637970, nonce, proof(b"L", hello, nonce)))
assert recv_exactly(conn, 32) == proof(b"D", hello, nonce)
print("proven", flush=True)
conn.settimeout(0.5)
try:
    early = conn.recv(1)
except socket.timeout:
    early = None
conn.settimeout(10)
conn.sendall(struct.pack("<Q", 0x6B6E696C746376))
received = b""
while chunk := conn.recv(65536):
    received += chunk
types = []
while received:
    kind, size = FRAME.unpack_from(received)
    types.append(kind)
    received = received[FRAME.size + size:]
print(json.dumps({"early": None if early is None else early.hex(), "frames": types}), flush=True)
"""


def test_a_rank_that_finalizes_mid_handshake_finishes_the_link_and_says_bye():
    """The peer that gave its verdict counts the link as up before the dialler has read it: a dialler that
    finalizes in between must not close that connection unannounced (to the peer, a death in whatever
    collective it is still finishing). It reads the verdict, says BYE (frame type 4) on the new link, and
    only then closes."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = subprocess.Popen(
            [sys.executable, "-c", _HOLDING_PEER, KEY.hex(), str(server.fileno())],
            pass_fds=[server.fileno()], stdout=subprocess.PIPE, text=True,
        )
        port = server.getsockname()[1]
    try:
        rank0 = _native(0, 2)
        rank0.set_tcp_peers([f"127.0.0.1:{rank0.tcp_port}", f"127.0.0.1:{port}"], KEY, 20.0)
        with pytest.raises(pycoll.PycollError, match="no link to rank 1 in time"):
            _C.testing.tcp_link_now(rank0, 1, 0.1)  # wants rank 1: its I/O thread goes on dialling
        assert peer.stdout.readline().strip() == "proven"
        del rank0  # finalizes while the peer holds its verdict
        outcome = json.loads(peer.communicate(timeout=30)[0])
    finally:
        peer.kill()
    assert outcome["early"] is None, "the finalizing rank closed the connection its peer was linking"
    assert outcome["frames"][-1:] == [4], outcome
