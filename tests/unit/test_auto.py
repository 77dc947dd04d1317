"""pycoll.auto: each question "auto" answers, from the facts every rank shares (no processes)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from pycoll import auto
from pycoll.env import DEFAULT_SPIN_US, DEFAULT_YIELD_US, Settings
from pycoll.errors import InvalidUsageError
from pycoll.tuning import Model


@pytest.mark.parametrize(
    "setting, nodes, world, expected",
    [
        ("auto", 1, 4, "shm"),
        ("auto", 4, 4, "tcp"),
        ("auto", 2, 4, "mixed"),
        ("tcp", 1, 4, "tcp"),
        ("shm", 2, 4, "shm"),  # kept: the communicator then refuses it, naming the hosts
    ],
)
def test_transport(setting: str, nodes: int, world: int, expected: str) -> None:
    assert auto.transport(setting, nodes, world) == expected


@pytest.mark.parametrize(
    "local_world, transport, cpus, expected",
    [
        (2, "shm", 2, (DEFAULT_SPIN_US, DEFAULT_YIELD_US // 4)),
        (4, "shm", 2, (0, DEFAULT_YIELD_US)),  # oversubscribed: never spin, yield longer
        (1, "tcp", 8, (0, 0)),  # TCP only: sleep on the transport, its I/O thread wakes the rank
        (2, "mixed", 2, (DEFAULT_SPIN_US, DEFAULT_YIELD_US // 4)),
    ],
)
def test_wait_policy_auto(local_world: int, transport: str, cpus: int, expected: tuple[int, int]) -> None:
    assert auto.wait_policy(Settings(), local_world, transport, cpus) == expected


@pytest.mark.parametrize(
    "transport, world, expected",
    [
        ("tcp", 2, (512 * 1024, 4)),  # TCP alone: large fragments (fewer hand-overs per byte)
        ("tcp", 17, (512 * 1024, 4)),  # 16 peers x 2 rings x 4 x 512 KiB = 64 MiB: still fits
        ("tcp", 18, (256 * 1024, 4)),  # above it fragments shrink
        ("tcp", 4096, (16 * 1024, 4)),  # never below 16 KiB
        ("shm", 4, (128 * 1024, 8)),
        ("mixed", 4, (128 * 1024, 8)),  # one shape for both transports of a composite
    ],
)
def test_ring_shape_auto(transport: str, world: int, expected: tuple[int, int]) -> None:
    assert auto.ring_shape(Settings(), transport, world) == expected


def test_ring_shape_keeps_what_is_set() -> None:
    env = {"PYCOLL_TCP_FRAGMENT_BYTES": "65536", "PYCOLL_TCP_SLOTS": "16", "PYCOLL_SHM_SLOTS": "32"}
    settings = Settings.from_environ(env)
    assert auto.ring_shape(settings, "tcp", 64) == (65536, 16)
    assert auto.ring_shape(settings, "shm", 2) == (128 * 1024, 32)
    with pytest.raises(InvalidUsageError, match="PYCOLL_TCP_FRAGMENT_BYTES must be a multiple of 64"):
        Settings.from_environ({"PYCOLL_TCP_FRAGMENT_BYTES": "5000"})
    with pytest.raises(InvalidUsageError, match="PYCOLL_TCP_SLOTS must be >= 2"):
        Settings.from_environ({"PYCOLL_TCP_SLOTS": "1"})


def test_wait_policy_keeps_what_is_set() -> None:
    settings = Settings(spin_us=7, yield_us=3)
    assert auto.wait_policy(settings, 8, "shm", 2) == (7, 3)
    assert auto.wait_policy(settings, 1, "tcp", 2) == (0, 3)


@pytest.mark.parametrize(
    "hosts, size, spans",
    [
        (["a"], 1, False),
        (["a", "a", "a"], 3, False),  # one host
        (["a", "b", "c"], 1, False),  # one rank per host
        (["a", "a", "b", "b"], 2, True),
        (["a", "b", "a", "b"], None, False),  # not numbered host by host
        (["a", "a", "b"], None, False),  # unequal hosts
        (["a", "a", "b", "b", "a", "a"], None, False),  # a host in two blocks
    ],
)
def test_host_layout(hosts: list[str], size: int | None, spans: bool) -> None:
    assert auto.ranks_per_host(hosts) == size
    assert auto.spans_equal_hosts(hosts) is spans


def test_cost_model_defaults() -> None:
    assert auto.uses_calibration("shm") and not auto.uses_calibration("tcp")
    assert not auto.uses_calibration("mixed")
    shm = auto.default_model("shm", workers=2, segment_bytes=1 << 18, fragment_bytes=1 << 16)
    assert shm == replace(Model.for_link("shm", workers=2, segment_bytes=1 << 18), fragment_bytes=1 << 16)
    assert shm.link.name == "shm" and shm.fragment_bytes == 1 << 16 and shm.segment_bytes == 1 << 18
    for transport in ("tcp", "mixed"):  # the slow links decide
        assert auto.default_model(
            transport, workers=2, segment_bytes=1 << 18, fragment_bytes=1
        ).link.name == ("eth10")


def _comm(hosts: list[str], model: Model | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        hosts=hosts,
        world_size=len(hosts),
        spans_equal_hosts=auto.spans_equal_hosts(hosts),
        model=model or Model.for_link("shm", workers=2),
    )


def test_algorithm() -> None:
    one_host, two_hosts = _comm(["a"] * 4), _comm(["a", "a", "b", "b"])
    assert auto.algorithm(two_hosts, "allreduce", "auto", 1 << 20, 4) == "hierarchical"
    expected = one_host.model.choose_algorithm("allreduce", 4, 1 << 20, itemsize=4)
    assert auto.algorithm(one_host, "allreduce", "auto", 1 << 20, 4) == expected
    assert auto.algorithm(two_hosts, "broadcast", "auto", 1 << 20, 4) != "hierarchical"
    assert auto.algorithm(one_host, "allreduce", "auto", 1 << 20, 4, gpu=True) == "nccl"
    assert auto.algorithm(one_host, "allreduce", "nccl", 1 << 20, 4, gpu=True) == "nccl"
    assert auto.algorithm(one_host, "allreduce", "ring", 1 << 20, 4) == "ring"
    with pytest.raises(InvalidUsageError, match="runs on GPU memory"):
        auto.algorithm(one_host, "allreduce", "nccl", 1 << 20, 4)
    with pytest.raises(InvalidUsageError, match="must be one of auto, ring"):
        auto.algorithm(one_host, "allreduce", "fastest", 1 << 20, 4)


def test_auto_compressed_algorithm() -> None:
    assert auto.auto_compressed_algorithm(_comm(["a", "a", "b", "b"])) == "hierarchical"
    assert auto.auto_compressed_algorithm(_comm(["a", "a"])) == "direct"


def test_compression() -> None:
    slow = Model.for_link("eth10")
    comm = _comm(["a", "b", "c", "d", "e", "f", "g", "h"], slow)
    buf = SimpleNamespace(dtype="float32", count=16 << 20)  # 64 MiB: int8 wins on 10 GbE (test_tuning)
    codec, algorithm = auto.compression(comm, None, buf, "sum", 1e-2)
    assert codec is not None and (codec.kind, algorithm) == ("int8", "direct")
    codec, algorithm = auto.compression(comm, None, buf, "avg", None)  # the default budget admits fp16 only
    assert codec is not None and codec.kind == "fp16"
    assert auto.compression(
        _comm(["a"] * 2), None, SimpleNamespace(dtype="float32", count=16), "sum", 1.0
    ) == (
        None,
        None,
    )  # small on shared memory: no codec pays
    assert auto.compression(comm, None, SimpleNamespace(dtype="int32", count=16), "sum", None) == (None, None)
    assert auto.compression(comm, None, buf, "max", None) == (None, None)
    with pytest.raises(InvalidUsageError, match="fixed codec"):
        auto.compression(comm, object(), buf, "sum", None)
    with pytest.raises(InvalidUsageError, match="error_budget"):
        auto.compression(comm, None, buf, "sum", -1.0)
