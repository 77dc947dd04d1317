"""The rendezvous store's guard: the secret handshake, and connections that break the protocol.

With a secret every connection proves it (HMAC challenge both ways); mismatches of any kind fail at once
with InvalidUsageError and never print the secret. With or without a secret, garbage, truncated frames,
out-of-range lengths, unknown ops, idle or slow handshakes and clients that do not read their replies
are dropped, logged (naming the peer) and counted, while other clients are served without delay.

No fixed ports (servers bind port 0) and every wait has a deadline.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import _threads
import pytest

from pycoll.bootstrap.env import LaunchInfo, explicit_launch
from pycoll.bootstrap.rendezvous import rendezvous
from pycoll.bootstrap.store import TCPStoreClient, TCPStoreServer
from pycoll.env import Settings, rendezvous_secret
from pycoll.errors import CollectiveTimeoutError, InvalidUsageError

DEADLINE = 20.0  # upper bound for anything that should take well under a second
SECRET = b"correct horse battery staple 0123456789"
WRONG = b"incorrect pony battery staple 9876543210"
MAGIC = b"pycoll-store/2"
LOGGER = "pycoll"


# ---- helpers -------------------------------------------------------------------------------------------
def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def blob(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def hello(auth: int = 0, magic: bytes = MAGIC) -> bytes:
    return frame(b"\x00" + blob(magic) + bytes([auth]))


def recv_frame(sock: socket.socket) -> bytes:
    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise EOFError
            data += chunk
        return data

    (length,) = struct.unpack(">I", exact(4))
    return exact(length)


def raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)


def wait_closed(sock: socket.socket, timeout: float = DEADLINE) -> float:
    """Seconds until the server closes ``sock`` (whatever it sends first is read and ignored)."""
    start = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def wait_for(predicate: Callable[[], bool], timeout: float = DEADLINE) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not met before the deadline"
        time.sleep(0.01)


def drop_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "dropped" in r.getMessage()
    ]


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in (SECRET, WRONG):
            assert secret.decode() not in text and secret.hex() not in text, text


@pytest.fixture
def warnings_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    yield caplog
    assert_no_secret(caplog.text)


@pytest.fixture
def guarded() -> Iterator[TCPStoreServer]:
    srv = TCPStoreServer("127.0.0.1", 0, secret=SECRET, handshake_timeout=DEADLINE)
    yield srv
    srv.close()


@pytest.fixture
def open_server() -> Iterator[TCPStoreServer]:
    srv = TCPStoreServer("127.0.0.1", 0, handshake_timeout=DEADLINE)
    yield srv
    srv.close()


def served_quickly(port: int, secret: bytes | None, key: str = "probe") -> float:
    """Seconds a fresh legitimate client takes to connect, set and get (the store is not held up)."""
    start = time.monotonic()
    with TCPStoreClient("127.0.0.1", port, timeout=DEADLINE, secret=secret) as c:
        c.set(key, b"ok")
        assert c.get(key) == b"ok"
    return time.monotonic() - start


# ---- the secret ----------------------------------------------------------------------------------------
def test_right_secret_works(guarded, warnings_log):
    assert guarded.requires_secret
    with TCPStoreClient("127.0.0.1", guarded.port, timeout=DEADLINE, secret=SECRET) as a:
        with TCPStoreClient("127.0.0.1", guarded.port, timeout=DEADLINE, secret=SECRET.decode()) as b:
            a.set("k", b"v")
            assert b.get("k") == b"v"
            assert b.add("n", 2) == 2 and a.add("n", 3) == 5
            assert guarded.num_clients == 2
    assert guarded.rejected_connections == 0
    assert drop_warnings(warnings_log) == []


def test_no_secret_on_either_side_works(open_server):
    assert not open_server.requires_secret
    assert served_quickly(open_server.port, None) < 5.0
    assert open_server.rejected_connections == 0


@pytest.mark.parametrize(
    "server_secret, client_secret, message, logged",
    [
        (SECRET, WRONG, "the rendezvous secret did not match", "wrong rendezvous secret"),
        (SECRET, None, "requires a rendezvous secret, but this process has none", "has no rendezvous secret"),
        (None, SECRET, "has none: set the same PYCOLL_SECRET", "this store has none"),
    ],
    ids=["wrong_secret", "client_without_secret", "server_without_secret"],
)
def test_mismatch_is_a_clear_error_at_once(warnings_log, server_secret, client_secret, message, logged):
    srv = TCPStoreServer("127.0.0.1", 0, secret=server_secret, handshake_timeout=DEADLINE)
    try:
        start = time.monotonic()
        with pytest.raises(InvalidUsageError) as info:
            # a long connect deadline: the mismatch must not be retried until it passes
            TCPStoreClient(
                "127.0.0.1", srv.port, timeout=DEADLINE, connect_timeout=DEADLINE, secret=client_secret
            )
        assert time.monotonic() - start < 5.0
        text = str(info.value)
        assert message in text and f"127.0.0.1:{srv.port}" in text, text
        assert "PYCOLL_SECRET" in text
        assert_no_secret(text, repr(info.value))
        wait_for(lambda: srv.rejected_connections == 1)
        warnings = drop_warnings(warnings_log)
        assert len(warnings) == 1 and logged in warnings[0], warnings
        assert "127.0.0.1:" in warnings[0].split("dropped the connection from", 1)[1]
        # the store goes on serving clients that hold the right secret (or none, as it expects)
        assert served_quickly(srv.port, server_secret) < 5.0
        wait_for(lambda: srv.num_clients == 0)
    finally:
        srv.close()


def test_wrong_secret_server_log_names_the_peer(guarded, warnings_log):
    # A hand-made client, so that its address is known: the warning must name exactly that peer.
    with raw(guarded.port) as sock:
        sock.sendall(hello(auth=1))
        reply = recv_frame(sock)
        assert reply[:1] == b"\x00" and reply[1:].startswith(blob(MAGIC) + b"\x01")
        nonce = reply[1 + 4 + len(MAGIC) + 1 + 4 :]
        assert len(nonce) == 32
        client_nonce = os.urandom(32)
        proof = hmac.new(
            WRONG, b"pycoll-store client" + nonce + client_nonce + MAGIC, hashlib.sha256
        ).digest()
        sock.sendall(frame(b"\x07" + blob(client_nonce) + blob(proof)))
        err = recv_frame(sock)
        assert err[:1] == b"\x02" and b"did not match" in err
        host, port = sock.getsockname()[:2]
        wait_closed(sock)
    wait_for(lambda: guarded.rejected_connections == 1)
    (warning,) = drop_warnings(warnings_log)
    assert f"from {host}:{port}: wrong rendezvous secret" in warning, warning


def test_hand_made_client_with_right_secret_is_served(guarded):
    # The handshake as documented in pycoll/bootstrap/store/protocol.py, computed independently of its code.
    with raw(guarded.port) as sock:
        sock.sendall(hello(auth=1))
        nonce = recv_frame(sock)[1 + 4 + len(MAGIC) + 1 + 4 :]
        client_nonce = os.urandom(32)
        transcript = nonce + client_nonce + MAGIC
        proof = hmac.new(SECRET, b"pycoll-store client" + transcript, hashlib.sha256).digest()
        sock.sendall(frame(b"\x07" + blob(client_nonce) + blob(proof)))
        reply = recv_frame(sock)
        assert reply == b"\x00" + blob(
            hmac.new(SECRET, b"pycoll-store server" + transcript, hashlib.sha256).digest()
        )
        sock.sendall(frame(b"\x01" + blob(b"k") + blob(b"v")))  # SET k v
        assert recv_frame(sock) == b"\x00"
    with TCPStoreClient("127.0.0.1", guarded.port, timeout=DEADLINE, secret=SECRET) as c:
        assert c.get("k") == b"v"
    assert guarded.rejected_connections == 0


def fake_server(answer: Callable[[socket.socket], None]) -> tuple[int, Callable[[], None]]:
    """A listener whose every connection is handled by ``answer``; returns (port, stop)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(DEADLINE)
                try:
                    answer(conn)
                except (OSError, EOFError):
                    pass

    t = threading.Thread(target=serve, daemon=True)
    t.start()

    def close() -> None:
        stop.set()
        t.join(DEADLINE)
        listener.close()

    return listener.getsockname()[1], close


