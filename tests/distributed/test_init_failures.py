"""A rank whose ``pycoll.init`` fails once it has reached the rendezvous store tells the others through
it: they raise PeerFailedError within a fraction of a second, naming that rank and its error, instead of
waiting in the store until the deadline (300 s here, so the old behaviour fails these tests clearly).

Failures injected on one rank of fresh ``python -c`` processes: a mismatched world size and Ctrl-C
(SIGINT) in the rendezvous; an error while making its transport, in rank 0's cost model (rank 0 hosts
the store) and a bad PYCOLL_SOCKET_IFNAME (TCP set-up) in the Communicator. A later communicator, and a
later rendezvous, on the same store are not affected.

A rank SIGKILLed during the communicator's formation (pycoll/formation.py), which can announce nothing:
before it published its host, before it published its links, while the fault plane forms. Every other
rank raises, naming it: at once where the killed process was seen to exit (its pid, from the first
round), else when rank 0's deadline for its record passes.

No fixed ports (ports are chosen free just before use); every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pycoll.bootstrap import TCPStoreClient, TCPStoreServer, explicit_launch, rendezvous
from pycoll.errors import CollectiveMismatchError, PeerFailedError

ROOT = Path(__file__).resolve().parents[2]
WORLD = 3
INIT_TIMEOUT_S = 300.0  # pycoll's default: without the failure report the others would wait this long
DETECT_LIMIT_S = 5.0  # generous; the design aims at well under 2 s
RUN_DEADLINE_S = 90.0  # a whole test's processes, start-up included

# One rank process. argv: rank world port mode fail_rank [store]. Prints one "RESULT {json}" line per
# init (and "FAILING {json}" when the failing rank starts to announce its failure).
CHILD = r"""
import json, os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # even where the test runner ignores SIGINT
rank, world, port, fail_rank = (int(sys.argv[i]) for i in (1, 2, 3, 5))
timeout = float(os.environ.get("TEST_INIT_TIMEOUT", "300"))
mode = sys.argv[4]
use_store = len(sys.argv) > 6
import numpy as np
import pycoll
from pycoll import formation
from pycoll.bootstrap import TCPStoreClient
from pycoll.bootstrap.failfast import FailFastStore

def say(tag, **fields):
    print(tag + " " + json.dumps(fields), flush=True)

if rank == fail_rank:
    announce = FailFastStore.announce
    def noted(self, exc, *args, **kwargs):
        say("FAILING", t=time.time(), type=type(exc).__name__)
        return announce(self, exc, *args, **kwargs)
    FailFastStore.announce = noted
    def inject(name, what):
        original = getattr(formation, name)
        def fail(*args, **kwargs):
            setattr(formation, name, original)  # once: a later init works
            raise OSError(f"injected failure in {what} on rank {rank}")
        setattr(formation, name, fail)
    if mode == "transport":
        inject("_native_communicator", "transport set-up")
    elif mode == "model":
        inject("_root_model", "the cost model")
    elif mode == "world":
        world += 1
    elif mode.startswith("kill-"):  # SIGKILL at that point of the formation: nothing can be announced
        where = {"kill-hosts": "host_id", "kill-links": "_native_communicator", "kill-plane": "form_plane"}
        def killed(*args, **kwargs):
            say("FAILING", t=time.time(), type="SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)
        setattr(formation, where[mode], killed)

store = TCPStoreClient("127.0.0.1", port, timeout=300.0) if use_store else None
for attempt in range(2 if use_store else 1):
    start = time.time()
    try:
        if use_store:
            comm = pycoll.init(rank=rank, world_size=world, store=store, timeout=timeout)
        else:
            comm = pycoll.init(rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port,
                               timeout=timeout)
    except BaseException as exc:
        say("RESULT", ok=False, t=time.time(), start=start, type=type(exc).__name__, message=str(exc),
            peer=getattr(exc, "rank", None), error_type=getattr(exc, "error_type", None),
            error_message=getattr(exc, "error_message", None))
        continue
    x = np.full(1000, rank + 1.0)
    pycoll.allreduce(x, comm=comm)
    say("RESULT", ok=bool(np.all(x == world * (world + 1) / 2)), t=time.time(), start=start)
    pycoll.finalize()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("HOST_ID", "TIMEOUT", "TRANSPORT", "SOCKET_IFNAME", "SECRET"):
        env.pop(f"PYCOLL_{name}", None)
    env.setdefault("PYCOLL_SHM_SLOT_BYTES", "65536")
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra or {})
    return env


