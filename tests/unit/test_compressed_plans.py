"""Compressed all-reduce plans, proved with the simulator: every algorithm, world sizes 1..9 and 16, counts
around the codec block and multi-segment, fp16 / int8 / int4 / stochastic codecs.

The simulator runs the plans exactly as the executor does (``codec_recv`` / ``pump_send`` in
csrc/engine/executor.cc), with ``pycoll.compression.reference`` producing the native codecs' bits. Checked:
every rank ends bitwise identical; the result lies within a derived per-element bound of the exact
(float64) sum, tight for direct (each share quantized once, the sum once) and looser for ring / tree (whose
partial sums are re-encoded on the way); plans are cut at codec blocks and never send OUTPUT; how often an
element is encoded; bytes on the wire; error feedback over many steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from pycoll.algorithms._layout import recv, recv_reduce, send
from pycoll.algorithms.compressed import (
    build_compressed_all_gather,
    build_compressed_plan,
    build_compressed_reduce_scatter,
)
from pycoll.algorithms.plan import READS_SRC, SENDS, WRITES_DST, Buf, Op, OpKind, Plan, make_plan
from pycoll.algorithms.simulate import PlanError, SimResult, check_plan, simulate
from pycoll.algorithms.tree import double_binary_tree
from pycoll.compression import FP16, Int4, Int8
from pycoll.compression import reference as ref
from pycoll.compression.codecs import Codec

F32 = np.float32
U = 2.0**-24  # float32 unit roundoff
ALGORITHMS = ("direct", "ring", "tree")
WORLDS = (*range(1, 10), 16)
CODECS = [FP16(), Int8(block=8), Int4(block=16), Int8(block=32, rounding="stochastic", seed=5)]
FP16_HALF_ULP = 2.0**-11
FP16_TINY = 2.0**-25  # half the spacing of fp16 subnormals


def ids(codec: Codec) -> str:
    return codec.name


def cases(codec: Codec, world: int) -> list[tuple[int, int]]:
    """(count, segment_blocks): empty, one element, a block +- 1, and several segments per chunk."""
    b = codec.block_elems
    plain = sorted({0, 1, max(b - 1, 1), b + 1})
    seg = 2 if b > 1 else 3
    multi = (world * 3 * seg + 1) * b + min(3, b - 1)  # three or four segments per chunk, a short last block
    return [(c, 1024) for c in plain] + [(multi, seg)]


def plans_for(algorithm: str, world: int, count: int, codec: Codec, segment_blocks: int) -> list[Plan]:
    return [build_compressed_plan(algorithm, r, world, count, codec.block_elems, segment_blocks)
            for r in range(world)]


def gaussian_inputs(world: int, count: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng([seed, world, count])
    # magnitudes differ per rank, so a bound that ignored whose share is quantized would show
    return [(rng.standard_normal(count) * (1 + r % 3)).astype(F32) for r in range(world)]


# ---- derived error bounds --------------------------------------------------------------------------------

def block_absmax(v: np.ndarray, block: int) -> np.ndarray:
    a = np.abs(np.asarray(v, dtype=np.float64))
    n = a.size
    if n == 0 or block == 1:
        return a
    padded = np.zeros(-(-n // block) * block)
    padded[:n] = a
    return np.repeat(padded.reshape(-1, block).max(axis=1), block)[:n]


def q(codec: Codec, magnitude: np.ndarray) -> np.ndarray:
    """Per element: the most one encode moves a value, for values bounded by ``magnitude`` (float64)."""
    if codec.kind == "fp16":
        return FP16_HALF_ULP * magnitude + FP16_TINY
    step_bound = codec.step_bound  # type: ignore[attr-defined]
    return np.asarray(step_bound(block_absmax(magnitude, codec.block_elems)), dtype=np.float64)


def q_final(codec: Codec, result: np.ndarray) -> np.ndarray:
    """The error of the final encode, known from its decoding ``result``. Nearest rounding keeps a block's
    absmax exactly (it gets the code +-qmax, which decodes to +-absmax); stochastic rounding may round it
    one step down, so the encoded value's absmax is at most qmax / (qmax - 1) times the result's."""
    r = np.abs(result.astype(np.float64))
    if codec.kind == "fp16":
        return FP16_HALF_ULP * r * (1 + 2.0**-10) + FP16_TINY
    if codec.rounding == "stochastic":
        qmax = codec.qmax  # type: ignore[attr-defined]
        r = block_absmax(r, codec.block_elems) * qmax / (qmax - 1)
    return q(codec, r)


def owners(res: SimResult, count: int) -> np.ndarray:
    """Per element, the rank that finalized it (exactly one)."""
    owner = np.full(count, -1)
    for r, regions in enumerate(res.finalized):
        for buf, off, n in regions:
            assert buf == Buf.OUTPUT
            assert (owner[off:off + n] == -1).all(), "an element finalized twice"
            owner[off:off + n] = r
    return owner


def error_bound(codec: Codec, algorithm: str, inputs: list[np.ndarray], result: np.ndarray,
                owner: np.ndarray, op: str) -> np.ndarray:
    """Per element: the largest |result - exact| (exact = the float64 sum, / world for avg).

    direct:    sum over the non-owners r of q(x_r) (each share encoded once, the owner's not at all)
               + q(final sum) + float32 rounding of the owner's world-term sum.
    ring/tree: every non-owner encodes every element once: raw inputs (at most sum_r q(x_r)) and at
               most world - 2 partial sums, whose magnitude is at most sum_r |x_r| plus the errors made
               before (children are encoded before parents, so iterating E += q(A + E) bounds them);
               then the final encode and world - 1 float32 additions.
    """
    world = len(inputs)
    x = np.stack(inputs).astype(np.float64)
    total_abs = np.abs(x).sum(axis=0)
    shares = np.stack([q(codec, np.abs(v)) for v in x])  # q(x_r) per rank and element
    if algorithm == "direct":
        mine = np.arange(world)[:, None] == owner[None, :]
        err = np.where(mine, 0.0, shares).sum(axis=0)
    else:
        err = shares.sum(axis=0)
        for _ in range(world - 2):
            err = err + q(codec, total_abs + err)
    sum_error = err + world * U * (total_abs + err) * 1.01  # before the final encode
    if op == "avg":
        return q_final(codec, result) + (sum_error + U * (total_abs + err)) / world * 1.01
    return q_final(codec, result) + sum_error


# ---- the sweep ------------------------------------------------------------------------------------------

def check_plans_are_block_aligned(plans: list[Plan], count: int, block: int) -> None:
    for p in plans:
        for o in p.ops():
            assert o.kind != OpKind.COPY
            assert not (o.kind == OpKind.SEND and o.src[0] == Buf.OUTPUT), "a SEND of OUTPUT (a re-encode)"
            assert o.dst[0] != Buf.ENCODED
            regions = ([o.src] if o.kind in READS_SRC else []) + ([o.dst] if o.kind in WRITES_DST else [])
            for _, off in regions:
                assert off % block == 0 or off == count, f"rank {p.rank} {o}: offset {off} not on a block"
                assert o.count % block == 0 or off + o.count == count, f"rank {p.rank} {o}: count {o.count}"


def expected_bytes(plans: list[Plan], codec: Codec) -> int:
    return sum(codec.encoded_bytes(o.count) for p in plans for o in p.ops() if o.kind in SENDS)


@pytest.mark.parametrize("codec", CODECS, ids=ids)
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_compressed_allreduce(algorithm: str, world: int, codec: Codec) -> None:
    for count, segment_blocks in cases(codec, world):
        where = f"{algorithm} world={world} count={count} {codec.name}"
        plans = plans_for(algorithm, world, count, codec, segment_blocks)
        check_plans_are_block_aligned(plans, count, codec.block_elems)
        inputs = gaussian_inputs(world, count, 1)
        res = simulate(plans, inputs, "sum", codec=codec, seed=11, seq=3)

        first = res.outputs[0].view(np.uint32)
        for r, out in enumerate(res.outputs):
            assert np.array_equal(out.view(np.uint32), first), f"{where}: rank {r} differs from rank 0"
        if world == 1:
            assert np.array_equal(res.outputs[0], inputs[0]) and not res.bytes_per_link
            continue
        assert all(w.all() for w in res.output_written), f"{where}: an element was never written"

        exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
        err = np.abs(res.outputs[0].astype(np.float64) - exact)
        bound = error_bound(codec, algorithm, inputs, res.outputs[0], owners(res, count), "sum")
        assert (err <= bound).all(), f"{where}: error {np.max(err / bound):.3g} x the bound"

        assert sum(res.bytes_per_link.values()) == expected_bytes(plans, codec), where
        depth = res.quantizations[0]
        assert all(np.array_equal(d, depth) for d in res.quantizations), "ranks disagree on the encodes"
        if count:
            if algorithm == "direct":
                assert (depth == 2).all(), f"{where}: direct encodes an element {np.unique(depth)} times"
            elif algorithm == "ring":
                assert (depth == world).all(), f"{where}: {np.unique(depth)}"
            else:
                heights = [t.height for t in double_binary_tree(world)]
                assert 2 <= depth.min() and depth.max() == max(heights) + 1, f"{where}: {np.unique(depth)}"


@pytest.mark.parametrize("codec", CODECS, ids=ids)
@pytest.mark.parametrize("world", (2, 3, 7, 16))
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_compressed_average(algorithm: str, world: int, codec: Codec) -> None:
    """avg divides the sum once, at the owner, before the one final encode: identical on every rank and
    within the bound of the exact mean."""
    for count, segment_blocks in cases(codec, world)[-2:]:
        plans = plans_for(algorithm, world, count, codec, segment_blocks)
        inputs = gaussian_inputs(world, count, 2)
        res = simulate(plans, inputs, "avg", codec=codec)
        for out in res.outputs[1:]:
            assert np.array_equal(out.view(np.uint32), res.outputs[0].view(np.uint32))
        exact = np.mean(np.stack(inputs).astype(np.float64), axis=0)
        err = np.abs(res.outputs[0].astype(np.float64) - exact)
        bound = error_bound(codec, algorithm, inputs, res.outputs[0], owners(res, count), "avg")
        where = f"{algorithm} world={world} count={count} {codec.name}"
        assert (err <= bound).all(), f"{where}: error {np.max(err / bound):.3g} x the bound"
        # and it is not a sum: compared with the sum's result it is about world times smaller
        total = simulate(plans, inputs, "sum", codec=codec).outputs[0]
        big = np.abs(total) > 1
        assert np.allclose(res.outputs[0][big] * world, total[big], rtol=0.3)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_rank_encodes_every_element_once(algorithm: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the algorithm, each rank encodes each element exactly once (its share, a partial sum or
    the final value); final values are forwarded as the owner's bytes, never re-encoded."""
    world, codec = 5, Int8(block=8)
    count = (world * 6 + 1) * 8 + 3
    encoded = np.zeros(count, dtype=np.int64)
    real = ref.encode

    def counting(codec_: Codec, x: np.ndarray, *args: object, **kwargs: object) -> tuple[np.ndarray, ...]:
        index = int(kwargs.get("index", 0))  # type: ignore[call-overload]
        encoded[index:index + np.asarray(x).size] += 1
        return real(codec_, x, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ref, "encode", counting)
    plans = plans_for(algorithm, world, count, codec, 2)
    simulate(plans, gaussian_inputs(world, count, 3), "sum", codec=codec)
    assert (encoded == world).all(), np.unique(encoded)


def test_direct_bound_is_tight() -> None:
    """The direct bound is not vacuous: some element uses a good part of it."""
    world, codec, count = 4, Int8(block=8), 4096
    plans = plans_for("direct", world, count, codec, 64)
    inputs = gaussian_inputs(world, count, 4)
    res = simulate(plans, inputs, "sum", codec=codec)
    err = np.abs(res.outputs[0].astype(np.float64) - np.sum(np.stack(inputs).astype(np.float64), axis=0))
    ratio = err / error_bound(codec, "direct", inputs, res.outputs[0], owners(res, count), "sum")
    assert 0.3 < ratio.max() <= 1


def test_stochastic_rounding_follows_seed_and_seq() -> None:
    world, codec = 3, Int4(block=16, rounding="stochastic", seed=1)
    count = 16 * 30 + 5
    plans = plans_for("ring", world, count, codec, 4)
    inputs = gaussian_inputs(world, count, 5)

    def result(**kw: int) -> np.ndarray:
        return simulate(plans, inputs, "sum", codec=codec, **kw).outputs[0]

    assert np.array_equal(result(seq=1), result(seq=1))
    assert np.array_equal(result(), result(seed=1)), "seed defaults to the codec's"
    assert not np.array_equal(result(seq=1), result(seq=2))
    assert not np.array_equal(result(seed=1), result(seed=2))


# ---- exact semantics on a small hand-checked case --------------------------------------------------------

def test_direct_two_ranks_by_hand() -> None:
    """world 2, avg, stochastic int8, residuals: every step of plan.py's "Compressed plans", in the
    reference codec's bits, rank 0 owning block 0 and rank 1 block 1."""
    codec = Int8(block=8, rounding="stochastic", seed=9)
    seq, count = 4, 13  # a full block and a short one
    plans = plans_for("direct", 2, count, codec, 8)
    rng = np.random.default_rng(6)
    x = [rng.standard_normal(count).astype(F32) for _ in range(2)]
    r0 = [(rng.standard_normal(count) * 0.01).astype(F32) for _ in range(2)]
    residuals = [r.copy() for r in r0]
    res = simulate(plans, x, "avg", codec=codec, residuals=residuals, seq=seq)

    key = [ref.rounding_key(9, rank, seq) for rank in range(2)]
    want_res = [r.copy() for r in r0]
    expected = np.zeros(count, dtype=F32)
    for owner, (lo, hi) in enumerate(((0, 8), (8, count))):
        other = 1 - owner
        share, _ = ref.encode(codec, x[other][lo:hi], want_res[other][lo:hi], 1.0, index=lo, key=key[other])
        total = ref.decode(codec, share, hi - lo, acc=x[owner][lo:hi], residual=want_res[owner][lo:hi],
                           divisor=2)
        _, expected[lo:hi] = ref.encode(codec, total, want_res[owner][lo:hi], 2.0, index=lo, key=key[owner])
    for rank in range(2):
        assert np.array_equal(res.outputs[rank].view(np.uint32), expected.view(np.uint32))
        assert np.array_equal(residuals[rank].view(np.uint32), want_res[rank].view(np.uint32))
    both = codec.encoded_bytes(8) + codec.encoded_bytes(5)  # a share of the peer's block, the final own block
    assert res.bytes_per_link == {(0, 1): both, (1, 0): both}


# ---- error feedback ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("algorithm,codec,op", [
    ("direct", Int4(block=16), "sum"),
    ("ring", Int8(block=8, rounding="stochastic", seed=2), "avg"),
    ("tree", Int4(block=32), "avg"),
])
def test_error_feedback_keeps_the_running_error_bounded(algorithm: str, codec: Codec, op: str) -> None:
    """With residuals, step t returns exactly sum_r (x_r + res_r[t-1]) - sum_r res_r[t] (over world for avg)
    up to float32 rounding, so the running sum of results minus the exact running sum is
    (sum_r res_r[0] - sum_r res_r[t]) / [world]: bounded, where without feedback it random-walks."""
    world, count, steps = 4, 2048, 100
    plans = plans_for(algorithm, world, count, codec, 64)
    rng = np.random.default_rng(7)
    residuals = [(rng.standard_normal(count) * 0.05).astype(F32) for _ in range(world)]
    initial = np.sum(np.stack(residuals).astype(np.float64), axis=0)
    div = world if op == "avg" else 1
    running = np.zeros(count)        # sum of results - exact sum, with feedback
    running_plain = np.zeros(count)  # the same without feedback
    slack = np.zeros(count)          # accumulated float32 rounding allowance
    rms = {}
    for t in range(1, steps + 1):
        x = [rng.standard_normal(count).astype(F32) for _ in range(world)]
        exact = np.sum(np.stack(x).astype(np.float64), axis=0) / div
        before = np.abs(np.stack(residuals).astype(np.float64)).sum(axis=0)
        out = simulate(plans, x, op, codec=codec, residuals=residuals, seq=t).outputs[0]
        plain = simulate(plans, x, op, codec=codec, seq=t).outputs[0]
        running += out - exact
        running_plain += plain - exact
        after = np.abs(np.stack(residuals).astype(np.float64)).sum(axis=0)
        magnitude = np.abs(np.stack(x).astype(np.float64)).sum(axis=0) + before + after + div * np.abs(out)
        slack += 4 * world * U * magnitude

        now = np.sum(np.stack(residuals).astype(np.float64), axis=0)
        identity = (initial - now) / div
        assert (np.abs(running - identity) <= slack).all(), (
            f"step {t}: running error departs from the residual identity by "
            f"{np.max(np.abs(running - identity) / slack):.3g} x the rounding allowance")
        if t in (10, steps):
            rms[t] = (np.sqrt(np.mean(running**2)), np.sqrt(np.mean(running_plain**2)))
    assert rms[steps][0] < 1.5 * rms[10][0], f"with feedback the error grew: {rms}"
    assert rms[steps][1] > 2 * rms[10][1], f"without feedback it should random-walk (~sqrt(10)): {rms}"
    assert rms[steps][0] < rms[steps][1]