def test_client_refuses_an_impostor_server():
    # It asks for a proof, accepts any, and answers with a made-up one of its own.
    def impostor(conn: socket.socket) -> None:
        recv_frame(conn)
        conn.sendall(frame(b"\x00" + blob(MAGIC) + b"\x01" + blob(os.urandom(32))))
        recv_frame(conn)
        conn.sendall(frame(b"\x00" + blob(os.urandom(32))))
        recv_frame(conn)  # waits for the client to hang up

    port, stop = fake_server(impostor)
    try:
        start = time.monotonic()
        with pytest.raises(InvalidUsageError, match="could not prove it holds the rendezvous secret") as info:
            TCPStoreClient("127.0.0.1", port, timeout=DEADLINE, secret=SECRET)
        assert time.monotonic() - start < 5.0
        assert_no_secret(str(info.value))
    finally:
        stop()


def test_client_refuses_a_server_that_skips_the_proof():
    # A store that claims to need no secret cannot trick a client holding one into talking to it.
    def lax(conn: socket.socket) -> None:
        recv_frame(conn)
        conn.sendall(frame(b"\x00" + blob(MAGIC) + b"\x00" + blob(b"")))
        recv_frame(conn)

    port, stop = fake_server(lax)
    try:
        with pytest.raises(InvalidUsageError, match="has none"):
            TCPStoreClient("127.0.0.1", port, timeout=DEADLINE, secret=SECRET)
    finally:
        stop()


