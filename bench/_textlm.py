"""A small character-level language model on the Python standard library's own source: the data, the
model and its held-out evaluation, shared by the training benchmarks (bench/fsdp_links.py, and issue 37's
bench/time_to_loss.py).

    corpus = load_corpus()                                  # stdlib .py files, split by file
    cfg = ModelConfig(width=256, depth=4, heads=4, context=64)
    model = build_model(cfg, seed=0)                        # the same weights on every rank
    x, y = rank_batch(corpus.train, step, seed=0, batch=8, context=cfg.context, rank=r, world=4)
    loss = lm_loss(model, x, y)
    held = evaluate(model, eval_batches(corpus.heldout, 16, 8, cfg.context, seed=0))

**Data.** Every ``*.py`` file under ``sysconfig.get_paths()["stdlib"]`` (installed packages, which
some installations keep inside that folder, left out), sorted by relative path. A file belongs to the
held-out part when the SHA-256 of its relative path, read as a number, falls in the lowest
``heldout_fraction`` of the range: a fixed rule per file, so the split does not move when other files
come or go, and no file is in both parts. Each part is its files' bytes joined with a NUL byte between
files. The vocabulary is the 256 byte values (no tokenizer to build or save). The text depends on the
Python version installed; ``Corpus.fingerprint`` names it, so results from different versions are not
compared unknowingly.

**Batches.** Step ``s`` of a run with seed ``k`` draws ``batch * world`` windows of ``context + 1``
bytes at offsets from a generator seeded from (k, s) alone; rank ``r`` takes rows ``r*batch ..
(r+1)*batch``. Every variant of a run, and every world size with the same global batch, therefore sees
exactly the same bytes in the same order. Held-out batches are drawn the same way from the held-out part
with their own seed.

**Model.** A decoder-only transformer in plain torch (GPT-2's shape, pre-LayerNorm): byte and position
embeddings, ``depth`` blocks of causal self-attention and a GELU MLP, a final LayerNorm and an untied
output layer. No dropout, so a run is a function of its seed and its communication alone.
"""

from __future__ import annotations

import hashlib
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import nn
from torch.nn import functional as F

#: Bytes are the tokens.
VOCAB = 256
#: Put between two files of a part (a byte that source text does not contain).
FILE_SEPARATOR = b"\0"


# ---------------------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class Corpus:
    """The two parts of the text: uint8 tensors of bytes, and the relative paths that went into each."""

    train: torch.Tensor
    heldout: torch.Tensor
    train_files: tuple[str, ...]
    heldout_files: tuple[str, ...]
    #: Python version, number of files and a hash of the paths and sizes: what text this was.
    fingerprint: str

    def describe(self) -> str:
        """One line: how many files and bytes each part has."""
        return (
            f"corpus {self.fingerprint}: train {len(self.train_files)} files "
            f"{self.train.numel() / 1e6:.1f} MB, held-out {len(self.heldout_files)} files "
            f"{self.heldout.numel() / 1e6:.1f} MB"
        )


def stdlib_root() -> Path:
    """The standard library's folder (``sysconfig.get_paths()["stdlib"]``)."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[str]:
    """Relative paths (POSIX form, sorted) of the ``*.py`` files under ``root`` (default: the standard
    library), leaving out installed packages (site-packages, dist-packages) and symbolic links."""
    root = stdlib_root() if root is None else root
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if {"site-packages", "dist-packages"} & set(rel.parts) or path.is_symlink() or not path.is_file():
            continue
        out.append(rel.as_posix())
    return sorted(out)


def is_heldout(relative_path: str, heldout_fraction: float) -> bool:
    """Whether a file goes to the held-out part: SHA-256 of its path, as a fraction of 2**64, is below
    ``heldout_fraction``."""
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") < heldout_fraction * 2.0**64


def split_files(files: Iterable[str], heldout_fraction: float = 0.1) -> tuple[list[str], list[str]]:
    """(train, held-out) relative paths, each in sorted order, by ``is_heldout``."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    train, heldout = [], []
    for f in sorted(files):
        (heldout if is_heldout(f, heldout_fraction) else train).append(f)
    return train, heldout


def _join(root: Path, files: Sequence[str]) -> torch.Tensor:
    """The files' bytes with FILE_SEPARATOR between them, as a uint8 tensor."""
    data = FILE_SEPARATOR.join((root / f).read_bytes() for f in files)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _fingerprint(root: Path, files: Sequence[str]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f}\0{(root / f).stat().st_size}\n".encode())
    version = sysconfig.get_python_version()
    return f"py{version}-{len(files)}files-{h.hexdigest()[:12]}"


