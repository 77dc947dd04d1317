"""A user codec (examples/sign_codec.py, compiled with numba) in pycoll.allreduce on real ranks.

Every algorithm's result is checked bit for bit against a model: the compressed plans of every rank
(pycoll.algorithms.compressed) run here in numpy with the semantics of plan.py ("Compressed plans"), every
encode-then-decode done by the numpy model of the codec. The sign codec works block by block and the
reductions are float32 adds in plan order, so the model is exact: any difference is a bug in the executor's
codec path (fragments, offsets, accumulate) or in the codec. Then error feedback over several steps, and
ranks running different codecs.
"""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="user codecs are compiled with numba (pip install numba)")

import pycoll  # noqa: E402
from pycoll.algorithms.compressed import build_compressed_plan  # noqa: E402
from pycoll.algorithms.plan import SENDS, Buf, OpKind  # noqa: E402
from pycoll.compression import ErrorFeedback  # noqa: E402
from pycoll.compression.user import UserCodec  # noqa: E402
from pycoll.errors import CollectiveMismatchError  # noqa: E402

EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")
if EXAMPLES not in sys.path:  # the rank processes import this module with the test process's sys.path
    sys.path.insert(0, EXAMPLES)

from sign_codec import SignCodec, numpy_decode, numpy_encode  # noqa: E402

ALGORITHMS = ("direct", "ring", "tree")
BLOCK = 256

_codecs: dict[int, SignCodec] = {}


def codec(block: int = BLOCK) -> SignCodec:
    """Compiled once per process (numba takes seconds)."""
    if block not in _codecs:
        _codecs[block] = SignCodec(block)
    return _codecs[block]


def gaussian(rank: int, count: int, seed: int) -> np.ndarray:
    return np.random.default_rng([seed, rank, count]).standard_normal(count).astype(np.float32)


# ---- the model ---------------------------------------------------------------------------------------------
def _q(v: np.ndarray) -> np.ndarray:
    """decode(encode(v)) in numpy: what a message of v carries (v starts on a block boundary)."""
    return numpy_decode(numpy_encode(v, BLOCK), v.size, BLOCK)


def model_allreduce(algorithm: str, inputs: list[np.ndarray], segment_blocks: int) -> list[np.ndarray]:
    """Every rank's result of a compressed sum all-reduce, as plan.py defines it (no residual).

    Messages carry decoded values: every rank decodes the same bytes, so only q(v) matters. Pure SENDs
    are posted when their step starts (after the fused op before them that sends to the same peer), the
    other ops complete in list order, channels are FIFO (see simulate.py)."""
    world, count = len(inputs), inputs[0].size
    plans = [build_compressed_plan(algorithm, r, world, count, BLOCK, segment_blocks) for r in range(world)]
    data = [x.copy() for x in inputs]  # INPUT and OUTPUT alias (in-place all-reduce)
    kept = [np.zeros(count, dtype=np.float32) for _ in range(world)]  # ENCODED, as its decoded values
    channels: dict[tuple[int, int], deque] = {}
    step = [0] * world
    position = [0] * world
    posted: list[set[int]] = [set() for _ in range(world)]
    started = [False] * world

    def read(r, buf_off, n):
        buf, off = buf_off
        return (kept[r] if buf == Buf.ENCODED else data[r])[off:off + n]

    def send(r, peer, values):
        channels.setdefault((r, peer), deque()).append(values.copy())

    def post_pure_sends(r, ops):
        last_sender: dict[int, int] = {}
        for i, o in enumerate(ops):
            if o.kind in SENDS:
                waits_for = last_sender.get(o.send_peer)
                last_sender[o.send_peer] = i
                ready = waits_for is None or waits_for in posted[r]
                if o.kind == OpKind.SEND and i not in posted[r] and ready:
                    v = read(r, o.src, o.count)
                    send(r, o.send_peer, v if o.src[0] == Buf.ENCODED else _q(v))
                    posted[r].add(i)

    def complete(r, o, msg):
        dst = slice(o.dst[1], o.dst[1] + o.count)
        if o.kind == OpKind.RECV:
            data[r][dst] = msg
        elif o.kind == OpKind.RECV_COPY_SEND:
            send(r, o.send_peer, msg)
            kept[r][dst] = data[r][dst] = msg
        else:
            v = read(r, o.src, o.count) + msg  # float32
            if o.kind == OpKind.RECV_REDUCE and not o.finalize:
                data[r][dst] = v
                return
            e = _q(v)
            if o.kind != OpKind.RECV_REDUCE:
                send(r, o.send_peer, e)
            if o.kind != OpKind.RECV_REDUCE_SEND:
                kept[r][dst] = data[r][dst] = e

    while any(step[r] < len(plans[r].steps) for r in range(world)):
        progressed = False
        for r in range(world):
            while step[r] < len(plans[r].steps):
                ops = plans[r].steps[step[r]]
                in_order = [(i, o) for i, o in enumerate(ops) if o.kind != OpKind.SEND]
                if not started[r]:
                    started[r] = True
                    post_pure_sends(r, ops)
                    progressed = True
                while position[r] < len(in_order):
                    i, o = in_order[position[r]]
                    queue = channels.get((o.recv_peer, r))
                    if not queue:
                        break
                    msg = queue.popleft()
                    assert msg.size == o.count, (r, step[r], i, msg.size, o.count)
                    complete(r, o, msg)
                    if o.kind in SENDS:
                        posted[r].add(i)
                        post_pure_sends(r, ops)
                    position[r] += 1
                    progressed = True
                if position[r] < len(in_order):
                    break
                step[r], position[r], posted[r], started[r] = step[r] + 1, 0, set(), False
                progressed = True
        assert progressed, "the model deadlocked"
    assert not any(channels.values()), "the model left messages unreceived"
    return data