# ---- what the simulator rejects in compressed plans ----------------------------------------------------

def small_plan(rank: int, steps: list[list[Op]], count: int = 16) -> Plan:
    return make_plan(rank, 2, "allreduce", "handmade", count, count, steps)


def test_send_of_a_region_never_kept_is_rejected() -> None:
    """SEND from ENCODED forwards bytes this rank kept; a region it never finalized or forwarded is a bug."""
    codec = Int8(block=8)
    plans = [small_plan(0, [[send(8, 1, (Buf.ENCODED, 0))]]), small_plan(1, [[recv(8, 0, (Buf.OUTPUT, 0))]])]
    with pytest.raises(PlanError, match=r"ENCODED\[0:8\].*never kept"):
        simulate(plans, [np.zeros(16, F32)] * 2, codec=codec)
    # kept by a finalizing receive-reduce in an earlier step, the same SEND is fine
    plans = [small_plan(0, [[recv_reduce(8, 1, (Buf.INPUT, 0), (Buf.OUTPUT, 0), finalize=True)],
                            [send(8, 1, (Buf.ENCODED, 0))]]),
             small_plan(1, [[send(8, 0, (Buf.INPUT, 0))], [recv(8, 0, (Buf.OUTPUT, 0))]])]
    out = simulate(plans, [np.full(16, 1, F32), np.full(16, 2, F32)], codec=codec).outputs
    assert out[0][:8].tolist() == out[1][:8].tolist() == [3.0] * 8


