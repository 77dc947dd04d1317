"""Bootstrap: the TCP rendezvous store, launch-environment parsing and rendezvous.

Every wait has a deadline and no test uses a fixed port (servers bind port 0; where a test needs a port
before its server exists, it asks the kernel for a free one).
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import _threads
import pytest

from pycoll.bootstrap.env import (
    LaunchInfo,
    detect_launch,
    explicit_launch,
    launcher_hosts_store,
    parse_slurm_tasks_per_node,
)
from pycoll.bootstrap.rendezvous import rendezvous, rendezvous_file_path, store_barrier
from pycoll.bootstrap.store import (
    PrefixStore,
    Store,
    TCPStoreClient,
    TCPStoreServer,
    TorchStoreAdapter,
)
from pycoll.errors import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    InvalidUsageError,
    PeerFailedError,
    PeerLostError,
)

ROOT = Path(__file__).resolve().parents[2]

# Child processes get this prelude; pycoll's API loads lazily, so pycoll.bootstrap imports without
# the native module.
IMPORT_SHIM = "import sys\n"
DEADLINE = 20.0  # upper bound for anything that should take well under a second


@pytest.fixture
def server():
    srv = TCPStoreServer("127.0.0.1", 0)
    yield srv
    srv.close()


@pytest.fixture
def client(server):
    c = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
    yield c
    c.close()


def free_port() -> int:
    """A port the kernel says is free now (for tests that need a port before the server exists)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_threads(fns: list[Any], timeout: float = DEADLINE) -> list[Any]:
    return _threads.run_threads(fns, timeout)


# --------------------------------------------------------------------------------------------------
# Store


def test_set_get_add_delete_check(client):
    assert isinstance(client, Store)
    client.set("a", b"\x00\x01binary")
    assert client.get("a") == b"\x00\x01binary"
    client.set("a", b"")
    assert client.get("a") == b""
    assert client.add("n", 5) == 5
    assert client.add("n", -2) == 3
    assert client.get("n") == b"3"
    assert client.check(["a", "n"]) and not client.check(["a", "missing"])
    assert client.delete("a") is True
    assert client.delete("a") is False
    client.set("ключ", b"unicode key")
    assert client.get("ключ") == b"unicode key"
    big = os.urandom(3 * 1024 * 1024)
    client.set("big", big)
    assert client.get("big") == big


def test_multi_get_answers_every_value_at_once_when_the_last_key_is_set(server, client):
    """One request for a round's table: parked until the last key exists, values in the keys' order;
    a timeout names the keys still missing; the same through PrefixStore and FailFastStore, and get_many
    falls back to one get per key on a store without it."""
    from pycoll.bootstrap.failfast import FailFastStore
    from pycoll.bootstrap.store.adapters import get_many

    keys = [f"k{i}" for i in range(50)]
    for k in keys[:-1]:
        client.set(k, k.encode() * 3)
    other = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
    try:
        setter = threading.Timer(0.3, lambda: other.set(keys[-1], b"last"))
        setter.start()
        start = time.monotonic()
        values = client.multi_get(keys, timeout=DEADLINE)
        assert 0.25 < time.monotonic() - start < DEADLINE
        assert values == [k.encode() * 3 for k in keys[:-1]] + [b"last"]
        with pytest.raises(CollectiveTimeoutError, match="nope"):
            client.multi_get(["k1", "nope"], timeout=0.2)
        assert client.get("k1") == b"k1k1k1"  # the stream is still in sync after a timeout
        prefixed = PrefixStore(client, "p")
        prefixed.set("a", b"1")
        prefixed.set("b", b"2")
        assert prefixed.multi_get(["b", "a"]) == [b"2", b"1"]
        watched = FailFastStore(prefixed, "failure", rank=0, timeout=DEADLINE)
        assert watched.multi_get(["a", "b"], timeout=1.0) == [b"1", b"2"]

        class Plain:  # the Store interface without multi_get
            def get(self, key, timeout=None):
                return client.get(key, timeout)

        assert get_many(Plain(), ["k2", "k3"], 1.0) == [b"k2k2k2", b"k3k3k3"]  # type: ignore[arg-type]
    finally:
        other.close()


def test_add_on_non_integer_is_usage_error(client):
    client.set("s", b"hello")
    with pytest.raises(InvalidUsageError, match="'s'"):
        client.add("s", 1)
    assert client.get("s") == b"hello"  # connection still usable