def test_other_protocol_version_is_told_why(open_server, warnings_log):
    with raw(open_server.port) as sock:
        sock.sendall(frame(b"\x00" + blob(b"pycoll-store/1")))  # version 1's HELLO
        reply = recv_frame(sock)
        assert reply[:1] == b"\x02" and b"pycoll-store/2" in reply and b"same pycoll version" in reply
        wait_closed(sock)
    wait_for(lambda: open_server.rejected_connections == 1)
    assert "another protocol version (pycoll-store/1)" in drop_warnings(warnings_log)[0]


def test_empty_or_bad_secret_is_usage_error():
    with pytest.raises(InvalidUsageError, match="must not be empty"):
        TCPStoreServer("127.0.0.1", 0, secret=b"")
    with pytest.raises(InvalidUsageError, match="must be bytes"):
        TCPStoreClient("127.0.0.1", 1, secret=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidUsageError, match="handshake_timeout"):
        TCPStoreServer("127.0.0.1", 0, handshake_timeout=0)


def test_settings_read_the_secret_and_never_show_it():
    assert rendezvous_secret({}) is None
    assert rendezvous_secret({"PYCOLL_SECRET": ""}) is None
    assert rendezvous_secret({"PYCOLL_SECRET": "s3cr\u00e9t"}) == "s3cr\u00e9t".encode()
    settings = Settings.from_environ({"PYCOLL_SECRET": SECRET.decode()})
    assert settings.secret == SECRET
    assert Settings.from_environ({}).secret is None
    assert_no_secret(repr(settings), str(settings))


def test_doctor_hides_the_secret():
    from pycoll.doctor.probes import probe_environment

    shown = probe_environment({"PYCOLL_SECRET": SECRET.decode(), "PYCOLL_TIMEOUT": "5", "HOME": "/root"})
    assert shown == {"PYCOLL_SECRET": "(set, hidden)", "PYCOLL_TIMEOUT": "5"}


# ---- connections that break the protocol ---------------------------------------------------------------
@pytest.fixture(params=[None, SECRET], ids=["no_secret", "secret"])
def secret(request: pytest.FixtureRequest) -> bytes | None:
    return request.param


def test_idle_partial_and_slow_handshakes_are_dropped_at_the_deadline(secret, warnings_log):
    srv = TCPStoreServer("127.0.0.1", 0, secret=secret, handshake_timeout=1.5)
    try:
        start = time.monotonic()
        idle = raw(srv.port)  # connects, sends nothing
        partial = raw(srv.port)
        partial.sendall(hello(auth=int(secret is not None))[:7])  # half a HELLO, then stalls
        slow = raw(srv.port)
        trickle = hello(auth=int(secret is not None))
        # While they are open, the store serves everyone else at once (not after their deadline).
        assert served_quickly(srv.port, secret) < 1.0
        for i in range(12):  # one byte every 0.2 s: too slow to finish within 1.5 s
            try:
                slow.sendall(trickle[i : i + 1])
            except OSError:
                break
            time.sleep(0.2)
        for sock in (idle, partial, slow):
            wait_closed(sock)
            sock.close()
        assert 1.4 < time.monotonic() - start < 10.0
        wait_for(lambda: srv.rejected_connections == 3)
        warnings = drop_warnings(warnings_log)
        assert len(warnings) == 3 and all(
            "did not complete the handshake within 1.50 s" in w for w in warnings
        )
        assert served_quickly(srv.port, secret) < 5.0
    finally:
        srv.close()


def handshaken(port: int) -> socket.socket:
    sock = raw(port)
    sock.sendall(hello())
    assert recv_frame(sock) == b"\x00" + blob(MAGIC) + b"\x00" + blob(b"")
    return sock