def test_check_plan_compressed_rules() -> None:
    from_encoded = small_plan(0, [[send(8, 1, (Buf.ENCODED, 0))]])
    check_plan(from_encoded, True, block=8)
    with pytest.raises(PlanError, match="ENCODED exists only in compressed plans"):
        check_plan(from_encoded, True)
    with pytest.raises(PlanError, match="sends OUTPUT"):
        check_plan(small_plan(0, [[send(8, 1, (Buf.OUTPUT, 0))]]), True, block=8)
    with pytest.raises(PlanError, match="not cut at codec blocks of 8"):
        check_plan(small_plan(0, [[send(4, 1, (Buf.INPUT, 4))]]), True, block=8)
    with pytest.raises(PlanError, match="not cut at codec blocks of 8"):
        check_plan(small_plan(0, [[send(12, 1, (Buf.INPUT, 0))]]), True, block=8)
    check_plan(small_plan(0, [[send(5, 1, (Buf.INPUT, 8))]], count=13), True, block=8)  # the short last block
    check_plan(small_plan(0, [[send(0, 1, (Buf.INPUT, 13))]], count=13), True, block=8)  # empty, at the end
    with pytest.raises(PlanError, match="only a compressed plan's SEND may read ENCODED"):
        check_plan(small_plan(0, [[recv_reduce(8, 1, (Buf.ENCODED, 0), (Buf.OUTPUT, 0))]]), True, block=8)
    copy = Op(OpKind.COPY, 8, src=(Buf.INPUT, 0), dst=(Buf.OUTPUT, 8))
    with pytest.raises(PlanError, match="cannot COPY"):
        check_plan(small_plan(0, [[copy]]), True, block=8)
    racy = [send(8, 1, (Buf.ENCODED, 0)), recv(8, 1, (Buf.OUTPUT, 0))]  # the SEND may read before the keep
    with pytest.raises(PlanError, match=r"reads ENCODED\[0:8\] while op 1 of the same step writes"):
        check_plan(small_plan(0, [racy]), True, block=8)


