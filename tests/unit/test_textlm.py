"""bench/_textlm.py, the data and model of the training benchmarks: the train / held-out split is by file,
deterministic and disjoint; batches depend on (seed, step) alone and ranks share one global batch; the
model is causal; the FSDP unit sizes of bench/_fsdp_train.py add up to the model."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from _bench_scripts import load  # noqa: E402

textlm = load("_textlm.py", "_textlm")  # as bench/_fsdp_train.py imports it
fsdp_train = load("_fsdp_train.py", "_fsdp_train")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small folder of .py files (one inside site-packages, which must be left out)."""
    root = tmp_path_factory.mktemp("stdlib")
    for i in range(40):
        sub = root / ("pkg" if i % 3 else "") / f"m{i}.py"
        sub.parent.mkdir(parents=True, exist_ok=True)
        sub.write_text(f"# module {i}\n" + "x = 1\n" * (50 + i))
    (root / "site-packages" / "dep").mkdir(parents=True)
    (root / "site-packages" / "dep" / "installed.py").write_text("y = 2\n")
    (root / "notes.txt").write_text("not python\n")
    return root


def test_split_is_by_file_disjoint_complete_and_stable(tree: Path) -> None:
    files = textlm.stdlib_files(tree)
    assert files == sorted(files) and len(files) == 40
    assert not any("site-packages" in f for f in files)
    train, held = textlm.split_files(files, 0.25)
    assert set(train).isdisjoint(held) and sorted(train + held) == files
    assert held, "a quarter of 40 files held out: some must be"
    # the rule is per file: removing other files (or reordering) moves no file to the other part
    train2, held2 = textlm.split_files(list(reversed(files[::2])), 0.25)
    assert set(held2) == set(held) & set(files[::2]) and set(train2) == set(train) & set(files[::2])


def test_corpus_parts_hold_their_files_bytes(tree: Path) -> None:
    corpus = textlm.load_corpus(0.25, root=tree)
    again = textlm.load_corpus(0.25, root=tree)
    assert corpus.fingerprint == again.fingerprint and torch.equal(corpus.train, again.train)
    sizes = [(tree / f).stat().st_size for f in corpus.heldout_files]
    assert corpus.heldout.numel() == sum(sizes) + len(sizes) - 1  # one separator between files
    assert corpus.heldout.dtype == torch.uint8


def test_the_real_standard_library_splits() -> None:
    files = textlm.stdlib_files()
    train, held = textlm.split_files(files)
    assert len(files) > 100 and set(train).isdisjoint(held)
    assert 0.03 < len(held) / len(files) < 0.2


def test_batches_depend_on_seed_and_step_alone_and_ranks_share_a_global_batch() -> None:
    data = torch.arange(5000, dtype=torch.int64).to(torch.uint8)
    x, y = textlm.global_batch(data, step=3, seed=7, rows=8, context=16)
    assert x.shape == y.shape == (8, 16) and torch.equal(x[:, 1:], y[:, :-1])
    again = textlm.global_batch(data, step=3, seed=7, rows=8, context=16)
    assert torch.equal(x, again[0])
    assert not torch.equal(x, textlm.global_batch(data, step=4, seed=7, rows=8, context=16)[0])
    parts = [textlm.rank_batch(data, 3, 7, 2, 16, rank, 4)[0] for rank in range(4)]
    assert torch.equal(torch.cat(parts), x)
    evals = textlm.eval_batches(data, 3, 4, 16, seed=1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(evals, textlm.eval_batches(data, 3, 4, 16, seed=1)))


def test_model_is_causal_and_counts_its_parameters() -> None:
    cfg = textlm.ModelConfig(width=32, depth=2, heads=4, context=24)
    model = textlm.build_model(cfg, seed=3)
    assert sum(p.numel() for p in model.parameters()) == cfg.parameter_count()
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 15:] = (changed[:, 15:] + 1) % 256  # change every byte from position 15 on
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[:, :15], b[:, :15]), "a later byte changed an earlier position's logits"
    assert not torch.allclose(a[:, 15:], b[:, 15:])
    same = textlm.build_model(cfg, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), same.parameters()))


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    lr = [textlm.learning_rate(s, 100, 1.0, 10) for s in range(101)]
    assert lr[0] == pytest.approx(0.1) and lr[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lr[9:], lr[10:])) and lr[100] == pytest.approx(0.1)


@pytest.mark.parametrize("world", [1, 3, 4])
def test_fsdp_units_cover_the_model(world: int) -> None:
    cfg = textlm.ModelConfig(width=32, depth=3, heads=4, context=24)
    units = fsdp_train.fsdp_units(cfg, world)
    assert len(units) == cfg.depth + 1 and [g for _, _, g in units] == [2] * cfg.depth + [1]
    total = sum(numel for _, numel, _ in units) * world
    assert cfg.parameter_count() <= total < cfg.parameter_count() + world * 64 * cfg.width