BEFORE_HANDSHAKE = {
    "random_bytes": (random.Random(7).randbytes(4096), "not a pycoll store client"),
    "oversized_length": (struct.pack(">I", 1 << 20) + b"x" * 64, "frame length 1048576 out of range"),
    "zero_length": (struct.pack(">I", 0), "frame length 0 out of range"),
    "set_before_hello": (frame(b"\x01" + blob(b"k") + blob(b"v")), "op 1 before the handshake"),
    "unknown_op": (frame(b"\x63" + b"hi"), "op 99 before the handshake"),
    "http": (b"GET / HTTP/1.0\r\n\r\n", "out of range"),
    "bad_auth_mode": (hello(auth=9), "unknown authentication mode 9"),
    "wrong_magic": (frame(b"\x00" + blob(b"not-pycoll") + b"\x00"), "wrong magic"),
}


@pytest.mark.parametrize("name", sorted(BEFORE_HANDSHAKE))
def test_bad_bytes_before_the_handshake_are_dropped_at_once(secret, warnings_log, name):
    data, reason = BEFORE_HANDSHAKE[name]
    srv = TCPStoreServer("127.0.0.1", 0, secret=secret, handshake_timeout=DEADLINE)
    try:
        with raw(srv.port) as sock:
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # dropped before it finished writing
            assert wait_closed(sock) < 5.0  # long before the handshake deadline
        wait_for(lambda: srv.rejected_connections == 1)
        (warning,) = drop_warnings(warnings_log)
        assert reason in warning, warning
        assert served_quickly(srv.port, secret) < 5.0
        with TCPStoreClient("127.0.0.1", srv.port, timeout=DEADLINE, secret=secret) as c:
            assert not c.check(["k"])  # nothing it sent was executed
    finally:
        srv.close()


def test_ops_without_the_proof_are_refused(guarded, warnings_log):
    # HELLO asking for the challenge, then a SET instead of AUTH: dropped, nothing stored.
    with raw(guarded.port) as sock:
        sock.sendall(hello(auth=1))
        recv_frame(sock)
        sock.sendall(frame(b"\x01" + blob(b"k") + blob(b"v")))
        wait_closed(sock)
    wait_for(lambda: guarded.rejected_connections == 1)
    assert "op 1 instead of AUTH" in drop_warnings(warnings_log)[0]
    with TCPStoreClient("127.0.0.1", guarded.port, timeout=DEADLINE, secret=SECRET) as c:
        assert not c.check(["k"])


def test_truncated_frame_after_the_handshake_is_logged(open_server, warnings_log):
    sock = handshaken(open_server.port)
    sock.sendall(struct.pack(">I", 100) + b"\x01" + b"x" * 10)
    assert served_quickly(open_server.port, None) < 5.0  # a half-sent frame holds nobody up
    sock.close()
    wait_for(lambda: open_server.rejected_connections == 1)
    assert "in the middle of a message" in drop_warnings(warnings_log)[0]


def test_client_that_does_not_read_replies_is_dropped(warnings_log):
    srv = TCPStoreServer("127.0.0.1", 0, max_pending_output=256 * 1024)
    try:
        with TCPStoreClient("127.0.0.1", srv.port, timeout=DEADLINE) as c:
            c.set("big", b"x" * 65536)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(DEADLINE)
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(hello())
        recv_frame(sock)
        get = frame(b"\x02" + blob(b"big") + struct.pack(">d", 1.0))
        # 64 MiB of replies asked for and none read: more than the kernel's buffers and the cap
        try:
            for _ in range(64):
                sock.sendall(get * 16)
        except (BrokenPipeError, ConnectionResetError):
            pass
        wait_for(lambda: srv.rejected_connections == 1)
        assert "does not read its replies" in drop_warnings(warnings_log)[0]
        assert served_quickly(srv.port, None) < 5.0
        sock.close()
    finally:
        srv.close()


def test_data_piled_behind_a_parked_request_is_capped(open_server, warnings_log):
    sock = handshaken(open_server.port)
    sock.sendall(frame(b"\x02" + blob(b"never") + struct.pack(">d", 30.0)))  # parks a GET
    try:
        for _ in range(40):
            sock.sendall(frame(b"\x06" + struct.pack(">I", 0)) * 8192)  # 72 KiB of CHECKs each time
    except (BrokenPipeError, ConnectionResetError):
        pass
    wait_for(lambda: open_server.rejected_connections == 1)
    assert "past a request still waiting" in drop_warnings(warnings_log)[0]
    sock.close()