def test_compressed_simulation_arguments() -> None:
    codec = Int8(block=8)
    plans = plans_for("direct", 2, 16, codec, 2)
    x = [np.zeros(16, F32)] * 2
    with pytest.raises(ValueError, match="float32 sums and averages"):
        simulate(plans, [v.astype(np.float64) for v in x], codec=codec)
    with pytest.raises(ValueError, match="float32 sums and averages"):
        simulate(plans, x, "max", codec=codec)
    with pytest.raises(ValueError, match="must alias"):
        simulate(plans, x, codec=codec, inplace=False)
    with pytest.raises(ValueError, match="need codec="):
        simulate(plans, x, residuals=[np.zeros(16, F32)] * 2)
    with pytest.raises(ValueError, match=r"residuals\[1\]"):
        simulate(plans, x, codec=codec, residuals=[np.zeros(16, F32), np.zeros(15, F32)])
    with pytest.raises(ValueError, match=r"residuals\[0\]"):
        simulate(plans, x, codec=codec, residuals=[np.zeros(16), np.zeros(16, F32)])
    # a plain (uncompressed) plan cannot run compressed: it sends OUTPUT
    from pycoll.algorithms import build_plan

    plain = [build_plan("allreduce", "direct", r, 2, 16) for r in range(2)]
    with pytest.raises(PlanError, match="sends OUTPUT"):
        simulate(plain, x, codec=codec)