def test_get_timeout_names_key_address_and_duration(server, client):
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        client.get("never-set", timeout=0.3)
    elapsed = time.monotonic() - start
    assert 0.25 < elapsed < 5.0
    msg = str(info.value)
    assert "never-set" in msg and f"127.0.0.1:{server.port}" in msg and "0.3" in msg
    client.set("after", b"1")  # the stream is still in sync after a timeout
    assert client.get("after", timeout=0) == b"1"


def test_zero_timeout_is_a_check(client):
    with pytest.raises(CollectiveTimeoutError):
        client.get("x", timeout=0)
    client.set("x", b"v")
    assert client.get("x", timeout=0) == b"v"


def test_wait_names_only_missing_keys(client):
    client.set("k1", b"1")
    with pytest.raises(CollectiveTimeoutError) as info:
        client.wait(["k1", "k2", "k3"], timeout=0.2)
    msg = str(info.value)
    assert "k2" in msg and "k3" in msg and "'k1'" not in msg
    client.set("k2", b"1")
    client.set("k3", b"1")
    client.wait(["k1", "k2", "k3"], timeout=1.0)


def test_blocking_get_woken_by_set_from_thread(server, client):
    def setter() -> None:
        time.sleep(0.2)
        with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as other:
            other.set("late", b"value")

    t = threading.Thread(target=setter, daemon=True)
    t.start()
    start = time.monotonic()
    assert client.get("late", timeout=DEADLINE) == b"value"
    assert 0.15 < time.monotonic() - start < 5.0
    t.join(DEADLINE)


def test_wait_woken_by_add_from_thread(server, client):
    def adder() -> None:
        time.sleep(0.1)
        with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as other:
            other.set("a", b"1")
            time.sleep(0.1)
            other.add("b", 1)

    t = threading.Thread(target=adder, daemon=True)
    t.start()
    client.wait(["a", "b"], timeout=DEADLINE)
    assert client.get("b") == b"1"
    t.join(DEADLINE)


def test_blocking_get_woken_by_set_from_other_process(server, client):
    code = IMPORT_SHIM + textwrap.dedent(
        f"""
        import time
        from pycoll.bootstrap.store import TCPStoreClient
        time.sleep(0.2)
        TCPStoreClient("127.0.0.1", {server.port}, timeout=10).set("from-child", b"hi")
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", code], env=child_env())
    try:
        assert client.get("from-child", timeout=DEADLINE) == b"hi"
        assert proc.wait(timeout=DEADLINE) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=DEADLINE)


def test_many_clients(server):
    def worker() -> int:
        with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as c:
            for _ in range(20):
                c.add("counter", 1)
            return int(c.get("counter"))

    results = run_threads([worker] * 16)
    assert all(isinstance(r, int) for r in results), results
    with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as c:
        assert c.get("counter") == b"320"


def test_client_shared_by_threads(server, client):
    results = run_threads([lambda i=i: client.add("shared", i) for i in range(10)])
    assert all(isinstance(r, int) for r in results), results
    assert client.get("shared") == str(sum(range(10))).encode()


def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def raw_connection(port: int) -> socket.socket:
    """A plain socket past the store's handshake (no secret), for tests that send hand-made frames."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
    magic = b"pycoll-store/2"
    raw.sendall(_frame(b"\x00" + struct.pack(">I", len(magic)) + magic + b"\x00"))
    expected = _frame(b"\x00" + struct.pack(">I", len(magic)) + magic + b"\x00" + struct.pack(">I", 0))
    data = b""
    while len(data) < len(expected):
        chunk = raw.recv(len(expected) - len(data))
        assert chunk, "the store hung up during the handshake"
        data += chunk
    assert data == expected
    return raw


BAD_INPUTS = {
    "garbage": b"\xde\xad\xbe\xef" * 64,
    "zero_length": struct.pack(">I", 0) + b"xxxx",
    "huge_length": struct.pack(">I", 0xFFFFFFF0) + b"x" * 16,
    "unknown_op": _frame(b"\x63hello"),
    "bad_magic": _frame(b"\x00" + struct.pack(">I", 3) + b"abc"),
    "key_past_end": _frame(b"\x01" + struct.pack(">I", 1000) + b"short"),
    "bad_utf8_key": _frame(b"\x01" + struct.pack(">I", 2) + b"\xff\xfe" + struct.pack(">I", 0)),
    "trailing_bytes": _frame(b"\x05" + struct.pack(">I", 1) + b"k" + b"extra"),
    "nan_deadline": _frame(b"\x02" + struct.pack(">I", 1) + b"k" + struct.pack(">d", float("nan"))),
}


@pytest.mark.parametrize("handshake", [False, True], ids=["before_handshake", "after_handshake"])
@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
def test_server_drops_bad_client_and_keeps_serving(server, client, name, handshake):
    client.set("before", b"1")
    connect = raw_connection if handshake else lambda port: socket.create_connection(("127.0.0.1", port))
    with connect(server.port) as bad:
        bad.sendall(BAD_INPUTS[name])
        bad.settimeout(DEADLINE)
        try:
            assert bad.recv(1024) == b""  # the server hung up on it
        except ConnectionResetError:
            pass
    assert client.get("before") == b"1"
    client.set("after", b"2")
    with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as fresh:
        assert fresh.get("after") == b"2"
    assert server.rejected_connections == 1


def test_truncated_frame_does_not_block_others(server, client):
    # A client that sends half a frame and then stalls (or leaves) must not hold anyone up.
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE)
    try:
        stalled.sendall(struct.pack(">I", 100) + b"\x01" + b"x" * 10)
        client.set("k", b"v")
        assert client.get("k") == b"v"
    finally:
        stalled.close()
    gone = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE)
    gone.sendall(struct.pack(">I", 50) + b"\x01abc")
    gone.close()
    assert client.add("c", 1) == 1


