"""The cost model (pycoll.tuning): plan loads against the simulator, closed forms, choices, calibration."""

from __future__ import annotations

import json
import math
import platform
from dataclasses import replace

import numpy as np
import pytest

from pycoll.algorithms import ALGORITHMS, build_plan
from pycoll.algorithms.compressed import build_compressed_plan
from pycoll.algorithms.simulate import simulate
from pycoll.compression import get_codec
from pycoll.tuning import LINKS, DeviceProfile, LinkProfile, Model, expected_error
from pycoll.tuning.calibrate import Measurement, fit
from pycoll.tuning.model import (
    DECODED,
    ENCODED,
    RECEIVED,
    ROTATION_SYMMETRIC,
    SENT,
    bus_factor,
    critical_path,
    latency_hops,
    one_quantization_error,
    plan_costs,
    step_loads,
)
from pycoll.tuning.persist import load_model, model_from_dict, model_to_dict, save_model

SEG = 4096  # elements per message in the plan-level tests


def _plans(collective: str, algorithm: str, world: int, count: int) -> list:
    return [build_plan(collective, algorithm, r, world, count, segment_elems=SEG) for r in range(world)]


def _inputs(collective: str, world: int, count: int) -> list[np.ndarray]:
    n = count * world if collective in ("reduce_scatter", "all_to_all") else count
    return [np.full(n, r + 1, dtype=np.float32) for r in range(world)]


CASES = [
    (collective, algorithm, world, count)
    for collective, algorithms in ALGORITHMS.items()
    if collective != "barrier"
    for algorithm in algorithms
    for world in (1, 2, 3, 4, 7)
    for count in (0, 1, 3 * SEG + 5, 2 * world * SEG)
]


@pytest.mark.parametrize("collective,algorithm,world,count", CASES)
def test_loads_and_hops_match_the_simulator(collective: str, algorithm: str, world: int, count: int) -> None:
    plans = _plans(collective, algorithm, world, count)
    result = simulate(plans, _inputs(collective, world, count))
    assert latency_hops(plans) == result.latency_hops
    for r, plan in enumerate(plans):
        loads = step_loads(plan, 4)
        assert loads.shape == (len(plan.steps), 5)
        assert loads[:, SENT].sum() == result.bytes_sent(r)
        assert loads[:, RECEIVED].sum() == result.bytes_received(r)
        assert not loads[:, ENCODED].any() and not loads[:, DECODED].any()


@pytest.mark.parametrize("algorithm", ["direct", "ring", "tree"])
@pytest.mark.parametrize("world", [2, 3, 5])
def test_compressed_loads_match_the_simulator(algorithm: str, world: int) -> None:
    codec = get_codec("int8")
    assert codec is not None
    block = codec.block_elems
    count = block * (7 * world + 3)  # whole blocks: the encoded size is exactly bytes_per_element x count
    plans = [build_compressed_plan(algorithm, r, world, count, block, 4) for r in range(world)]
    rng = np.random.default_rng(world)
    inputs = [rng.standard_normal(count).astype(np.float32) for _ in range(world)]
    result = simulate(plans, inputs, codec=codec)
    assert latency_hops(plans) == result.latency_hops
    for r, plan in enumerate(plans):
        loads = step_loads(plan, 4, codec.bytes_per_element)
        assert loads[:, SENT].sum() == pytest.approx(result.bytes_sent(r), rel=1e-12)
        assert loads[:, RECEIVED].sum() == pytest.approx(result.bytes_received(r), rel=1e-12)
        # Every element is decoded at least once and encoded at least once somewhere (two-shot: the
        # owner encodes its chunk's final value once; every rank encodes its shares of the others).
        assert loads[:, DECODED].sum() >= count * 4
        assert loads[:, ENCODED].sum() > 0