# ---- reduce-scatter: direct, each element encoded once by its sender ---------------------------------------
@pytest.mark.parametrize("world", (2, 3, 4, 7))
@pytest.mark.parametrize("codec", [Int8(block=64), Int4(block=16), FP16()], ids=ids)
def test_compressed_reduce_scatter_plan(world: int, codec: Codec) -> None:
    """Every finalizing op is an exact RECV_REDUCE into the owner's chunk; every op starts on a block of
    its chunk; each rank sends each other rank's chunk once, encoded: (world - 1) * encoded_bytes(m)."""
    block = codec.block_elems
    for m, segment_blocks in [(0, 1), (1, 1), (block + 1, 1), (5 * block + 3, 2), (1 << 18, 64)]:
        for rank in range(world):
            plan = build_compressed_reduce_scatter(rank, world, m, block, segment_blocks)
            assert (plan.input_count, plan.output_count) == (world * m, m)
            ops = list(plan.ops())
            finals = [o for o in ops if o.finalize]
            assert all(o.kind == OpKind.RECV_REDUCE and o.exact and o.dst[0] == Buf.OUTPUT for o in finals)
            assert sum(o.count for o in finals) == m
            for o in ops:
                buf, off = o.src if o.kind == OpKind.SEND else o.dst
                assert (off % m if buf == Buf.INPUT and m else off) % block == 0 or o.count == 0
                assert o.count <= segment_blocks * block
            sends = [o for o in ops if o.kind == OpKind.SEND]
            assert all(o.src[0] == Buf.INPUT for o in sends)
            sent = sum(ref.encoded_bytes(codec, o.count) for o in sends)
            assert sent == (world - 1) * ref.encoded_bytes(codec, m)
            if m == 1 << 18:  # against (N-1)/N * M * (bits + scale bits / block), M the input's elements
                bits = 8 * codec.block_bytes / block
                formula = (world - 1) / world * (world * m) * bits / 8
                assert abs(sent / formula - 1) < 0.02