def test_waiting_client_that_disconnects(server, client):
    # A raw client parks a GET on "w" and vanishes; a real waiter on the same key must still be woken.
    raw = raw_connection(server.port)
    raw.sendall(_frame(b"\x02" + struct.pack(">I", 1) + b"w" + struct.pack(">d", 30.0)))
    time.sleep(0.05)
    raw.close()

    def setter() -> None:
        time.sleep(0.2)
        with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as c:
            c.set("w", b"ok")

    t = threading.Thread(target=setter, daemon=True)
    t.start()
    assert client.get("w", timeout=DEADLINE) == b"ok"
    t.join(DEADLINE)


def test_pipelined_requests_answered_in_order(server):
    # Two requests in one write; the first blocks until the key exists, the second follows it.
    raw = raw_connection(server.port)
    try:
        get = _frame(b"\x02" + struct.pack(">I", 1) + b"p" + struct.pack(">d", 10.0))
        add = _frame(b"\x03" + struct.pack(">I", 1) + b"q" + struct.pack(">q", 7))
        raw.sendall(get + add)
        with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as c:
            c.set("p", b"val")
        data = b""
        while len(data) < 4 + 1 + 4 + 3 + 4 + 1 + 8:
            chunk = raw.recv(4096)
            assert chunk
            data += chunk
        assert data[4:].startswith(b"\x00" + struct.pack(">I", 3) + b"val")
        assert data.endswith(b"\x00" + struct.pack(">q", 7))
    finally:
        raw.close()


def test_server_close_raises_peer_lost(server):
    c1 = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
    c2 = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
    c1.set("x", b"1")
    results = run_threads(
        [lambda: c2.get("never", timeout=DEADLINE), lambda: (time.sleep(0.2), server.close())]
    )
    assert isinstance(results[0], PeerLostError), results
    with pytest.raises(PeerLostError) as info:
        c1.get("x")
    assert info.value.rank == 0
    assert f"127.0.0.1:{server.port}" in str(info.value) and "closed the connection" in str(info.value)
    with pytest.raises(PeerLostError):
        c1.set("y", b"2")
    c1.close()
    c2.close()


def test_close_drains_clients_first():
    srv = TCPStoreServer("127.0.0.1", 0)
    c = TCPStoreClient("127.0.0.1", srv.port, timeout=DEADLINE)
    assert srv.num_clients == 1
    t = threading.Timer(0.2, c.close)
    t.start()
    start = time.monotonic()
    srv.close(drain_timeout=DEADLINE)
    assert 0.1 < time.monotonic() - start < 5.0
    t.join(DEADLINE)
    # a client that never leaves only delays close by the drain timeout
    srv = TCPStoreServer("127.0.0.1", 0)
    stuck = TCPStoreClient("127.0.0.1", srv.port, timeout=DEADLINE)
    start = time.monotonic()
    srv.close(drain_timeout=0.2)
    assert 0.15 < time.monotonic() - start < 5.0
    with pytest.raises(PeerLostError):
        stuck.get("k")


