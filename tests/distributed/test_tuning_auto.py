"""``algorithm="auto"`` and ``compression="auto"`` on real ranks: every rank uses rank 0's cost model, and
what auto runs is exactly what the model chose (bitwise the same result as the explicit call)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from _inputs import digest

import pycoll
from pycoll.errors import InvalidUsageError
from pycoll.tuning import Model
from pycoll.tuning.persist import load_model, model_to_dict


def gaussian(rank: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, rank, count]).standard_normal(count).astype(np.float32)


def body_models_agree(comm, rank, world):
    return json.dumps(model_to_dict(comm.model), sort_keys=True)


@pytest.mark.parametrize("world", (2, 3))
def test_every_rank_uses_the_same_model(rank_pool, world):
    models = rank_pool(world).run(body_models_agree, timeout=60)
    assert all(m == models[0] for m in models)
    data = json.loads(models[0])
    assert data["link"]["name"] == "shm" and data["link"]["shared_host"]


def body_auto(comm, rank, world, seed):
    """On a model of a slow network (so that compressing pays), compression="auto" must run exactly the
    codec and algorithm the model picks, and stay within the error budget's intent."""
    ctx = comm.context  # the formed group's facts, the model among them: swapped for this test's
    saved = ctx.group
    ctx.group = replace(saved, model=Model.for_link("eth10", segment_bytes=comm.segment_bytes))
    try:
        out = {}
        for count in (1000, 300_000):
            nbytes = count * 4
            for budget in (1e-2, 1e-3, 1e-6):
                codec, algorithm = comm.model.choose_compression(world, nbytes, error_budget=budget)
                x = gaussian(rank, count, seed)
                pycoll.allreduce(x, compression="auto", error_budget=budget, timeout=30)
                y = gaussian(rank, count, seed)
                if codec == "none":
                    pycoll.allreduce(y, algorithm=algorithm, timeout=30)
                else:
                    pycoll.allreduce(y, algorithm=algorithm, compression=codec, timeout=30)
                assert np.array_equal(x, y), (
                    f"count {count} budget {budget}: auto differs from {codec}/{algorithm}"
                )
                exact = np.sum([gaussian(r, count, seed).astype(np.float64) for r in range(world)], axis=0)
                rel = float(np.linalg.norm(x - exact) / np.linalg.norm(exact))
                out[(count, budget)] = (codec, algorithm, rel, digest(x))
        # Integers and min/max are never compressed; "auto" with a residual is refused.
        z = np.full(100_000, rank + 1, dtype=np.int32)
        pycoll.allreduce(z, compression="auto", error_budget=1.0)
        assert (z == world * (world + 1) // 2).all()
        m = gaussian(rank, 100_000, seed)
        pycoll.allreduce(m, "max", compression="auto", error_budget=1.0)
        assert np.array_equal(m, np.max([gaussian(r, 100_000, seed) for r in range(world)], axis=0))
        with pytest.raises(InvalidUsageError, match="residual"):
            pycoll.allreduce(gaussian(rank, 10, seed), compression="auto", residual=np.zeros(10, np.float32))
        with pytest.raises(InvalidUsageError, match="error_budget"):
            pycoll.allreduce(gaussian(rank, 10, seed), compression="int8", error_budget=1e-2)
        with pytest.raises(InvalidUsageError, match="error_budget"):
            pycoll.allreduce(gaussian(rank, 10, seed), compression="auto", error_budget=-1.0)
        return out
    finally:
        ctx.group = saved


@pytest.mark.parametrize("world", (2, 4))
def test_auto_compression_runs_the_models_choice(rank_pool, world):
    results = rank_pool(world).run(body_auto, 5, timeout=120)
    for key, (codec, algorithm, rel, d) in results[0].items():
        assert all(r[key][3] == d for r in results), f"{key}: ranks differ (must be bitwise identical)"
        count, budget = key
        # The measured error table the model uses is for Gaussian inputs like these; allow 1.5x.
        assert rel <= 1.5 * max(budget, 1e-7), (key, codec, algorithm, rel)
    # The slow-network model compresses large messages when the budget allows int8 or fp16, never for a
    # budget no codec meets.
    assert results[0][(300_000, 1e-2)][0] == "int8"
    assert results[0][(300_000, 1e-3)][0] == "fp16"
    assert results[0][(300_000, 1e-6)][0] == "none"


def body_calibrated(comm, rank, world, path):
    x = np.full(1 << 16, rank + 1, dtype=np.float32)
    pycoll.allreduce(x)  # auto, by the calibrated model
    assert (x == world * (world + 1) / 2).all()
    return comm.model.origin, comm.model.choose_algorithm("allreduce", world, 1 << 20)


def test_a_calibration_file_steers_auto(tmp_path):
    """A saved calibration (here one that makes the tree 100x more efficient) is what every rank's auto
    chooses by."""
    from harness import RankPool

    from pycoll.tuning.persist import save_model

    base = Model.for_link("shm", workers=2)
    steering = replace(base, link=replace(base.link, efficiency={"tree": 100.0}), _cache={})
    path = save_model(steering, {}, tmp_path / "tuning.json")
    with RankPool(2, env={"PYCOLL_TUNING_FILE": str(path)}) as pool:
        results = pool.run(body_calibrated, str(path), timeout=60)
    assert results == [(str(path), "tree")] * 2


def test_bench_calibrate_writes_a_calibration(tmp_path):
    path = tmp_path / "tuning.json"
    points = tmp_path / "points.jsonl"
    env = {**os.environ, "PYCOLL_TUNING_FILE": str(path)}
    cmd = [sys.executable, "-m", "pycoll.cli.main", "bench", "--calibrate", "--ranks", "2", "-b", "64K"]
    cmd += ["-e", "256K", "--calibrate-measurements", str(points)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "fitted parameters" in out.stdout and f"saved to {path}" in out.stdout
    model = load_model(path)
    assert model is not None and model.origin == str(path)
    data = json.loads(path.read_text())
    assert {p["algorithm"] for p in data["fit"]["points"]} == {"ring", "direct", "tree"}
    assert {p["bytes"] for p in data["fit"]["points"]} == {65536, 262144}
    assert all(v > 0 for v in data["fit"]["parameters"].values())
    # Fitting the written points again gives the same calibration.
    again = tmp_path / "again.json"
    cmd = [sys.executable, "-m", "pycoll.cli.main", "bench", "--calibrate", "--calibrate-from", str(points)]
    env["PYCOLL_TUNING_FILE"] = str(again)
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(again.read_text())["link"] == data["link"]


def body_gpu_machine(comm, rank, world):
    machine = comm.gpu_model
    return machine.topology.label, machine.topology.intra.beta_Bps


def test_every_rank_describes_the_gpu_machine_as_rank_0_read_it(tmp_path):
    """PYCOLL_TOPOLOGY with a link file: rank 0 reads the file when the communicator is made and hands
    the classes to every rank through the store; the file may be gone by the time a rank asks."""
    from harness import RankPool

    path = tmp_path / "links.json"
    path.write_text(json.dumps({"links": [{"name": "bridge", "kind": "nvlink", "rate_GBps": 100}]}))
    with RankPool(2, env={"PYCOLL_TOPOLOGY": f"intra=bridge,links={path}"}) as pool:
        path.unlink()
        results = pool.run(body_gpu_machine, timeout=60)
    assert results == [("1x2 bridge", pytest.approx(100 * 0.8 * 1e9))] * 2