def test_compressed_reduce_scatter_and_all_gather_need_two_ranks_and_exact_is_final() -> None:
    with pytest.raises(ValueError, match="world >= 2"):
        build_compressed_reduce_scatter(0, 1, 10, 8, 1)
    for op in (dict(kind=OpKind.RECV_REDUCE, recv_peer=1), dict(kind=OpKind.SEND, send_peer=1)):
        with pytest.raises(ValueError, match="only a finalizing RECV_REDUCE or a COPY keeps its value exact"):
            Op(count=4, exact=True, **op)
    with pytest.raises(ValueError, match="world >= 2"):
        build_compressed_all_gather(0, 1, 10, 8, 1)


# ---- all-gather: direct, each chunk encoded once by its owner ----------------------------------------------
@pytest.mark.parametrize("world", (2, 3, 5))
@pytest.mark.parametrize("exact_own", (False, True))
def test_compressed_all_gather_plan(world: int, exact_own: bool) -> None:
    """One COPY encodes the own chunk (exact when asked); every SEND forwards those bytes from ENCODED and
    its peer receives them into that chunk of OUTPUT; each rank sends its chunk to every other rank once:
    (world - 1) * encoded_bytes(m) bytes."""
    codec = Int8(block=64)
    block = codec.block_elems
    for m, segment_blocks in [(0, 1), (1, 1), (block + 1, 1), (5 * block + 3, 2), (1 << 18, 64)]:
        plans = [
            build_compressed_all_gather(r, world, m, block, segment_blocks, exact_own) for r in range(world)
        ]
        for rank, plan in enumerate(plans):
            assert (plan.input_count, plan.output_count) == (m, world * m)
            ops = list(plan.ops())
            copies = [o for o in ops if o.kind == OpKind.COPY]
            assert plan.steps[0] == tuple(copies)  # before any SEND of its bytes
            assert [(o.count, o.src, o.dst, o.exact) for o in copies] == [
                (m, (Buf.INPUT, 0), (Buf.OUTPUT, rank * m), exact_own)
            ]
            sends = [o for o in ops if o.kind == OpKind.SEND]
            assert all(o.src[0] == Buf.ENCODED and (o.src[1] - rank * m) % block == 0 for o in sends)
            sent = sum(ref.encoded_bytes(codec, o.count) for o in sends)
            assert sent == (world - 1) * ref.encoded_bytes(codec, m)
            for q in range(world):
                if q == rank:
                    continue
                got = [(o.dst, o.count) for o in ops if o.kind == OpKind.RECV and o.recv_peer == q]
                sent = [((Buf.OUTPUT, o.src[1]), o.count) for o in plans[q].ops()
                        if o.kind == OpKind.SEND and o.send_peer == rank]
                assert got == sent  # in order, into chunk q where q encoded it
