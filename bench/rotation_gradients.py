"""How much the Hadamard rotation saves int4 and int8 on real gradients.

    python bench/rotation_gradients.py                  # 4 ranks, gradients at steps 0, 100, 300
    python bench/rotation_gradients.py --quick          # a tiny model, a few steps

The gradients are real: a small byte-level transformer (bench/_textlm.py: the Python standard library's
own source as text) is trained in this one process with AdamW, and at the chosen steps each of ``--ranks``
ranks' gradients is taken on its own micro-batch of that step, as data-parallel ranks would have them.
Each rank's gradients are flattened in parameter order (FSDP2's flat order), and the compressed
reduce-scatter of them is computed exactly as pycoll's direct plan does it: chunk r is rank r's; every
other rank's share of it is quantized once (``codec.roundtrip`` on the chunk as one part: rotated, encoded,
decoded, rotated back, with the native loops) and the owner adds its own exact share. The error is
the relative L2 error of the whole reduce-scatter result against the float64 sum, per codec, with and
without rotation; and per kind of tensor (embeddings, attention, MLP, norms and biases) at the last step.
Also shown: the gradients' block outlier ratio (the mean over blocks of absmax / RMS of the block; 1.7 for
Gaussian blocks of 32), what the rotation flattens.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
# bench/ goes last: its profile.py would otherwise shadow the standard library's, which torch imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import _textlm as lm  # noqa: E402  (bench/_textlm.py)

from pycoll.compression import Int4, Int8  # noqa: E402

CODECS = {
    "int4": Int4(),
    "int4 + rotation": Int4(rotation="hadamard"),
    "int8": Int8(),
    "int8 + rotation": Int8(rotation="hadamard"),
}


def kind_of(name: str) -> str:
    if name.startswith(("tok", "pos", "head")):
        return "embeddings / head"
    if ".attn." in name and name.endswith("weight"):
        return "attention weights"
    if ".mlp." in name and name.endswith("weight"):
        return "MLP weights"
    return "norms and biases"


def rank_gradients(model: torch.nn.Module, data: torch.Tensor, step: int, args: argparse.Namespace
                   ) -> list[np.ndarray]:
    """Each rank's flat float32 gradient of step ``step`` (its own rows of the step's global batch)."""
    grads = []
    for rank in range(args.ranks):
        model.zero_grad(set_to_none=True)
        x, y = lm.rank_batch(data, step, args.seed, args.batch, args.context, rank, args.ranks)
        lm.lm_loss(model, x, y).backward()
        grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().copy())
    return grads


def reduce_scatter_error(codec, grads: list[np.ndarray], mask: np.ndarray | None = None) -> float:
    """Relative L2 error of the compressed direct reduce-scatter of ``grads`` (over ``mask``'s elements)."""
    world = len(grads)
    n = grads[0].size // world * world
    m = n // world
    exact = np.sum([g[:n].astype(np.float64) for g in grads], axis=0)
    got = np.empty(n)
    for owner in range(world):
        chunk = slice(owner * m, (owner + 1) * m)
        total = grads[owner][chunk].astype(np.float64)
        for s in range(world):
            if s != owner:
                total = total + codec.roundtrip(grads[s][chunk])
        got[chunk] = total
    keep = slice(None) if mask is None else mask[:n]
    return float(np.linalg.norm((got - exact)[keep]) / np.linalg.norm(exact[keep]))


def outlier_ratio(g: np.ndarray, block: int = 32) -> float:
    blocks = g[: g.size // block * block].reshape(-1, block).astype(np.float64)
    rms = np.sqrt((blocks**2).mean(axis=1))
    ok = rms > 0
    return float((np.abs(blocks).max(axis=1)[ok] / rms[ok]).mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", default="0,100,300", help="steps at which gradients are taken")
    p.add_argument("--batch", type=int, default=8, help="rows per rank")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    cfg = lm.ModelConfig(width=64, depth=2, heads=2, context=32) if args.quick else lm.ModelConfig()
    if args.quick:
        args.steps, args.context = "0,10", 32
    steps = sorted(int(s) for s in args.steps.split(","))
    torch.manual_seed(args.seed)
    corpus = lm.load_corpus()
    model = lm.build_model(cfg, args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    params = model.named_parameters()
    kinds = np.concatenate([np.full(p.numel(), kind_of(n), dtype=object) for n, p in params])
    shape = f"{args.ranks} ranks x {args.batch} rows x {args.context} bytes"
    print(f"# {cfg.parameter_count():,} parameters, {shape}")
    print(f"# {'step':>5} {'outliers':>8} " + " ".join(f"{c:>16}" for c in CODECS))
    last = None
    for step in range(steps[-1] + 1):
        if step in steps:
            grads = rank_gradients(model, corpus.train, step, args)
            errors = [reduce_scatter_error(c, grads) for c in CODECS.values()]
            print(f"  {step:>5} {outlier_ratio(grads[0]):>8.2f} " + " ".join(f"{e:>16.3%}" for e in errors))
            last = grads
        model.zero_grad(set_to_none=True)
        x, y = lm.rank_batch(corpus.train, step, args.seed, args.batch * args.ranks, args.context, 0, 1)
        lm.lm_loss(model, x, y).backward()
        opt.step()
    assert last is not None
    print(f"\n# step {steps[-1]}, by kind of tensor (relative L2 error of the reduce-scatter)")
    print(f"# {'tensors':<20} {'elements':>9} " + " ".join(f"{c:>16}" for c in CODECS))
    for kind in ("embeddings / head", "attention weights", "MLP weights", "norms and biases"):
        mask = kinds == kind
        errors = [reduce_scatter_error(c, last, mask) for c in CODECS.values()]
        print(f"  {kind:<20} {int(mask.sum()):>9} " + " ".join(f"{e:>16.3%}" for e in errors))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