def load_corpus(heldout_fraction: float = 0.1, root: Path | None = None) -> Corpus:
    """The standard library's source (or ``root``'s ``*.py`` files) split into train and held-out parts
    by file (module docstring)."""
    root = stdlib_root() if root is None else root
    files = stdlib_files(root)
    train, heldout = split_files(files, heldout_fraction)
    if not train or not heldout:
        raise ValueError(f"{root}: {len(files)} .py files do not make a train and a held-out part")
    return Corpus(
        _join(root, train), _join(root, heldout), tuple(train), tuple(heldout), _fingerprint(root, files)
    )


def _generator(seed: int, step: int, stream: str) -> torch.Generator:
    """A torch generator seeded from (seed, step, stream) alone."""
    digest = hashlib.sha256(f"{stream}:{seed}:{step}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)


def windows(
    data: torch.Tensor, rows: int, context: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` random windows of ``data``: inputs (rows, context) and next-byte targets, int64."""
    if data.numel() <= context + 1:
        raise ValueError(f"{data.numel()} bytes are too few for a context of {context}")
    starts = torch.randint(0, data.numel() - context - 1, (rows,), generator=gen)
    idx = starts[:, None] + torch.arange(context + 1)[None, :]
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


def global_batch(
    data: torch.Tensor, step: int, seed: int, rows: int, context: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s whole batch of ``rows`` windows (every rank's rows), from (seed, step) alone."""
    return windows(data, rows, context, _generator(seed, step, "train"))


def rank_batch(
    data: torch.Tensor, step: int, seed: int, batch: int, context: int, rank: int, world: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s ``batch`` rows of step ``step``'s global batch of ``batch * world`` rows."""
    x, y = global_batch(data, step, seed, batch * world, context)
    rows = slice(rank * batch, (rank + 1) * batch)
    return x[rows], y[rows]


def eval_batches(
    data: torch.Tensor, count: int, batch: int, context: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` fixed batches of ``batch`` windows (held-out text, usually): the same for every run
    with the same seed."""
    return [windows(data, batch, context, _generator(seed, i, "eval")) for i in range(count)]


# ---------------------------------------------------------------------------------------------------------
# Model


@dataclass(frozen=True)
class ModelConfig:
    """The transformer's shape. ``context``: the longest input (positions learned)."""

    width: int = 256
    depth: int = 4
    heads: int = 4
    context: int = 64
    mlp_ratio: int = 4
    vocab: int = VOCAB

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")

    def parameter_count(self) -> int:
        """Parameters of ``TinyGPT(self)`` (weights and biases)."""
        w, h = self.width, self.width * self.mlp_ratio
        block = 2 * 2 * w + (w * 3 * w + 3 * w) + (w * w + w) + (w * h + h) + (h * w + w)
        return self.vocab * w + self.context * w + self.depth * block + 2 * w + (w * self.vocab + self.vocab)

    def matmul_flops_per_token(self) -> int:
        """Forward + backward floating-point operations per token (6 per weight of a matmul, plus
        attention's scores and weighted sum: 6 * 2 * context/2 * width per layer, causal)."""
        w, h = self.width, self.width * self.mlp_ratio
        weights = self.depth * (3 * w * w + w * w + 2 * w * h) + w * self.vocab
        attention = self.depth * 2 * (self.context // 2) * w
        return 6 * (weights + attention)


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention where position t sees positions <= t only."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """One pre-LayerNorm transformer block: x + attention(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.width * cfg.mlp_ratio
        self.ln1 = nn.LayerNorm(cfg.width)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, hidden), nn.GELU(), nn.Linear(hidden, cfg.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer over bytes: ``forward(idx)`` gives logits (batch, time, vocab)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.ln_f = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"input of {t} positions, context is {self.cfg.context}")
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: normal(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def build_model(cfg: ModelConfig, seed: int) -> TinyGPT:
    """A ``TinyGPT`` whose weights depend on ``seed`` alone (the global torch RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyGPT(cfg)
        model.apply(_init_weights)
    return model


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy (nats per byte) of ``model`` on inputs ``x``, targets ``y``."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean loss of ``model`` over ``batches`` (each weighted by its number of targets)."""
    total, count = 0.0, 0
    for x, y in batches:
        total += float(lm_loss(model, x, y)) * y.numel()
        count += y.numel()
    return total / max(count, 1)


def learning_rate(step: int, steps: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps to ``peak``, then cosine decay to ``floor * peak`` at
    ``steps``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return peak * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))