def _wire_model(alpha: float, beta: float) -> Model:
    """A link with a wire and a device so fast that only alpha and beta count; messages are forwarded
    whole (one fragment), as the textbook formulas assume."""
    link = LinkProfile("test", "test", alpha, beta, "gpu")
    device = DeviceProfile("gpu", 1e30, {"int8": (1e30, 1e30)})
    return Model(link, device, segment_bytes=SEG * 4, fragment_bytes=1 << 40)


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_textbook_closed_forms(world: int) -> None:
    alpha, beta = 2e-6, 10e9
    model = _wire_model(alpha, beta)
    segments = 3
    count = world * SEG * segments  # every chunk cut into `segments` full messages
    nbytes = count * 4
    ring = model.predict("allreduce", "ring", world, nbytes)
    # 2(n-1) hops per segment, and each rank sends and receives 2(n-1)/n of the buffer.
    assert ring.time_s == pytest.approx(
        2 * (world - 1) * segments * alpha + 2 * (world - 1) / world * nbytes / beta
    )
    direct = model.predict("allreduce", "direct", world, nbytes)
    assert direct.time_s == pytest.approx(2 * segments * alpha + 2 * (world - 1) / world * nbytes / beta)
    assert ring.busbw_GBps == pytest.approx(ring.algbw_GBps * 2 * (world - 1) / world)
    assert direct.algbw_GBps == pytest.approx(nbytes / direct.time_s / 1e9)
    # A codec of b bytes per element moves b/4 of the bytes, in messages of as many whole blocks as fit
    # in a segment's bytes (so fewer messages than uncompressed).
    codec = get_codec("int8")
    assert codec is not None
    bpe, block = codec.bytes_per_element, codec.block_elems
    per_message = (SEG * 4 // codec.block_bytes) * block
    coded_segments = math.ceil(count // world / per_message)
    int8 = model.predict("allreduce", "direct", world, nbytes, codec="int8")
    assert int8.time_s == pytest.approx(
        2 * coded_segments * alpha + 2 * (world - 1) / world * nbytes * bpe / 4 / beta
    )


def test_shared_memory_costs_are_memory_traffic() -> None:
    """Shared memory has no wire: a 2-rank direct all-reduce's rank copies its peer's half into the ring
    (2 bytes of traffic per byte) and reduces its own half out (3), then the same with final values
    (2 + 2): 9 x nbytes / 2 of traffic, one op after another on its core, plus a message cost per
    message taken in (2)."""
    link = LinkProfile("shm", "shm", 0.0, None, "cpu", shared_host=True)
    device = DeviceProfile("cpu", 10e9, {}, workers=4, message_s=1e-6)
    model = Model(link, device, segment_bytes=1 << 30, fragment_bytes=1 << 40)
    nbytes = 1 << 20
    assert model.predict("allreduce", "direct", 2, nbytes).time_s == pytest.approx(
        9 * nbytes / 2 / 10e9 + 2e-6
    )
    # 4 ranks on 2 cores share them: every op takes twice as long, and a message costs a switch too.
    four = model.predict("allreduce", "direct", 4, nbytes).time_s
    shared = replace(model, device=replace(device, workers=2), _cache={})
    assert shared.predict("allreduce", "direct", 4, nbytes).time_s == pytest.approx(2 * four)
    switching = replace(model, device=replace(device, workers=2, switch_s=4e-6), _cache={})
    # direct on 4 ranks: each rank takes in 3 + 3 messages; a switch costs 4 us x (1 - 2/4), shared 2x.
    assert switching.predict("allreduce", "direct", 4, nbytes).time_s == pytest.approx(
        2 * four + 6 * 2 * 2e-6
    )
    # Beyond the last-level cache (4 ranks x 1 MiB against 1 MiB: 3/4 of the traffic misses) traffic runs
    # at the memory bandwidth, divided between the ranks running at once (2 cores).
    slow_memory = replace(device, workers=4, memory_Bps=1e9, cache_bytes=1 << 20, message_s=0.0)
    fast = replace(model, device=replace(slow_memory, cache_bytes=1 << 30), _cache={})
    missing = replace(model, device=slow_memory, _cache={})
    per_byte_fast = 1 / 10e9
    per_byte_missing = 0.25 / 10e9 + 0.75 * 4 / 1e9
    assert missing.predict("allreduce", "direct", 4, nbytes).time_s == pytest.approx(
        fast.predict("allreduce", "direct", 4, nbytes).time_s * per_byte_missing / per_byte_fast
    )
    tree_slow = replace(missing, link=replace(link, memory_efficiency={"direct@4": 0.5}), _cache={})
    assert tree_slow.predict("allreduce", "direct", 4, nbytes).time_s == pytest.approx(
        fast.predict("allreduce", "direct", 4, nbytes).time_s
        * (0.25 / 10e9 + 0.75 * 4 / 0.5e9)
        / per_byte_fast
    )


def test_streaming_overlaps_a_chain_of_hops() -> None:
    """Ops stream fragment by fragment: a chain broadcast of one message over 8 ranks costs one message
    plus a fragment per further hop, not a message per hop."""
    link = LinkProfile("net", "net", 0.0, 1e9, "gpu")
    device = DeviceProfile("gpu", 1e30, {})
    whole = Model(link, device, segment_bytes=1 << 20, fragment_bytes=1 << 40)
    streamed = replace(whole, fragment_bytes=1 << 16, _cache={})
    nbytes = 1 << 20
    wire = nbytes / 1e9
    assert whole.predict("broadcast", "ring", 8, nbytes).time_s == pytest.approx(7 * wire)
    assert streamed.predict("broadcast", "ring", 8, nbytes).time_s == pytest.approx(wire + 6 * wire / 16)


def test_bus_factor_and_world_one() -> None:
    assert bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 4) == 1.0
    model = Model.for_link("nvlink4")
    assert model.predict("allreduce", "ring", 1, 1 << 20).time_s == 0.0
    assert model.choose_algorithm("allreduce", 1, 1 << 20) == "ring"
    with pytest.raises(ValueError, match="world"):
        model.predict("allreduce", "ring", 0, 1)


def test_expected_error_table() -> None:
    assert expected_error("int8", "direct", 2) == pytest.approx(7.3e-3)
    assert expected_error("int8", "direct", 8) == pytest.approx(8.1e-3)
    between = expected_error("int8", "direct", 6)
    assert 7.8e-3 < between < 8.1e-3
    assert expected_error("int4", "ring", 16) > expected_error("int4", "ring", 8)  # extrapolated growth
    assert expected_error("fp16", "tree", 1) == 0.0
    assert expected_error("user", "direct", 4) == math.inf
    for codec in ("fp16", "bf16", "int8", "int4"):
        assert expected_error(codec, "direct", 8) <= expected_error(codec, "ring", 8)


@pytest.mark.parametrize("link", sorted(LINKS))
def test_choices_are_valid_and_deterministic(link: str) -> None:
    model = Model.for_link(link)
    for collective, algorithms in ALGORITHMS.items():
        for world in (1, 2, 3, 8):
            for nbytes in (0, 4096, 1 << 20, 64 << 20):
                choice = model.choose_algorithm(collective, world, nbytes)
                assert choice in algorithms
                assert choice == Model.for_link(link).choose_algorithm(collective, world, nbytes)


def test_auto_compression_respects_the_budget() -> None:
    slow = Model.for_link("eth10")
    nbytes = 64 << 20
    codec, algorithm = slow.choose_compression(8, nbytes, error_budget=1e-2)
    assert (codec, algorithm) == ("int8", "direct")  # 1.06 bytes per element beats fp16's 2 on 10 GbE
    assert slow.choose_compression(8, nbytes, error_budget=1e-3)[0] == "fp16"
    # Whatever the budget, the choice is the fastest prediction among the candidates within it.
    for budget in (1e-3, 5e-3, 1e-2, 0.2):
        chosen, algo = slow.choose_compression(8, nbytes, error_budget=budget)
        candidates = [slow.predict("allreduce", a, 8, nbytes) for a in ALGORITHMS["allreduce"]]
        candidates += [
            p
            for c in ("fp16", "bf16", "int8", "int4")
            for a in ("direct", "ring", "tree")
            if (p := slow.predict("allreduce", a, 8, nbytes, codec=c)).error <= budget
        ]
        best = min(candidates, key=lambda p: p.time_s)
        assert (chosen, algo) == (best.codec, best.algorithm)
    assert slow.choose_compression(8, nbytes, error_budget=1e-5) == (
        "none",
        slow.choose_algorithm("allreduce", 8, nbytes),
    )
    # Compression is chosen only where it is predicted faster.
    fast = Model.for_link("nvlink4")
    assert fast.choose_compression(8, 4096, error_budget=1.0)[0] == "none"
    for name, budget in (("int8", 1e-2), ("fp16", 1e-3)):
        chosen, algo = slow.choose_compression(8, nbytes, error_budget=budget)
        assert chosen == name
        assert slow.predict("allreduce", algo, 8, nbytes, codec=name).error <= budget


def _synthetic(model: Model) -> list[Measurement]:
    from pycoll.tuning.persist import shm_fragment_bytes, shm_segment_bytes

    points = []
    for world in (2, 3, 4):
        at = replace(model, segment_bytes=shm_segment_bytes(world), fragment_bytes=shm_fragment_bytes(world))
        for algorithm in ("ring", "direct", "tree"):
            for codec in ("none", "int8"):
                for nbytes in (4096, 65536, 1 << 20, 16 << 20, 64 << 20):
                    p = at.predict(
                        "allreduce", algorithm, world, nbytes, codec=None if codec == "none" else codec
                    )
                    points.append(Measurement(world, algorithm, codec, nbytes, p.time_s))
    return points


# Where the fit starts its cache size: below the truth (16 MiB), near it, and above every working set
# (a 300 MiB last-level cache, as sysfs reports on some Xeons). Given, not read from this machine.
@pytest.mark.parametrize("start_cache_mib", [2, 32, 300])
def test_fit_recovers_the_parameters_of_synthetic_measurements(start_cache_mib: int) -> None:
    pytest.importorskip("scipy", reason="calibration fits with scipy")
    from pycoll.tuning.calibrate import starting_model

    truth_link = replace(
        LINKS["shm"],
        alpha_s=3e-6,
        efficiency={
            "direct@2": 0.8,
            "tree@2": 0.6,
            "ring@3": 0.9,
            "direct@3": 0.7,
            "tree@3": 0.5,
            "ring@4": 0.8,
            "direct@4": 0.6,
            "tree@4": 0.4,
        },
        memory_efficiency={"tree@2": 0.5, "tree@3": 0.5, "tree@4": 0.5},
    )
    truth_device = DeviceProfile(
        "cpu",
        40e9,
        {k: (e * 1.3, d * 1.3) for k, (e, d) in LINKS_CPU_CODECS.items()},
        workers=2,
        message_s=2e-6,
        switch_s=5e-6,
        memory_Bps=30e9,
        cache_bytes=16 << 20,
    )
    truth = Model(truth_link, truth_device, 512 * 1024)
    fitted, report = fit(_synthetic(truth), starting_model(workers=2, cache_bytes=start_cache_mib << 20))
    assert report["rms_log_error"] < 0.02
    for point in report["points"]:
        assert abs(point["rel_error"]) < 0.05, point
    params = report["parameters"]
    assert params["copy_Bps"] == pytest.approx(40e9, rel=0.1)
    assert params["cache_bytes"] == pytest.approx(16 << 20, rel=0.1)  # wherever it started
    assert params["memory_Bps"] == pytest.approx(30e9, rel=0.1)
    assert params["efficiency[tree@3]"] == pytest.approx(0.5, rel=0.1)
    assert fitted.link.efficiency["tree"] == pytest.approx(params["efficiency[tree@4]"])  # beyond 4 ranks


LINKS_CPU_CODECS = {
    "fp16": (13e9, 9.5e9),
    "bf16": (12.2e9, 10.3e9),
    "int8": (8.1e9, 7.9e9),
    "int4": (7.1e9, 7.3e9),
}


def test_save_and_load(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = replace(Model.for_link("shm", workers=2), origin="calibrated")
    model = replace(model, link=replace(model.link, efficiency={"tree": 0.5}), _cache={})
    path = save_model(model, {"rms_log_error": 0.1}, tmp_path / "sub" / "tuning.json")
    loaded = load_model(path, segment_bytes=1 << 18, workers=3)
    assert loaded is not None
    assert loaded.link == model.link
    assert loaded.device == replace(model.device, workers=3)
    assert loaded.segment_bytes == 1 << 18 and loaded.origin == str(path)
    assert model_from_dict(json.loads(json.dumps(model_to_dict(model)))).link == model.link
    # Another host's file, a broken file, a missing file and PYCOLL_TUNING_FILE=none: no calibration.
    data = json.loads(path.read_text())
    data["host"] = platform.node() + "-elsewhere"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    assert load_model(other) is None
    (tmp_path / "broken.json").write_text("{")
    assert load_model(tmp_path / "broken.json") is None
    assert load_model(tmp_path / "missing.json") is None
    monkeypatch.setenv("PYCOLL_TUNING_FILE", str(path))
    assert load_model() is not None
    monkeypatch.setenv("PYCOLL_TUNING_FILE", "none")
    assert load_model() is None


def test_tuning_file_location(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    from pathlib import Path

    from pycoll.tuning.persist import tuning_file

    monkeypatch.delenv("PYCOLL_TUNING_FILE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert tuning_file() == tmp_path / "pycoll" / "tuning.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert tuning_file() == Path.home() / ".cache" / "pycoll" / "tuning.json"
    monkeypatch.setenv("PYCOLL_TUNING_FILE", str(tmp_path / "t.json"))
    assert tuning_file() == tmp_path / "t.json"


def test_tool_environment_reads_live_in_env() -> None:
    from pycoll import env

    assert env.tuning_file_setting({}) is None and env.tuning_file_setting({"PYCOLL_TUNING_FILE": ""}) is None
    assert env.tuning_file_setting({"PYCOLL_TUNING_FILE": "none"}) == "none"
    assert env.cache_home({"XDG_CACHE_HOME": "/c"}) == "/c"
    assert not env.started_by_mpirun({}) and not env.started_by_mpirun({"OMPI_COMM_WORLD_RANK": ""})
    assert env.started_by_mpirun({"OMPI_COMM_WORLD_RANK": "0"}) and env.started_by_mpirun({"PMIX_RANK": "1"})
    assert env.master_address({}) == (None, None)
    assert env.master_address({"MASTER_ADDR": "h", "MASTER_PORT": "29500"}) == ("h", "29500")
    assert env.environ_with({"PYCOLL_X_TEST": "1"})["PYCOLL_X_TEST"] == "1"


def test_core_loads_the_model_without_calibration_or_the_tools() -> None:
    """pycoll.comm imports the cost model's persistence (pycoll.tuning.persist) only: not calibration,
    the benchmark package, the CLI or argparse."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, pycoll.comm; "
        "print(sorted(m for m in sys.modules if m == 'argparse' or m == 'pycoll.tuning.calibrate' "
        "or m.startswith(('pycoll.bench', 'pycoll.cli'))))"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_model_command(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    from pycoll.cli.main import main

    out = tmp_path / "model.jsonl"
    assert (
        main(
            [
                "model",
                "--link",
                "pcie4,nvlink4",
                "--ranks",
                "8",
                "-b",
                "4K",
                "-e",
                "1M",
                "--compression",
                "int8",
                "--error-budget",
                "1e-2",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "# pcie4" in text and "# nvlink4" in text and "side by side" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    sizes = {r["bytes"] for r in records}
    assert sizes == {4096, 16384, 65536, 262144, 1048576}
    model = Model.for_link("pcie4")
    ring_1m = next(
        r for r in records if r["link"] == "pcie4" and r["algorithm"] == "ring" and r["bytes"] == 1 << 20
    )
    assert ring_1m["busbw_GBps"] == pytest.approx(model.predict("allreduce", "ring", 8, 1 << 20).busbw_GBps)
    assert main(["model", "--list"]) == 0
    assert "nvlink4" in capsys.readouterr().out
    assert main(["model", "--link", "token-ring"]) == 2
    assert "unknown link" in capsys.readouterr().err
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib (a test extra)")
    png = tmp_path / "model.png"
    assert main(["model", "--link", "ib_hdr", "--ranks", "4", "-e", "64K", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_calibrated_corrections_interpolate_in_log_size() -> None:
    key = "allreduce/tree@2/none"
    base = Model.for_link("shm", workers=2)
    link = replace(base.link, corrections={key: [(12.0, 2.0), (20.0, 0.5)]})  # 4 KiB: x2, 1 MiB: x0.5
    corrected = replace(base, link=link, _cache={})
    assert link.correction(key, 4096) == pytest.approx(2.0)
    assert link.correction(key, 1 << 16) == pytest.approx(1.0)  # halfway in log2: sqrt(2 x 0.5)
    assert link.correction(key, 1 << 30) == pytest.approx(0.5)  # the end factor beyond the range
    assert link.correction("allreduce/ring@2/none", 4096) == 1.0
    for nbytes, factor in ((4096, 2.0), (1 << 20, 0.5)):
        plain = base.predict("allreduce", "tree", 2, nbytes).time_s
        assert corrected.predict("allreduce", "tree", 2, nbytes).time_s == pytest.approx(plain * factor)
    assert (
        corrected.predict("allreduce", "tree", 3, 4096).time_s
        == base.predict("allreduce", "tree", 3, 4096).time_s
    )
    assert LinkProfile.from_dict(json.loads(json.dumps(link.to_dict()))) == link


def test_fit_keeps_the_residuals_as_corrections() -> None:
    pytest.importorskip("scipy", reason="calibration fits with scipy")
    truth = Model.for_link("shm", workers=2)
    points = _synthetic(truth)
    odd = points[7]
    points[7] = Measurement(odd.world, odd.algorithm, odd.codec, odd.bytes, odd.time_s * 3)  # one stall
    fitted, _ = fit(points, workers=2)
    from pycoll.tuning.persist import shm_fragment_bytes, shm_segment_bytes

    at = replace(
        fitted, segment_bytes=shm_segment_bytes(odd.world), fragment_bytes=shm_fragment_bytes(odd.world)
    )
    codec = None if odd.codec == "none" else odd.codec
    predicted = at.predict("allreduce", odd.algorithm, odd.world, odd.bytes, codec=codec).time_s
    assert predicted == pytest.approx(odd.time_s * 3, rel=0.02)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_auto_compression_of_sharded_collectives(collective: str) -> None:
    """compression="auto" on a reduce-scatter or all-gather: the fastest prediction among the uncompressed
    plans and each codec's direct plan within the budget; none where nothing is sent or nothing fits."""
    slow, shm = Model.for_link("eth10"), Model.for_link("shm")
    nbytes = 64 << 20
    for budget in (1e-3, 1e-2, 0.2):
        chosen = slow.choose_compression(4, nbytes, error_budget=budget, collective=collective)
        candidates = [slow.predict(collective, a, 4, nbytes) for a in ALGORITHMS[collective]]
        candidates += [
            p
            for c in ("fp16", "bf16", "int8", "int4")
            if (p := slow.predict(collective, "direct", 4, nbytes, codec=c)).error <= budget
        ]
        best = min(candidates, key=lambda p: p.time_s)
        assert chosen == (best.codec, best.algorithm)
    assert slow.choose_compression(4, nbytes, error_budget=1e-2, collective=collective)[0] == "int8"
    assert slow.choose_compression(4, nbytes, error_budget=1e-6, collective=collective)[0] == "none"
    assert slow.choose_compression(1, nbytes, error_budget=1.0, collective=collective)[0] == "none"
    assert shm.choose_compression(4, 4096, error_budget=1.0, collective=collective)[0] == "none"
    with pytest.raises(ValueError, match="runs direct"):
        slow.predict(collective, "ring", 4, nbytes, codec="int8")


def test_one_quantization_error_follows_the_measured_tables() -> None:
    """A reduce-scatter quantizes each share once: e1 * sqrt((n - 1) / n), e1 from two-shot's 2-rank
    error; docs/compression.md measured int8 0.42% / 0.51% / 0.56% at 2 / 4 / 8 ranks."""
    for world, measured in ((2, 0.0042), (4, 0.00513), (8, 0.00555)):
        assert one_quantization_error("int8", "reduce_scatter", world) == pytest.approx(measured, rel=0.05)
    assert one_quantization_error("int8", "all_gather", 8) == pytest.approx(0.0073 / 1.5**0.5)
    assert one_quantization_error("int8", "reduce_scatter", 1) == 0.0


SYMMETRIC_CASES = [
    (collective, algorithm)
    for collective, algorithms in ALGORITHMS.items()
    for algorithm in algorithms
    if (collective, algorithm) in ROTATION_SYMMETRIC
]


@pytest.mark.parametrize("collective,algorithm", SYMMETRIC_CASES)
@pytest.mark.parametrize("world", [2, 3, 5, 8])
def test_rotation_symmetric_plans_are_rotations(collective: str, algorithm: str, world: int) -> None:
    """What ``critical_path`` assumes of the ROTATION_SYMMETRIC plans: rank r's ops are rank 0's, in the same
    steps and order, with every peer moved on by r (counts equal where the chunks are)."""
    count = 3 * world * SEG
    base = build_plan(collective, algorithm, 0, world, count, segment_elems=SEG)
    for r in range(1, world):
        plan = build_plan(collective, algorithm, r, world, count, segment_elems=SEG)
        assert [len(step) for step in plan.steps] == [len(step) for step in base.steps]
        for mine, theirs in zip(plan.ops(), base.ops()):
            assert (mine.kind, mine.count, mine.finalize) == (theirs.kind, theirs.count, theirs.finalize)
            for peer, peer0 in ((mine.send_peer, theirs.send_peer), (mine.recv_peer, theirs.recv_peer)):
                assert peer == (-1 if peer0 < 0 else (peer0 + r) % world)


COMPRESSED_SYMMETRIC = (("allreduce", "direct"), ("allreduce", "ring"))


@pytest.mark.parametrize("link", ["shm", "eth10"])
@pytest.mark.parametrize("world", [2, 4, 7, 12])
def test_symmetric_critical_path_is_the_full_one(link: str, world: int) -> None:
    """Rank 0's walk alone gives the time and composition of the walk of every rank's plan, for each
    ROTATION_SYMMETRIC pair (and the compressed all-reduces that are), at counts the ranks split evenly."""
    model = Model.for_link(link, workers=2, segment_bytes=SEG * 4)
    codecs = [(None, 1), (get_codec("int8").bytes_per_element, get_codec("int8").block_elems)]
    checked = 0
    for collective, algorithm in SYMMETRIC_CASES:
        for bpe, block in codecs:
            if bpe is not None and (collective, algorithm) not in COMPRESSED_SYMMETRIC:
                continue
            for count in (world * block, world * block * 40, world * block * 4000):
                full = plan_costs(collective, algorithm, world, count, 4, SEG * 4, bpe, block)
                one = plan_costs(
                    collective, algorithm, world, count, 4, SEG * 4, bpe, block, symmetric=True
                )
                assert len(one.plans) == 1 and one.world == world
                assert one.traffic == pytest.approx(full.traffic)
                weights = model.weights(algorithm, world, "none" if bpe is None else "int8", count * 4)
                a, b = critical_path(full, weights, SEG), critical_path(one, weights, SEG)
                assert b[0] == pytest.approx(a[0], rel=1e-12)
                np.testing.assert_allclose(b[1], a[1], rtol=1e-12)
                checked += 1
    assert checked >= 3 * len(SYMMETRIC_CASES)


def test_auto_leaves_out_direct_above_its_rank_limit() -> None:
    """Where the model alone would pick direct, auto takes the best other plan above DIRECT_MAX_RANKS."""
    from types import SimpleNamespace

    from pycoll import auto

    model = Model.for_link("shm", workers=2, segment_bytes=512 * 1024)
    world = auto.DIRECT_MAX_RANKS + 1
    nbytes = 8 * world
    assert model.choose_algorithm("all_gather", world, nbytes) == "direct"
    comm = SimpleNamespace(model=model, world_size=world, spans_equal_hosts=False)
    assert auto.algorithm(comm, "all_gather", "auto", nbytes, 4) == "ring"  # type: ignore[arg-type]
    world = auto.DIRECT_MAX_RANKS
    small = SimpleNamespace(model=model, world_size=world, spans_equal_hosts=False)
    chosen = auto.algorithm(small, "all_gather", "auto", 8 * world, 4)  # type: ignore[arg-type]
    assert chosen == model.choose_algorithm("all_gather", world, 8 * world) == "direct"
