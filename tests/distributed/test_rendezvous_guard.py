"""A live job keeps running, with correct results, while its rendezvous store is attacked.

Three ranks loop over all-reduces (checked against the closed form) and use the store between them
(counters, and fresh connections that go through the handshake again), while a thread of the test
process throws at the store's port: random bytes, an oversized length, a partial handshake that stalls,
a connection that never sends, clients with the wrong secret or none, an unknown op, and a burst of
garbage connections. The store (hosted by this process, as ``RankPool`` does) must drop and log every
attacker, and no one else, and serve the job throughout. Then ``pycoll run`` with PYCOLL_SECRET: the
job works, and a rank whose secret differs fails at once with a clear error.

No fixed ports; every wait has a deadline.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from harness import RankPool

import pycoll
from pycoll.bootstrap import TCPStoreClient
from pycoll.env import rendezvous_secret
from pycoll.errors import InvalidUsageError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "allreduce.py"
WORLD = 3
HANDSHAKE_TIMEOUT = 2.0
ATTACK_DEADLINE = 60.0
SIZES = (0, 1, 1000, 70_001)  # empty, one element, small, not divisible by the world and multi-segment
FLOOD = 30
MAGIC = b"pycoll-store/2"


# ---- rank side --------------------------------------------------------------------------------------------
def body_allreduce_while_attacked(comm, rank, world, port, max_iters):
    """All-reduces with rank-dependent inputs until the test says the attack is over (decided together:
    rank 0 reads the flag and a max all-reduce shares it, so every rank stops after the same iteration)."""
    secret = rendezvous_secret()
    store = TCPStoreClient("127.0.0.1", port, timeout=30.0, secret=secret)
    iters = reconnects = 0
    try:
        while True:
            n = SIZES[iters % len(SIZES)]
            x = np.arange(n, dtype=np.float64) * (rank + 1) + iters
            pycoll.allreduce(x, comm=comm)
            expected = np.arange(n, dtype=np.float64) * (world * (world + 1) // 2) + world * iters
            assert np.array_equal(x, expected), f"rank {rank}, iteration {iters}, {n} elements: wrong sum"
            store.add("guard/ops", 1)
            if iters % 5 == rank:  # a fresh connection, through the handshake, while under attack
                store.close()
                store = TCPStoreClient("127.0.0.1", port, timeout=30.0, secret=secret)
                reconnects += 1
            iters += 1
            flag = np.zeros(1)
            if rank == 0:
                flag[0] = 1.0 if store.check(["guard/attack_done"]) else (2.0 if iters >= max_iters else 0.0)
            pycoll.allreduce(flag, "max", comm=comm)
            if flag[0] == 2.0:
                raise AssertionError(f"the attack did not finish within {max_iters} iterations")
            if flag[0] == 1.0:
                return iters, reconnects
    finally:
        store.close()


# ---- attacker (test process) ------------------------------------------------------------------------------
def _frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def _hello(auth: int) -> bytes:
    return _frame(b"\x00" + struct.pack(">I", len(MAGIC)) + MAGIC + bytes([auth]))


def _wait_closed(sock: socket.socket, deadline: float) -> bool:
    """True once the server has closed ``sock`` (before ``deadline``)."""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except OSError:  # timed out
        return False


class Attacker:
    def __init__(self, port: int, secret: bytes | None) -> None:
        self.port = port
        self.secret = secret
        self.addresses: list[str] = []  # the local address of every raw attacking socket
        self.expected_drops = 0
        self.error: BaseException | None = None
        self.notes: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._main, name="store-attacker", daemon=True)

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10.0)
        host, port = sock.getsockname()[:2]
        self.addresses.append(f"{host}:{port}")
        self.expected_drops += 1
        return sock

    def _legit(self) -> TCPStoreClient:
        return TCPStoreClient("127.0.0.1", self.port, timeout=30.0, secret=self.secret)

    def _main(self) -> None:
        try:
            self._attack()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            try:  # end the job's loop whatever happened (it checks this key)
                with self._legit() as c:
                    c.set("guard/attack_done", b"1")
            except Exception as exc:  # noqa: BLE001
                self.error = self.error or exc

    def _attack(self) -> None:
        deadline = time.monotonic() + ATTACK_DEADLINE
        with self._legit() as c:  # start once every rank is in its loop: a live job
            while c.add("guard/ops", 0) < 2 * WORLD:
                assert time.monotonic() < deadline, "the job never started its loop"
                time.sleep(0.01)
        auth = int(self.secret is not None)

        stalled = [self._connect(), self._connect()]  # one never sends; one sends half a HELLO and stalls
        stalled[1].sendall(_hello(auth)[:7])
        stalled_at = time.monotonic()

        # While they hold their connections, a legitimate client is served at once (not once they are gone).
        with self._legit() as c:
            c.set("guard/probe", b"1")
            assert c.get("guard/probe") == b"1"
        self.notes["legit_latency"] = time.monotonic() - stalled_at

        with self._connect() as sock:  # random bytes
            sock.sendall(random.Random(1).randbytes(8192))
            assert _wait_closed(sock, deadline), "random bytes were not dropped"
        with self._connect() as sock:  # a length far past any frame
            sock.sendall(struct.pack(">I", 0xFFFFFFF0) + b"x" * 64)
            assert _wait_closed(sock, deadline), "an oversized length was not dropped"
        with self._connect() as sock:  # HELLO, then an unknown op (instead of AUTH, with a secret)
            sock.sendall(_hello(auth))
            sock.recv(1024)
            sock.sendall(_frame(b"\x63" + b"boo"))
            assert _wait_closed(sock, deadline), "an unknown op was not dropped"

        wrong = b"not-the-job-secret" if self.secret is None else self.secret + b"-but-wrong"
        for bad_secret in (wrong, None) if self.secret is not None else (wrong,):
            self.expected_drops += 1
            try:
                TCPStoreClient("127.0.0.1", self.port, timeout=10.0, secret=bad_secret).close()
            except InvalidUsageError as exc:
                self.notes.setdefault("client_errors", []).append(str(exc))
            else:
                raise AssertionError(f"a client with secret {bad_secret is not None} was let in")

        for _ in range(FLOOD):
            with self._connect() as sock:
                try:
                    sock.sendall(b"\xff" * 16)
                except OSError:
                    pass
                assert _wait_closed(sock, deadline), "a garbage connection was not dropped"

        for sock in stalled:
            with sock:
                assert _wait_closed(sock, deadline), "a stalled handshake was not dropped"
        self.notes["stall_dropped_after"] = time.monotonic() - stalled_at


@pytest.mark.parametrize("with_secret", [True, False], ids=["secret", "no_secret"])
def test_live_job_survives_attacks_on_its_store(with_secret, caplog):
    caplog.set_level(logging.WARNING, logger="pycoll")
    job_secret = secrets.token_hex(16) if with_secret else ""
    with RankPool(
        WORLD, env={"PYCOLL_SECRET": job_secret}, store_kwargs={"handshake_timeout": HANDSHAKE_TIMEOUT}
    ) as pool:
        store = pool.store
        assert store.requires_secret == with_secret
        attacker = Attacker(store.port, job_secret.encode() or None)
        attacker.thread.start()
        try:
            results = pool.run(body_allreduce_while_attacked, store.port, 100_000, timeout=120.0)
        finally:
            attacker.thread.join(ATTACK_DEADLINE + 10.0)
        assert not attacker.thread.is_alive()
        if attacker.error is not None:
            raise attacker.error
        # every rank finished the same iterations with correct sums (checked on the ranks), several per size
        iters = {r[0] for r in results}
        assert len(iters) == 1 and iters.pop() >= 2 * len(SIZES), results
        assert all(r[1] >= 1 for r in results), results
        # the job's own clients were served throughout, and at once
        assert attacker.notes["legit_latency"] < HANDSHAKE_TIMEOUT, attacker.notes
        assert attacker.notes["stall_dropped_after"] < HANDSHAKE_TIMEOUT + 10.0, attacker.notes
        # every attacker, and no one else, was dropped and logged by its address
        deadline = time.monotonic() + 10.0
        while store.rejected_connections < attacker.expected_drops and time.monotonic() < deadline:
            time.sleep(0.01)
        assert store.rejected_connections == attacker.expected_drops
        warnings = [r.getMessage() for r in caplog.records if "dropped the connection from" in r.getMessage()]
        assert len(warnings) == attacker.expected_drops, warnings
        for address in attacker.addresses:
            assert any(f"from {address}:" in w for w in warnings), (address, warnings)
        errors = attacker.notes["client_errors"]
        assert len(errors) == (2 if with_secret else 1)
        assert ("did not match" if with_secret else "has none") in errors[0]
        if job_secret:
            assert job_secret not in caplog.text and all(job_secret not in e for e in errors)


# ---- pycoll run -------------------------------------------------------------------------------------------
def _run(cmd: list[str], env_extra: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(env_extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def test_pycoll_run_with_secret() -> None:
    secret = secrets.token_hex(16)
    proc = _run(
        [sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(EXAMPLE)], {"PYCOLL_SECRET": secret}
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    for r in range(WORLD):
        assert f"rank {r} of {WORLD}: allreduce ok" in proc.stdout, proc.stdout + proc.stderr
    assert secret not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        ("os.environ['PYCOLL_SECRET'] += '-but-wrong'", "the rendezvous secret did not match"),
        ("del os.environ['PYCOLL_SECRET']", "requires a rendezvous secret, but this process has none"),
    ],
    ids=["wrong_secret", "no_secret"],
)
def test_pycoll_run_rank_with_another_secret_fails_clearly(tmp_path: Path, change: str, message: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(
        "import os\n"
        "import pycoll\n"
        "if os.environ['RANK'] == '1':\n"
        f"    {change}\n"
        "pycoll.init(timeout=30)\n"
        "pycoll.barrier()\n"
        "pycoll.finalize()\n"
    )
    secret = secrets.token_hex(16)
    start = time.monotonic()
    proc = _run(
        [sys.executable, "-m", "pycoll.run", "-n", str(WORLD), str(script)], {"PYCOLL_SECRET": secret}
    )
    assert proc.returncode != 0
    assert time.monotonic() - start < 25.0  # rank 1 fails at once; nobody waits for the 30 s deadline
    assert message in proc.stderr and "rank 1" in proc.stderr, proc.stderr
    assert secret not in proc.stdout + proc.stderr