class Ranks:
    """The rank processes of one test, killed at the end whatever happened."""

    def __init__(self) -> None:
        self.procs: dict[int, subprocess.Popen] = {}
        self.deadline = time.monotonic() + RUN_DEADLINE_S

    def start(self, rank: int, world: int, port: int, mode: str, fail_rank: int, *, store: bool = False,
              env: dict[str, str] | None = None) -> None:
        args = [sys.executable, "-c", CHILD, str(rank), str(world), str(port), mode, str(fail_rank)]
        self.procs[rank] = subprocess.Popen(
            args + (["store"] if store else []), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, env=_env(env), cwd=ROOT,
        )

    def outputs(self) -> dict[int, str]:
        """Every rank's output, once all have exited (they are killed past the deadline)."""
        out: dict[int, str] = {}
        for rank, proc in self.procs.items():
            try:
                out[rank], _ = proc.communicate(timeout=max(0.1, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill()
                text, _ = proc.communicate()
                pytest.fail(f"rank {rank} still ran {RUN_DEADLINE_S:.0f} s after the start (hung):\n{text}")
        return out

    def kill(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs.values():
            proc.wait()


@pytest.fixture
def ranks():
    r = Ranks()
    yield r
    r.kill()


def _lines(text: str, tag: str) -> list[dict[str, Any]]:
    return [json.loads(line[len(tag) + 1:]) for line in text.splitlines() if line.startswith(tag + " ")]


def _check_others(outputs: dict[int, str], failed: int, failed_type: str, text: str,
                  failed_at: float | None = None) -> dict[int, float]:
    """Every rank but ``failed`` raised PeerFailedError naming it and its error, within DETECT_LIMIT_S of
    its failure; returns each one's delay (seconds)."""
    if failed_at is None:
        marks = _lines(outputs[failed], "FAILING")
        assert marks, f"rank {failed} did not fail as injected:\n{outputs[failed]}"
        failed_at = marks[0]["t"]
    mine = _lines(outputs[failed], "RESULT")
    assert mine and not mine[0]["ok"] and mine[0]["type"] == failed_type, outputs[failed]
    assert text in mine[0]["message"], outputs[failed]
    delays = {}
    for rank, out in outputs.items():
        if rank == failed:
            continue
        results = _lines(out, "RESULT")
        assert results, f"rank {rank} reported nothing:\n{out}"
        res = results[0]
        assert not res["ok"] and res["type"] == "PeerFailedError", f"rank {rank}: {res}\n{out}"
        assert res["peer"] == failed and res["error_type"] == failed_type, res
        message = res["message"]
        assert message.startswith(f"rank {failed} failed during "), message
        assert f"({failed_type}" in message and text in message, message
        assert f"this rank ({rank}) stops waiting for it" in message, message
        delays[rank] = res["t"] - failed_at
        assert delays[rank] < DETECT_LIMIT_S, f"rank {rank} took {delays[rank]:.2f} s: {message}"
    print(f"detection delays after rank {failed}'s {failed_type}:",
          ", ".join(f"rank {r} {d:.2f} s" for r, d in sorted(delays.items())))
    return delays


def _run_job(ranks: Ranks, mode: str, fail_rank: int, world: int = WORLD,
             env_of: dict[int, dict[str, str]] | None = None) -> dict[int, str]:
    port = _free_port()
    for rank in range(world):
        ranks.start(rank, world, port, mode, fail_rank, env=(env_of or {}).get(rank))
    return ranks.outputs()


# ---- the rendezvous ------------------------------------------------------------------------------------
def test_mismatched_world_size_fails_the_others_at_once(ranks):
    """Rank 2 says the world has 4 ranks: it fails in the rendezvous; ranks 0 and 1, waiting for it in the
    rendezvous barrier, fail at once naming it."""
    outputs = _run_job(ranks, "world", fail_rank=2)
    text = "rank 2 was started with world size 4 but rank 0 with 3"
    _check_others(outputs, 2, "CollectiveMismatchError", text)


def test_ctrl_c_in_the_rendezvous_fails_the_others_at_once(ranks):
    """4 ranks, rank 3 never starts: ranks 0-2 wait in the rendezvous barrier. Ctrl-C (SIGINT) on rank 2:
    ranks 0 and 1 fail at once naming it (rank 0, which hosts the store, keeps it up briefly first)."""
    world, port = 4, _free_port()
    for rank in range(3):
        ranks.start(rank, world, port, "none", fail_rank=2)
    # Wait until all three are in the barrier (the store is rank 0's).
    client = None
    try:
        while True:
            assert time.monotonic() < ranks.deadline, "the ranks never reached the rendezvous barrier"
            try:
                if client is None:
                    client = TCPStoreClient("127.0.0.1", port, timeout=10.0, connect_timeout=0.5)
                if client.add("pycoll/rdzv/1/join/arrivals", 0) >= 3:
                    break
            except Exception:  # noqa: BLE001 - rank 0 not listening yet
                pass
            time.sleep(0.05)
    finally:
        if client is not None:
            client.close()
    sent = time.time()
    ranks.procs[2].send_signal(signal.SIGINT)
    outputs = ranks.outputs()
    _check_others(outputs, 2, "KeyboardInterrupt", "", failed_at=sent)
    assert "rank 2 failed during rendezvous (KeyboardInterrupt)" in _lines(outputs[0], "RESULT")[0]["message"]


def test_a_later_rendezvous_on_the_same_store_is_not_affected():
    """On a store hosted elsewhere (as under ``pycoll run``): a rendezvous where rank 2 has the wrong world
    size fails on every rank at once; the next rendezvous of the same ranks on that store succeeds."""
    server = TCPStoreServer("127.0.0.1", 0)
    results: list[list[Any]] = [[None] * WORLD, [None] * WORLD]
    stores: list[Any] = []

    def rank_main(rank: int) -> None:
        for attempt in range(2):
            world = WORLD + 1 if attempt == 0 and rank == 2 else WORLD
            info = explicit_launch(rank, world, "127.0.0.1", server.port)
            start = time.monotonic()
            try:
                store, _ = rendezvous(info, timeout=INIT_TIMEOUT_S, store_hosted_externally=True)
                stores.append(store)
                results[attempt][rank] = time.monotonic() - start
            except BaseException as exc:  # noqa: BLE001 - the test inspects it
                results[attempt][rank] = (exc, time.monotonic() - start)

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(WORLD)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60.0)
        assert not any(t.is_alive() for t in threads), "a rendezvous hung"
    finally:
        for store in stores:
            store.close()
        server.close()
    first, second = results
    assert isinstance(first[2][0], CollectiveMismatchError), first
    for rank in (0, 1):
        exc, waited = first[rank]
        assert isinstance(exc, PeerFailedError) and exc.rank == 2, first
        assert str(exc).startswith("rank 2 failed during rendezvous (CollectiveMismatchError: "), exc
        assert waited < DETECT_LIMIT_S, first
    assert all(isinstance(w, float) for w in second), second


# ---- the communicator ----------------------------------------------------------------------------------
def test_transport_set_up_failure_fails_the_others_at_once(ranks):
    """Rank 1 fails while making its transport (before it publishes its links): the others, waiting for
    it, fail at once naming it and its error."""
    outputs = _run_job(ranks, "transport", fail_rank=1)
    _check_others(outputs, 1, "OSError", "injected failure in transport set-up on rank 1")


def test_model_failure_on_the_store_host_fails_the_others_at_once(ranks):
    """Rank 0, which hosts the store, fails before it hands out the cost model: ranks 1 and 2 fail at once
    naming it (it keeps the store up until they have read why)."""
    outputs = _run_job(ranks, "model", fail_rank=0)
    delays = _check_others(outputs, 0, "OSError", "injected failure in the cost model on rank 0")
    assert max(delays.values()) < 2.0, delays


@pytest.mark.parametrize("mode", ["kill-links", "kill-plane"])
def test_a_rank_killed_during_formation_is_named_by_every_rank_at_once(ranks, mode):
    """Rank 2 of 6 is SIGKILLed before it publishes its links, or while the fault plane forms: it said
    nothing, but its pid came with the first round, and every other rank raises PeerLostError naming it
    within DETECT_LIMIT_S (the set-up deadline is 300 s)."""
    world = 6
    outputs = _run_job(ranks, mode, fail_rank=2, world=world)
    killed_at = _lines(outputs[2], "FAILING")[0]["t"]
    for rank in range(world):
        if rank == 2:
            continue
        res = _lines(outputs[rank], "RESULT")[0]
        # PeerFailedError (a PeerLostError) where rank 0's notice through the store, that rank 2's process
        # exited, comes first: both name it.
        assert not res["ok"] and res["type"] in ("PeerLostError", "PeerFailedError"), (rank, outputs[rank])
        assert res["peer"] == 2 and "rank 2" in res["message"], res
        assert res["t"] - killed_at < DETECT_LIMIT_S, (rank, res["t"] - killed_at, res["message"])


def test_a_rank_killed_before_it_published_anything_is_named_at_the_deadline(ranks):
    """Rank 2 of 6 is SIGKILLed before the first round (no pid of it is known): rank 0 waits out the set-up
    deadline (4 s here) for its record, then every rank raises CollectiveTimeoutError naming rank 2 (rank 0
    publishes that in place of the table): nobody hangs, and the culprit is named."""
    world, deadline = 6, 4.0
    env_of = {r: {"TEST_INIT_TIMEOUT": str(deadline)} for r in range(world)}
    outputs = _run_job(ranks, "kill-hosts", fail_rank=2, world=world, env_of=env_of)
    killed_at = _lines(outputs[2], "FAILING")[0]["t"]
    for rank in range(world):
        if rank == 2:
            continue
        res = _lines(outputs[rank], "RESULT")[0]
        assert not res["ok"] and res["type"] == "CollectiveTimeoutError", (rank, outputs[rank])
        assert "rank(s) 2 of 6 did not reach pycoll.init's set-up" in res["message"], res
        assert res["t"] - killed_at < deadline + 4.0, (rank, res["t"] - killed_at)


def test_bad_socket_ifname_on_one_rank_fails_the_others_at_once(ranks):
    """PYCOLL_TRANSPORT=tcp everywhere, a PYCOLL_SOCKET_IFNAME that does not exist on rank 1 only: rank 1
    fails in TCP set-up, and the others, waiting for its address, fail at once naming it."""
    tcp = {"PYCOLL_TRANSPORT": "tcp"}
    env_of = {r: dict(tcp) for r in range(WORLD)}
    env_of[1]["PYCOLL_SOCKET_IFNAME"] = "nosuchif0"
    outputs = _run_job(ranks, "none", fail_rank=1, env_of=env_of)
    mine = _lines(outputs[1], "RESULT")
    assert mine and "PYCOLL_SOCKET_IFNAME='nosuchif0'" in mine[0]["message"], outputs[1]
    _check_others(outputs, 1, "InvalidUsageError", "PYCOLL_SOCKET_IFNAME='nosuchif0'")


def test_a_later_communicator_on_the_same_store_is_not_affected(ranks):
    """``init(store=...)`` on a store this process hosts: rank 1 fails making its transport, the others
    fail at once; then every rank calls init again on the same store and all-reduces correctly."""
    server = TCPStoreServer("127.0.0.1", 0)
    try:
        for rank in range(WORLD):
            ranks.start(rank, WORLD, server.port, "transport", fail_rank=1, store=True)
        outputs = ranks.outputs()
    finally:
        server.close()
    _check_others(outputs, 1, "OSError", "injected failure in transport set-up on rank 1")
    for rank, out in outputs.items():
        results = _lines(out, "RESULT")
        assert len(results) == 2 and results[1]["ok"], f"rank {rank}'s second init:\n{out}"


# ---- the store wrapper ---------------------------------------------------------------------------------
def test_fail_fast_store_waits_keep_their_deadline_and_the_first_failure_wins():
    """A wait with nothing published times out at its deadline, saying how long it waited in all; the first
    rank's own error is the one reported (not a later rank's, nor a derived error or a timeout); announcing
    on a closed store does not raise."""
    from pycoll.bootstrap.failfast import SLICE_S, FailFastStore
    from pycoll.errors import CollectiveTimeoutError

    server = TCPStoreServer("127.0.0.1", 0)
    clients = [TCPStoreClient("127.0.0.1", server.port, timeout=30.0) for _ in range(4)]
    try:
        stores = [FailFastStore(c, "t/failure", rank=r, timeout=30.0) for r, c in enumerate(clients)]
        start = time.monotonic()
        with pytest.raises(CollectiveTimeoutError) as info:
            stores[0].get("t/never", 4 * SLICE_S + 0.1)
        waited = time.monotonic() - start
        assert 4 * SLICE_S + 0.1 <= waited < 4.0, waited
        text = str(info.value)
        assert text.startswith("timed out after 1.1") and "'t/never'" in text, text
        clients[0].set("t/there", b"v")
        assert stores[0].get("t/there") == b"v"  # answered within the first slice

        stores[3].announce(CollectiveTimeoutError("a deadline passed"), 4)  # not published
        assert stores[0].peer_failure() is None
        stores[3].announce(PeerFailedError("rank 9 failed", rank=9), 4)  # derived: not published
        assert stores[0].peer_failure() is None
        stores[1].announce(ValueError("x" * 5000), 4)
        stores[2].announce(RuntimeError("second"), 4)
        start = time.monotonic()
        with pytest.raises(PeerFailedError) as failed:
            stores[0].wait(["t/never"], 30.0)
        assert time.monotonic() - start < 2 * SLICE_S + 1.0
        exc = failed.value
        assert exc.rank == 1 and exc.error_type == "ValueError" and len(exc.error_message) <= 1000, exc
        assert str(exc).startswith("rank 1 failed during pycoll.init (ValueError: xxx"), exc
        assert str(exc).endswith("...); this rank (0) stops waiting for it"), exc
        # Ranks 1-3 counted themselves as gone; rank 0 makes 4 of 4, so its linger (a store host's) ends.
        start = time.monotonic()
        stores[0].announce(exc, 4, linger=10.0)
        assert time.monotonic() - start < 2.0
        clients[2].close()
        stores[2].announce(RuntimeError("store closed"), 4)  # best effort: no error
    finally:
        for c in clients:
            c.close()
        server.close()