def test_model_is_an_allreduce():
    """The model's own check: without compression error (inputs exactly representable after one
    quantization: constant blocks) every algorithm gives the exact sum."""
    count = 5 * BLOCK + 3
    inputs = [np.repeat(np.float32(r + 1), count) for r in range(3)]
    for algorithm in ALGORITHMS:
        for result in model_allreduce(algorithm, inputs, segment_blocks=2):
            assert np.array_equal(result, np.full(count, 6, dtype=np.float32)), algorithm


# ---- all-reduce, bit for bit -------------------------------------------------------------------------------
def body_allreduce(comm, rank, world, counts, seed):
    c = codec()
    results = {}
    for algorithm in ALGORITHMS:
        for count in counts:
            x = gaussian(rank, count, seed)
            out = pycoll.allreduce(x, compression=c, algorithm=algorithm, timeout=30)
            assert out is x
            results[algorithm, count] = x
    return comm.segment_bytes, results


@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_matches_the_model_bitwise(rank_pool, world):
    # 1, a partial block, whole blocks, some blocks per rank with a tail; the largest needs several
    # transport fragments per message (64 KiB slots in the test pools: 1820 blocks = 466k elements)
    counts = [1, 100, 4 * BLOCK, 37 * BLOCK + 5, 1_100_003]
    seed = 11
    results = rank_pool(world).run(body_allreduce, counts, seed, timeout=120)
    segment_bytes = results[0][0]
    segment_blocks = max(1, segment_bytes // codec().block_bytes)
    failures = []
    for count in counts:
        inputs = [gaussian(r, count, seed) for r in range(world)]
        exact = np.sum([v.astype(np.float64) for v in inputs], axis=0)
        for algorithm in ALGORITHMS:
            got = [res[algorithm, count] for _, res in results]
            label = f"world {world}, {algorithm}, count {count}"
            if not all(np.array_equal(g.view(np.uint32), got[0].view(np.uint32)) for g in got[1:]):
                failures.append(f"{label}: ranks disagree")
            want = model_allreduce(algorithm, inputs, segment_blocks)[0]
            bad = np.flatnonzero(got[0].view(np.uint32) != want.view(np.uint32))
            if bad.size:
                failures.append(f"{label}: {bad.size} elements differ from the model, first {bad[0]}: "
                                f"{got[0][bad[0]]!r} != {want[bad[0]]!r}")
            # and the compressed sum is a (very rough) sum: signs of large sums survive
            big = np.abs(exact) > 2 * np.sqrt(world)
            if count > BLOCK and np.mean(np.sign(got[0][big]) == np.sign(exact[big])) < 0.9:
                failures.append(f"{label}: the signs of large sums did not survive")
    assert not failures, "\n".join(failures)


# ---- error feedback ----------------------------------------------------------------------------------------
def body_error_feedback(comm, rank, world, algorithm, op, steps, count):
    """``steps`` all-reduces of fresh inputs with and without error feedback: per step, the worst error of
    the running sum of results, and how far the feedback identity (running sum = exact running sum - sum
    of the residuals) is from holding."""
    c = codec()
    state = ErrorFeedback()
    scale = world if op == "avg" else 1
    run_ef, run_plain, run_exact = np.zeros(count), np.zeros(count), np.zeros(count)
    err_ef, err_plain, identity = [], [], []
    for step in range(steps):
        inputs = [gaussian(r, count, 1000 + step) for r in range(world)]
        run_exact += np.sum([v.astype(np.float64) for v in inputs], axis=0)
        x = inputs[rank].copy()
        pycoll.allreduce(x, op, algorithm=algorithm, compression=c, residual=state, timeout=30)
        y = inputs[rank].copy()
        pycoll.allreduce(y, op, algorithm=algorithm, compression=c, timeout=30)
        run_ef += x.astype(np.float64) * scale
        run_plain += y.astype(np.float64) * scale
        err_ef.append(float(np.abs(run_ef - run_exact).mean()))
        err_plain.append(float(np.abs(run_plain - run_exact).mean()))
        res = state.residual.astype(np.float64)
        pycoll.allreduce(res, timeout=30)
        identity.append(float(np.abs(run_ef - (run_exact - res)).max() / max(np.abs(run_exact).max(), 1)))
    return err_ef, err_plain, identity


@pytest.mark.parametrize("world,algorithm,op", [(2, "direct", "sum"), (4, "direct", "avg"),
                                                (4, "ring", "sum")])
def test_error_feedback_keeps_the_running_sum_on_track(rank_pool, world, algorithm, op):
    steps = 30
    results = rank_pool(world).run(body_error_feedback, algorithm, op, steps, 4 * BLOCK + 77, timeout=120)
    err_ef, err_plain, identity = results[0]
    assert all(res == results[0] for res in results[1:]), "ranks disagree on the running sums"
    assert max(identity) < 1e-5, f"feedback identity off by {max(identity):.3g} (relative)"
    # without feedback the sign codec's error random-walks upwards; with it, it stays near one step's
    assert err_plain[-1] > 2 * err_plain[0]
    assert err_ef[-1] < err_plain[-1] / 3, (err_ef[-1], err_plain[-1])
    assert err_ef[-1] < 2 * max(err_ef[:5]), err_ef


# ---- ranks with different codecs ---------------------------------------------------------------------------
def body_mismatch(comm, rank, world):
    c = codec() if rank == 0 else UserCodec.from_numba("sign(block=256)", BLOCK, codec().block_bytes,
                                                       codec().tail_bytes, *_kernels(), version="other")
    x = gaussian(rank, 1000, 0)
    try:
        pycoll.allreduce(x, compression=c, timeout=10)
    except CollectiveMismatchError as e:
        return str(e)
    return None


def _kernels():
    import sign_codec

    return sign_codec._kernels(BLOCK)


def test_ranks_with_different_codecs_fail_with_a_mismatch(rank_pool):
    """Same layout, different definition (wire_id): detected from the message headers. Breaks the pool's
    communicator, so it runs last."""
    messages = rank_pool(2).run(body_mismatch, timeout=60)
    assert any(messages), "no rank noticed that the codecs differ"
    assert all(m is None or "codec" in m for m in messages), messages
