from pathlib import Path

import numpy as np
import pytest
import torch

from recipetune.trainer.data import (
    STDLIB_MAX_BYTES,
    ByteTokenizer,
    DataError,
    GlobalBatchSampler,
    StepBatches,
    eval_batches,
    load_corpus,
    make_loader,
    split_micro_batches,
)


def test_byte_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    text = "plain ascii, ünïcödé, 日本語, emoji 🚀\n"
    ids = tok.encode(text)
    assert ids.dtype == np.uint16 and ids.max() < tok.vocab_size == 256
    assert len(ids) == len(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.decode(torch.from_numpy(ids.astype(np.int64))) == text
    assert tok.decode(ids[:-3]).endswith("\ufffd")  # a cut multi-byte char is replaced, not an error


def test_stdlib_corpus_is_deterministic_and_cached(tmp_path: Path) -> None:
    a = load_corpus("stdlib", cache_dir=tmp_path)
    assert a.n_tokens > 1_000_000 and a.n_tokens <= STDLIB_MAX_BYTES
    assert a.vocab_size == 256 and a.name == "stdlib"
    cached = list(tmp_path.glob("stdlib-*.npy"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    b = load_corpus("stdlib", cache_dir=tmp_path)
    assert cached[0].stat().st_mtime_ns == mtime  # the second load read the cache, did not rebuild
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    assert np.array_equal(a.train, b.train) and np.array_equal(a.val, b.val)
    # the val split is the contiguous tail: train + val is exactly the whole corpus
    whole = np.load(cached[0])
    assert len(a.train) + len(a.val) == len(whole)
    assert np.array_equal(np.concatenate([a.train, a.val]), whole)
    assert len(a.val) == int(len(whole) * 0.05)
    assert b"def " in a.train[:100_000].astype(np.uint8).tobytes()  # real Python source


def test_stdlib_cache_dir_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "envcache"))
    load_corpus("stdlib")
    assert list((tmp_path / "envcache").glob("stdlib-*.npy"))


def test_text_folder_corpus(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.txt").write_text("second file " * 50)
    (tmp_path / "a.md").write_text("first file ü " * 50)
    (tmp_path / "sub" / "c.py").write_text("print('third')\n" * 50)
    (tmp_path / "skip.bin.bak").write_text("not text")
    c = load_corpus(str(tmp_path), val_fraction=0.1)
    blob = np.concatenate([c.train, c.val]).astype(np.uint8).tobytes().decode()
    # sorted path order: a.md, b.txt, sub/c.py; each file ends in a newline
    assert blob.startswith("first file ü") and blob.index("second") < blob.index("third")
    assert "not text" not in blob
    assert c.vocab_size == 256 and len(c.val) == int(c.n_tokens * 0.1)
    assert load_corpus(str(tmp_path), val_fraction=0.1).fingerprint == c.fingerprint
    assert load_corpus(str(tmp_path), val_fraction=0.2).fingerprint != c.fingerprint
    single = load_corpus(tmp_path / "b.txt")
    assert single.n_tokens == len("second file " * 50) + 1


def test_bin_file_corpus(tmp_path: Path) -> None:
    data = np.arange(1000, dtype=np.uint16) % 500
    data.tofile(tmp_path / "tokens.bin")
    c = load_corpus(str(tmp_path / "tokens.bin"), val_fraction=0.1)
    assert isinstance(c.train, np.memmap)
    assert np.array_equal(np.concatenate([c.train, c.val]), data)
    assert len(c.val) == 100
    assert c.vocab_size == 512  # max 499 + 1, rounded up to a multiple of 64
    assert load_corpus(str(tmp_path / "tokens.bin"), vocab_size=50257).vocab_size == 50257


def test_bin_folder_corpus(tmp_path: Path) -> None:
    train, val = np.arange(2000, dtype=np.uint16), np.arange(300, dtype=np.uint16) + 7
    train.tofile(tmp_path / "train.bin")
    val.tofile(tmp_path / "val.bin")
    c = load_corpus(str(tmp_path), val_fraction=0.5)  # the folder's own split wins
    assert np.array_equal(c.train, train) and np.array_equal(c.val, val)
    assert c.vocab_size == 2048


@pytest.mark.parametrize("make", ["missing", "empty_dir", "bad_ext", "half_bin", "odd_bin"])
def test_bad_specs_raise_data_error_naming_the_path(tmp_path: Path, make: str) -> None:
    target = tmp_path / make
    if make == "empty_dir":
        target.mkdir()
    elif make == "bad_ext":
        target = tmp_path / "weights.pt"
        target.write_bytes(b"xx")
    elif make == "half_bin":
        target.mkdir()
        np.arange(10, dtype=np.uint16).tofile(target / "train.bin")
    elif make == "odd_bin":
        target = tmp_path / "odd.bin"
        target.write_bytes(b"abc")
    with pytest.raises(DataError) as e:
        load_corpus(str(target))
    assert str(target) in str(e.value)


def test_sampler_depends_only_on_seed_and_step() -> None:
    a, b = GlobalBatchSampler(10_000, 64, 16, seed=3), GlobalBatchSampler(10_000, 64, 16, seed=3)
    assert np.array_equal(a.offsets(5), b.offsets(5))
    assert np.array_equal(a.offsets(5), a.offsets(5))  # no hidden state advanced by a call
    assert not np.array_equal(a.offsets(5), a.offsets(6))
    assert not np.array_equal(a.offsets(5), GlobalBatchSampler(10_000, 64, 16, seed=4).offsets(5))
    for world in (1, 2, 4, 8, 16):
        parts = [a.rank_slice(5, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate(parts), a.offsets(5))
    with pytest.raises(ValueError, match="world_size=3"):
        a.rank_slice(5, 0, 3)
    offs = np.concatenate([a.offsets(s) for s in range(200)])
    assert offs.dtype == np.int64 and offs.min() >= 0 and offs.max() <= 10_000 - 64 - 1


def test_micro_batches_cover_the_same_rows_in_order() -> None:
    tokens = np.arange(5000, dtype=np.uint16)
    sampler = GlobalBatchSampler(len(tokens), 32, 16, seed=0)
    batch = StepBatches(tokens, sampler, rank=0, world_size=1, start_step=0, num_steps=1)[0]
    assert batch.shape == (16, 33) and batch.dtype == torch.int64
    # tokens are their own positions, so each row must be one contiguous in-bounds window
    assert torch.equal(batch[:, 0], torch.from_numpy(sampler.offsets(0)))
    assert torch.all(batch[:, 1:] - batch[:, :-1] == 1) and batch.max() < len(tokens)
    reference = None
    for micro in (1, 4, 16):
        parts = split_micro_batches(batch, micro)
        assert len(parts) == 16 // micro and all(x.shape == (micro, 32) for x, _ in parts)
        x = torch.cat([x for x, _ in parts])
        y = torch.cat([y for _, y in parts])
        assert torch.equal(y[:, :-1], x[:, 1:])
        reference = x if reference is None else reference
        assert torch.equal(x, reference)
    with pytest.raises(ValueError, match="micro_batch_size=5 does not divide the per-process batch 16"):
        split_micro_batches(batch, 5)


def test_step_batches_same_with_and_without_workers() -> None:
    tokens = np.random.default_rng(0).integers(0, 256, 20_000).astype(np.uint16)
    sampler = GlobalBatchSampler(len(tokens), 16, 8, seed=1)
    for rank in (0, 1):
        ds = StepBatches(tokens, sampler, rank=rank, world_size=2, start_step=10, num_steps=4)
        plain = list(make_loader(ds, num_workers=0, pin_memory=True))
        workers = list(make_loader(ds, num_workers=1, pin_memory=False))
        assert len(plain) == len(workers) == 4
        assert all(torch.equal(p, w) for p, w in zip(plain, workers, strict=True))
        assert plain[0].shape == (4, 17)
        # resume: a dataset starting at step 12 yields exactly items 2.. of the one starting at 10
        resumed = StepBatches(tokens, sampler, rank=rank, world_size=2, start_step=12, num_steps=2)
        assert torch.equal(resumed[0], plain[2]) and torch.equal(resumed[1], plain[3])


def test_eval_batches_are_fixed_and_cover_the_split() -> None:
    val = np.arange(1000, dtype=np.uint16)
    a, b = eval_batches(val, 32, 4, 3), eval_batches(val, 32, 4, 3)
    assert len(a) == 3 and all(x.shape == y.shape == (4, 32) for x, y in a)
    assert all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b, strict=True))
    assert a[0][0][0, 0] == 0 and a[-1][1][-1, -1] == 999  # first and last tokens of the split
    with pytest.raises(DataError):
        eval_batches(val[:10], 32, 4, 3)