def test_warnings_are_rate_limited_but_every_drop_is_counted(open_server, warnings_log):
    for _ in range(60):
        with raw(open_server.port) as sock:
            sock.sendall(b"\xff" * 8)
            wait_closed(sock)
    wait_for(lambda: open_server.rejected_connections == 60)
    assert len(drop_warnings(warnings_log)) == 50


# ---- rendezvous with a secret --------------------------------------------------------------------------
def run_threads(fns: list[Any], timeout: float = DEADLINE) -> list[Any]:
    return _threads.run_threads(fns, timeout)


def close_all(results: list[Any]) -> None:
    for r in results[::-1]:
        if isinstance(r, tuple):
            store, server = r
            store.close()
            if server is not None:
                server.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rendezvous_master_port_with_secret():
    port = free_port()
    results = run_threads(
        [
            lambda r=r: rendezvous(explicit_launch(r, 3, "127.0.0.1", port), timeout=DEADLINE, secret=SECRET)
            for r in range(3)
        ]
    )
    try:
        assert all(isinstance(r, tuple) for r in results), results
        assert results[0][1].requires_secret
        results[2][0].set("hello", b"from 2")
        assert results[0][0].get("hello") == b"from 2"
        with pytest.raises(InvalidUsageError, match="requires a rendezvous secret"):
            TCPStoreClient("127.0.0.1", port, timeout=DEADLINE)
    finally:
        close_all(results)


def test_rendezvous_rank_with_wrong_secret_fails_at_once():
    port = free_port()

    def join(rank: int, secret: bytes) -> Any:
        return rendezvous(explicit_launch(rank, 2, "127.0.0.1", port), timeout=3.0, secret=secret)

    start = time.monotonic()
    results = run_threads([lambda: join(0, SECRET), lambda: join(1, WRONG)])
    assert isinstance(results[1], InvalidUsageError) and "did not match" in str(results[1]), results
    assert isinstance(results[0], CollectiveTimeoutError), results  # rank 0 waits for a rank 1 that left
    assert time.monotonic() - start < 10.0
    assert_no_secret(str(results[0]), str(results[1]))


def test_launcher_hosted_and_file_rendezvous_with_secret(guarded, tmp_path):
    def hosted(rank: int) -> Any:
        info = explicit_launch(rank, 2, "127.0.0.1", guarded.port)
        return rendezvous(info, timeout=DEADLINE, store_hosted_externally=True, secret=SECRET)

    results = run_threads([lambda r=r: hosted(r) for r in range(2)])
    assert all(isinstance(r, tuple) for r in results), results
    close_all(results)

    job = f"guard-{os.getpid()}-{time.monotonic_ns()}"

    def by_file(rank: int, secret: bytes, timeout: float = DEADLINE) -> Any:
        info = LaunchInfo(rank, 2, rank, 2, "127.0.0.1", None, "openmpi", job)
        return rendezvous(info, timeout=timeout, rdzv_dir=str(tmp_path), secret=secret)

    results = run_threads([lambda r=r: by_file(r, SECRET) for r in range(2)])
    assert all(isinstance(r, tuple) for r in results), results
    assert results[0][1].requires_secret
    close_all(results)

    # a rank with the wrong secret is told so at once instead of polling the file until the deadline
    job = job + "-wrong"
    start = time.monotonic()
    results = run_threads([lambda: by_file(0, SECRET, 3.0), lambda: by_file(1, WRONG, DEADLINE)])
    assert isinstance(results[1], InvalidUsageError) and "did not match" in str(results[1]), results
    assert isinstance(results[0], CollectiveTimeoutError), results
    assert time.monotonic() - start < 10.0
    close_all(results)


def test_init_uses_pycoll_secret(monkeypatch):
    import pycoll

    monkeypatch.setenv("PYCOLL_SECRET", SECRET.decode())
    comm = pycoll.init(rank=0, world_size=1, timeout=DEADLINE, set_default=False)
    try:
        servers = [o for o in comm._owned if isinstance(o, TCPStoreServer)]
        assert len(servers) == 1 and servers[0].requires_secret
        with pytest.raises(InvalidUsageError, match="requires a rendezvous secret"):
            TCPStoreClient("127.0.0.1", servers[0].port, timeout=DEADLINE)
        with TCPStoreClient("127.0.0.1", servers[0].port, timeout=DEADLINE, secret=SECRET) as c:
            c.set("k", b"v")
    finally:
        pycoll.finalize(comm)