def test_client_retries_until_server_starts():
    port = free_port()
    holder: dict[str, TCPStoreServer] = {}

    def start_later() -> None:
        time.sleep(0.3)
        holder["s"] = TCPStoreServer("127.0.0.1", port)

    t = threading.Thread(target=start_later, daemon=True)
    t.start()
    try:
        with TCPStoreClient("127.0.0.1", port, timeout=DEADLINE) as c:
            c.set("k", b"v")
            assert c.get("k") == b"v"
    finally:
        t.join(DEADLINE)
        if "s" in holder:
            holder["s"].close()


def test_connect_deadline():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError) as info:
        TCPStoreClient("127.0.0.1", port, timeout=0.5)
    assert time.monotonic() - start < 5.0
    assert f"127.0.0.1:{port}" in str(info.value)


def test_connect_to_something_else():
    # A server that is not a pycoll store (answers garbage) is reported as such, at the deadline.
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(CollectiveTimeoutError, match="did not answer as a pycoll store"):
            TCPStoreClient("127.0.0.1", port, timeout=0.5)
    finally:
        stop.set()
        t.join(DEADLINE)
        listener.close()


def test_bad_timeouts_and_closed_client(server):
    c = TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE)
    with pytest.raises(InvalidUsageError):
        c.get("k", timeout=-1)
    c.close()
    with pytest.raises(InvalidUsageError, match="closed"):
        c.set("k", b"v")


def test_port_in_use_is_usage_error(server):
    with pytest.raises(InvalidUsageError, match=str(server.port)):
        TCPStoreServer("127.0.0.1", server.port)


def test_server_that_fails_to_start_gives_its_port_back(monkeypatch):
    """Out of descriptors after listening: the listener is closed at once (the port is free again)."""
    listeners: list[socket.socket] = []
    create_server = socket.create_server

    def recording_create_server(*args: Any, **kwargs: Any) -> socket.socket:
        sock = create_server(*args, **kwargs)
        listeners.append(sock)
        return sock

    def no_descriptors(*args: Any, **kwargs: Any) -> Any:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(socket, "create_server", recording_create_server)
    monkeypatch.setattr(socket, "socketpair", no_descriptors)
    with pytest.raises(OSError, match="Too many open files"):
        TCPStoreServer("127.0.0.1", 0)
    assert len(listeners) == 1 and listeners[0].fileno() == -1


def test_prefix_store(client):
    a = PrefixStore(client, "job/a")
    b = PrefixStore(client, "job/b")
    a.set("k", b"A")
    b.set("k", b"B")
    assert a.get("k") == b"A" and b.get("k") == b"B"
    assert client.get("job/a/k") == b"A"
    assert a.add("n", 2) == 2 and b.add("n", 5) == 5
    a.wait(["k", "n"], timeout=1)
    with pytest.raises(CollectiveTimeoutError, match="job/a/missing"):
        a.wait(["missing"], timeout=0.1)
    assert a.check(["k"]) and not a.check(["zz"])
    assert a.delete("k") and not client.check(["job/a/k"]) and client.check(["job/b/k"])
    a.close()  # does not own the client
    assert client.get("job/b/k") == b"B"
    assert isinstance(a, Store)


class FakeTorchStore:
    """The subset of torch.distributed.Store the adapter uses (values come back as bytes)."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes | str) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else bytes(value)

    def get(self, key: str) -> bytes:
        if key not in self.data:
            raise RuntimeError("Socket Timeout")
        return self.data[key]

    def add(self, key: str, amount: int) -> int:
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        if not all(k in self.data for k in keys):
            raise RuntimeError(f"Wait timeout after {timeout}")

    def check(self, keys: list[str]) -> bool:
        return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        return self.data.pop(key, None) is not None


def test_torch_store_adapter():
    fake = FakeTorchStore()
    s = TorchStoreAdapter(fake)
    assert isinstance(s, Store)
    s.set("k", b"v")
    assert s.get("k") == b"v" and s.get("k", timeout=1.0) == b"v"
    assert s.add("n", 3) == 3 and s.add("n", 1) == 4
    s.wait(["k", "n"], timeout=1.0)
    assert s.check(["k"]) and not s.check(["x"])
    with pytest.raises(CollectiveTimeoutError, match="'x'"):
        s.get("x", timeout=0.1)
    with pytest.raises(CollectiveTimeoutError, match="'x'"):
        s.get("x")
    assert s.delete("k") and not s.delete("k")
    s.close()
    # the barrier helper works over it too
    store_barrier(s, "b", 0, 1, timeout=1.0)


# --------------------------------------------------------------------------------------------------
# Launch environments


def test_detect_nothing():
    assert detect_launch({}) is None
    assert detect_launch({"PATH": "/bin", "SLURM_JOB_ID": "5"}) is None


def test_detect_torchrun():
    env = {
        "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
        "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc",
    }  # fmt: skip
    assert detect_launch(env) == LaunchInfo(5, 8, 1, 4, "node0", 29500, "torchrun", "abc")


def test_detect_torch_style_by_hand():
    info = detect_launch({"RANK": "2", "WORLD_SIZE": "3"})
    assert info == LaunchInfo(2, 3, 2, 3, "127.0.0.1", None, "torchrun", None)
    assert info.single_host


def test_detect_openmpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
        "OMPI_MCA_ess_base_jobid": "123456", "PMIX_NAMESPACE": "prterun-host-1@1",
    }  # fmt: skip
    assert detect_launch(env) == LaunchInfo(3, 4, 3, 4, "127.0.0.1", None, "openmpi", "123456")
    del env["OMPI_MCA_ess_base_jobid"]
    info = detect_launch(env)
    assert info is not None and info.job_id == "prterun-host-1@1"
    env.update(MASTER_ADDR="10.0.0.1", MASTER_PORT="1234")
    info = detect_launch(env)
    assert info is not None and (info.master_addr, info.master_port) == ("10.0.0.1", 1234)


def test_openmpi_wins_over_inherited_slurm():
    env = {
        "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
        "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "9",
    }  # fmt: skip
    info = detect_launch(env)
    assert info is not None and info.launcher == "openmpi" and info.rank == 1


def test_detect_slurm():
    env = {
        "SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0", "SLURM_NODEID": "3",
        "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
    }  # fmt: skip
    expected = LaunchInfo(6, 7, 0, 1, "127.0.0.1", None, "slurm", "4242.0", node_rank=3)
    assert detect_launch(env) == expected
    env["SLURM_NTASKS_PER_NODE"] = "2"
    env["SLURM_NTASKS"] = "8"
    env["SLURM_PROCID"] = "7"
    env["SLURM_LOCALID"] = "1"
    info = detect_launch(env)
    assert info is not None and (info.local_rank, info.local_world_size) == (1, 2)
    env.update(MASTER_ADDR="head", MASTER_PORT="5000")
    info = detect_launch(env)
    assert info is not None and (info.master_addr, info.master_port) == ("head", 5000)


def test_slurm_tasks_per_node_parsing():
    assert parse_slurm_tasks_per_node("4") == [4]
    assert parse_slurm_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(InvalidUsageError, match="SLURM_TASKS_PER_NODE"):
        parse_slurm_tasks_per_node("two")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"RANK": "abc", "WORLD_SIZE": "4"}, ["RANK", "abc"]),
        ({"RANK": "4", "WORLD_SIZE": "4"}, ["RANK=4", "WORLD_SIZE=4"]),
        ({"RANK": "-1", "WORLD_SIZE": "4"}, ["RANK", "-1"]),
        ({"RANK": "0", "WORLD_SIZE": "0"}, ["WORLD_SIZE", "0"]),
        ({"RANK": "0"}, ["WORLD_SIZE"]),
        ({"WORLD_SIZE": "2"}, ["RANK"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, ["LOCAL_RANK=2"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3"}, ["LOCAL_WORLD_SIZE=3"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, ["MASTER_PORT", "70000"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "x1"}, ["MASTER_PORT", "x1"]),
        ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "2"}, ["OMPI_COMM_WORLD_RANK=2"]),
        ({"OMPI_COMM_WORLD_RANK": "0"}, ["OMPI_COMM_WORLD_SIZE"]),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "z"}, ["SLURM_NTASKS", "z"]),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "5"},
         ["SLURM_NODEID"]),
    ],
)  # fmt: skip
def test_detect_errors_name_variable_and_value(env, names):
    with pytest.raises(InvalidUsageError) as info:
        detect_launch(env)
    for name in names:
        assert name in str(info.value)


def test_explicit_launch_and_validation():
    info = explicit_launch(1, 2, master_port=1234)
    assert info == LaunchInfo(1, 2, 1, 2, "127.0.0.1", 1234, "explicit", None)
    with pytest.raises(InvalidUsageError):
        explicit_launch(2, 2)
    with pytest.raises(InvalidUsageError):
        explicit_launch(0, 2, master_port=0)


def test_launcher_hosts_store():
    assert launcher_hosts_store({"PYCOLL_LAUNCHER_STORE": "1"})
    assert not launcher_hosts_store({"PYCOLL_LAUNCHER_STORE": "0"})
    assert not launcher_hosts_store({})


# --------------------------------------------------------------------------------------------------
# Rendezvous


def _close(pair: tuple[Any, TCPStoreServer | None]) -> None:
    store, srv = pair
    store.close()
    if srv is not None:
        srv.close()


def test_store_barrier_reusable(server):
    world = 3
    log: list[tuple[int, int]] = []

    def body(rank: int) -> None:
        with TCPStoreClient("127.0.0.1", server.port, timeout=DEADLINE) as c:
            for round_ in range(3):
                log.append((round_, rank))
                store_barrier(c, "bar", rank, world, timeout=DEADLINE)

    results = run_threads([lambda r=r: body(r) for r in range(world)])
    assert results == [None] * world
    rounds = [r for r, _ in log]
    assert rounds == sorted(rounds)  # nobody entered round k+1 before all entered round k


def test_store_barrier_timeout_names_missing_ranks(client):
    with pytest.raises(CollectiveTimeoutError) as info:
        store_barrier(client, "lonely", 1, 4, timeout=0.2)
    msg = str(info.value)
    assert "ranks 0, 2, 3 of 4" in msg and "rank 1" in msg


def test_rendezvous_single_process():
    store, srv = rendezvous(explicit_launch(0, 1), timeout=DEADLINE)
    try:
        assert srv is not None
        store.set("k", b"v")
        assert store.get("k") == b"v"
    finally:
        _close((store, srv))


def test_rendezvous_master_port_threads():
    port = free_port()
    world = 3
    results = run_threads(
        [
            lambda r=r: rendezvous(explicit_launch(r, world, "127.0.0.1", port), timeout=DEADLINE)
            for r in range(world)
        ]
    )
    try:
        assert all(isinstance(r, tuple) for r in results), results
        assert results[0][1] is not None and results[0][1].port == port
        assert results[1][1] is None and results[2][1] is None
        results[2][0].set("hello", b"from 2")
        assert results[0][0].get("hello") == b"from 2"
    finally:
        for r in results[::-1]:
            if isinstance(r, tuple):
                _close(r)


def test_rendezvous_launcher_hosted_store(server):
    world = 3

    def join(rank: int) -> Any:
        info = explicit_launch(rank, world, "127.0.0.1", server.port)
        return rendezvous(info, timeout=DEADLINE, store_hosted_externally=True)

    results = run_threads([lambda r=r: join(r) for r in range(world)])
    assert all(isinstance(r, tuple) and r[1] is None for r in results), results
    for r in results:
        _close(r)
    # a second round on the same long-lived store (init, finalize, init again) works as well
    results = run_threads([lambda r=r: join(r) for r in range(world)])
    assert all(isinstance(r, tuple) and r[1] is None for r in results), results
    for r in results:
        _close(r)


def test_rendezvous_timeout_names_missing_rank(server):
    def join(rank: int) -> Any:
        info = explicit_launch(rank, 3, "127.0.0.1", server.port)
        return rendezvous(info, timeout=1.0, store_hosted_externally=True)

    start = time.monotonic()
    results = run_threads([lambda: join(0), lambda: join(1)])
    assert time.monotonic() - start < 10
    for r in results:
        assert isinstance(r, CollectiveTimeoutError), r
        assert "rank 2 of 3 has not arrived" in str(r)


def test_rendezvous_rank0_missing_is_named(server):
    info = explicit_launch(1, 2, "127.0.0.1", server.port)
    with pytest.raises(CollectiveTimeoutError, match="rank 0 has not joined"):
        rendezvous(info, timeout=0.3, store_hosted_externally=True)


def test_rendezvous_world_size_mismatch(server):
    def join(rank: int, world: int) -> Any:
        info = explicit_launch(rank, world, "127.0.0.1", server.port)
        return rendezvous(info, timeout=1.0, store_hosted_externally=True)

    results = run_threads([lambda: join(0, 2), lambda: join(1, 3)])
    assert isinstance(results[1], CollectiveMismatchError), results
    assert "world size 3" in str(results[1]) and "2" in str(results[1])
    # Rank 0 was waiting for rank 1, which said why it left (pycoll/bootstrap/failfast.py).
    assert isinstance(results[0], PeerFailedError) and results[0].rank == 1, results
    assert "rank 1 failed during rendezvous (CollectiveMismatchError: " in str(results[0])


def test_rendezvous_usage_errors(tmp_path):
    info = LaunchInfo(1, 4, 1, 4, "127.0.0.1", None, "openmpi", None)
    with pytest.raises(InvalidUsageError, match="MASTER_PORT"):
        rendezvous(info, timeout=1)
    multi_host = LaunchInfo(1, 4, 1, 2, "127.0.0.1", None, "slurm", "77.0")
    with pytest.raises(InvalidUsageError, match="several hosts"):
        rendezvous(multi_host, timeout=1, rdzv_dir=str(tmp_path))
    with pytest.raises(InvalidUsageError, match="MASTER_PORT"):
        rendezvous(LaunchInfo(0, 2, 0, 2, "127.0.0.1", None, "torchrun", None), timeout=1,
                   store_hosted_externally=True)  # fmt: skip


def test_file_rendezvous_four_processes(tmp_path):
    job_id = f"test-{uuid.uuid4().hex}"
    world = 4
    code = IMPORT_SHIM + textwrap.dedent(
        f"""
        import os, sys
        from pycoll.bootstrap.env import detect_launch
        from pycoll.bootstrap.rendezvous import rendezvous, store_barrier
        info = detect_launch()
        assert info.launcher == "openmpi" and info.master_port is None, info
        store, server = rendezvous(info, timeout=20, rdzv_dir={str(tmp_path)!r})
        assert (server is not None) == (info.rank == 0)
        store.add("sum", info.rank + 1)
        store_barrier(store, "after", info.rank, info.world_size, timeout=20)
        total = int(store.get("sum"))
        store_barrier(store, "done", info.rank, info.world_size, timeout=20)
        with open(os.path.join({str(tmp_path)!r}, f"out{{info.rank}}"), "w") as f:
            f.write(str(total))
        store.close()
        if server is not None:
            server.close(drain_timeout=20)
        """
    )
    procs = []
    for rank in range(world):
        env = child_env()
        env.update(
            OMPI_COMM_WORLD_RANK=str(rank),
            OMPI_COMM_WORLD_SIZE=str(world),
            OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
            OMPI_COMM_WORLD_LOCAL_SIZE=str(world),
            OMPI_MCA_ess_base_jobid=job_id,
        )
        for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID"):
            env.pop(var, None)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE))
    try:
        for rank, p in enumerate(procs):
            _, err = p.communicate(timeout=DEADLINE + 10)
            assert p.returncode == 0, f"rank {rank} failed:\n{err.decode()}"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=DEADLINE)
    assert [(tmp_path / f"out{r}").read_text() for r in range(world)] == [str(1 + 2 + 3 + 4)] * world
    assert not os.path.exists(rendezvous_file_path(job_id, str(tmp_path)))
    assert not [p for p in os.listdir(tmp_path) if p.startswith((".pycoll", "pycoll"))]


def test_file_rendezvous_ignores_stale_file(tmp_path):
    job_id = f"stale-{uuid.uuid4().hex}"
    path = rendezvous_file_path(job_id, str(tmp_path))
    Path(path).write_text(f"127.0.0.1:{free_port()}\n")  # left behind by a killed earlier run
    world = 3

    def join(rank: int) -> Any:
        if rank == 0:
            time.sleep(0.3)  # the others read the stale file first
        info = LaunchInfo(rank, world, rank, world, "127.0.0.1", None, "slurm", job_id)
        return rendezvous(info, timeout=DEADLINE, rdzv_dir=str(tmp_path))

    results = run_threads([lambda r=r: join(r) for r in range(world)])
    try:
        assert all(isinstance(r, tuple) for r in results), results
        assert not os.path.exists(path)  # removed once everyone joined
    finally:
        for r in results[::-1]:
            if isinstance(r, tuple):
                _close(r)


def test_file_rendezvous_timeout_cleans_up(tmp_path):
    job_id = f"alone-{uuid.uuid4().hex}"
    info = LaunchInfo(0, 2, 0, 2, "127.0.0.1", None, "openmpi", job_id)
    start = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="rank 1 of 2"):
        rendezvous(info, timeout=1.0, rdzv_dir=str(tmp_path))
    assert time.monotonic() - start < 10
    assert not os.path.exists(rendezvous_file_path(job_id, str(tmp_path)))
    other = LaunchInfo(1, 2, 1, 2, "127.0.0.1", None, "openmpi", job_id)
    with pytest.raises(CollectiveTimeoutError, match="has not published"):
        rendezvous(other, timeout=0.3, rdzv_dir=str(tmp_path))


def test_rendezvous_file_path_is_per_user_and_sanitised(tmp_path):
    p = rendezvous_file_path("prterun-host-1@1/../x", str(tmp_path))
    assert os.path.dirname(p) == str(tmp_path)
    assert os.path.basename(p).startswith(f"pycoll-rdzv-{os.getuid()}-")
    assert "/" not in os.path.basename(p) and "@" not in os.path.basename(p)
    assert rendezvous_file_path("a") != rendezvous_file_path("b")


# --------------------------------------------------------------------------------------------------
# torchrun's agent store (a torch TCPStore already serving MASTER_PORT), with a stand-in for torch


class _FakeAgentTCPStore:
    """Duck-typed torch.distributed.TCPStore client: one shared dict per (host, port), blocking wait."""

    stores: dict[tuple[str, int], dict[str, bytes]] = {}
    cond = threading.Condition()

    def __init__(self, host: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: Any = None) -> None:  # fmt: skip
        assert not is_master, "with the agent store every rank must be a client"
        self.timeout = timeout
        with self.cond:
            self.data = self.stores.setdefault((host, port), {})

    def set(self, key: str, value: bytes) -> None:
        with self.cond:
            self.data[key] = bytes(value)
            self.cond.notify_all()

    def get(self, key: str) -> bytes:
        self.wait([key])
        with self.cond:
            return self.data[key]

    def add(self, key: str, amount: int) -> int:
        with self.cond:
            value = int(self.data.get(key, b"0")) + amount
            self.data[key] = str(value).encode()
            self.cond.notify_all()
            return value

    def wait(self, keys: list[str], timeout: Any = None) -> None:
        seconds = (timeout or self.timeout).total_seconds()
        with self.cond:
            if not self.cond.wait_for(lambda: all(k in self.data for k in keys), timeout=seconds):
                raise RuntimeError(f"Wait timeout for {keys}")

    def check(self, keys: list[str]) -> bool:
        with self.cond:
            return all(k in self.data for k in keys)

    def delete_key(self, key: str) -> bool:
        with self.cond:
            return self.data.pop(key, None) is not None


def test_detect_torchrun_agent_store():
    env = {
        "RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2",
    }  # fmt: skip
    info = detect_launch(env)
    assert info is not None and info.torch_agent_store and info.restart_count == 2
    env["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    info = detect_launch(env)
    assert info is not None and not info.torch_agent_store


def test_rendezvous_through_torchrun_agent_store(monkeypatch):
    import types

    torch = types.ModuleType("torch")
    dist = types.ModuleType("torch.distributed")
    dist.TCPStore = _FakeAgentTCPStore  # type: ignore[attr-defined]
    torch.distributed = dist  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    port = 40000 + os.getpid() % 1000  # never bound: the fake store only uses it as a dict key
    world = 3

    def join(rank: int) -> Any:
        info = LaunchInfo(rank, world, rank, world, "127.0.0.1", port, "torchrun", "run1",
                          torch_agent_store=True, restart_count=1)  # fmt: skip
        return rendezvous(info, timeout=DEADLINE)

    results = run_threads([lambda r=r: join(r) for r in range(world)])
    assert all(isinstance(r, tuple) and r[1] is None for r in results), results
    results[1][0].set("x", b"y")
    assert results[0][0].get("x") == b"y"
    keys = _FakeAgentTCPStore.stores[("127.0.0.1", port)]
    assert keys and all(k.startswith("pycoll/attempt1/") for k in keys)
    for r in results:
        _close(r)


def test_torchrun_agent_store_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)  # an earlier test may have imported it
    info = LaunchInfo(0, 2, 0, 2, "127.0.0.1", 29500, "torchrun", None, torch_agent_store=True)
    with pytest.raises(InvalidUsageError, match="TORCHELASTIC_USE_AGENT_STORE"):
        rendezvous(info, timeout=1)
