"""Data for the reference trainer: corpora, a deterministic global-batch sampler, and loaders.

The one contract everything else relies on: sample i of global step s depends only on
(seed, s, i). Micro-batch size, gradient accumulation, number of processes and data-loader
workers only change how a step is cut up and carried, never which tokens it contains. That is
what lets two recipes that differ only in those knobs be compared, and a resumed run continue
exactly where it stopped.

HF `datasets` is deliberately not imported here: it is slow to import and the trainer should
start fast. Preparing corpora with it is the data-operator module's job; it hands us a path.
"""

from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from recipetune.core.batch import split_batch

# Enough real text for CPU-sized models (a few thousand steps of small batches never see it all
# twice), and it builds in well under a second from the files already on disk.
STDLIB_MAX_BYTES = 8_000_000
STDLIB_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3"})
TEXT_EXTENSIONS = frozenset({".txt", ".md", ".py", ".rst", ".json", ".jsonl", ".csv"})
ALLOWED_SPECS = (
    "'stdlib'; a text file or a folder of text files (" + " ".join(sorted(TEXT_EXTENSIONS)) + "); "
    "a .bin file of uint16 tokens; or a folder holding train.bin and val.bin"
)
# splits up to 64 MB are hashed whole; bigger ones by length + first/last MB, so GB corpora stay instant
_FINGERPRINT_FULL_BYTES = 64 << 20
_FINGERPRINT_EDGE_BYTES = 1 << 20


class DataError(ValueError):
    """A corpus spec that cannot be loaded; the message names the spec and what is allowed."""


class ByteTokenizer:
    """UTF-8 bytes as tokens: no vocabulary file, works on any text, round-trips exactly."""

    vocab_size: int = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids: np.ndarray | torch.Tensor | list[int]) -> str:
        arr = np.asarray(ids.tolist() if isinstance(ids, torch.Tensor) else ids, dtype=np.int64)
        # a model with a padded vocabulary can sample ids that are no byte; drop them
        arr = arr[(arr >= 0) & (arr < 256)]
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")


@dataclass
class TokenCorpus:
    name: str
    train: np.ndarray  # 1-D integer tokens; may be a read-only np.memmap
    val: np.ndarray
    vocab_size: int
    fingerprint: str  # short sha256 of the content (and the split), for the audit trail

    @property
    def n_tokens(self) -> int:
        return len(self.train) + len(self.val)


def fingerprint(*splits: np.ndarray) -> str:
    """Short sha256 over dtype, length and content (only the first/last MB of very big splits)."""
    h = hashlib.sha256()
    for arr in splits:
        flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        h.update(f"{arr.dtype.str}:{len(arr)};".encode())
        if len(flat) <= _FINGERPRINT_FULL_BYTES:
            h.update(flat.tobytes())
        else:
            h.update(flat[:_FINGERPRINT_EDGE_BYTES].tobytes())
            h.update(flat[-_FINGERPRINT_EDGE_BYTES:].tobytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- corpus loading


def load_corpus(
    spec: str | os.PathLike[str],
    val_fraction: float = 0.05,
    cache_dir: Path | None = None,
    vocab_size: int | None = None,
) -> TokenCorpus:
    """Load a corpus; the val split is the last `val_fraction` of the tokens (contiguous, so
    train windows and val windows can never overlap). A train.bin/val.bin folder keeps its own split.
    `vocab_size` overrides the inferred one (e.g. a tokenizer's true size for .bin corpora)."""
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"val_fraction must be in (0, 1), got {val_fraction} for corpus {spec!r}")
    key = _preload_key(spec, val_fraction, vocab_size) if cache_dir is None else None
    if key in _PRELOADED:
        return _PRELOADED[key]
    if str(spec) == "stdlib":
        tokens = _stdlib_tokens(_cache_dir(cache_dir))
        return _split("stdlib", tokens, val_fraction, vocab_size or ByteTokenizer.vocab_size)

    byte_vocab = vocab_size or ByteTokenizer.vocab_size
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"corpus {str(path)!r} does not exist; allowed: {ALLOWED_SPECS}")
    if path.is_file() and path.suffix == ".bin":
        tokens = _open_bin(path)
        return _split(str(path), tokens, val_fraction, vocab_size or _infer_vocab(tokens))
    if path.is_file():
        if path.suffix not in TEXT_EXTENSIONS:
            raise DataError(f"corpus file {str(path)!r} has unknown extension; allowed: {ALLOWED_SPECS}")
        return _split(str(path), _byte_tokens([path], path), val_fraction, byte_vocab)

    train_bin, val_bin = path / "train.bin", path / "val.bin"
    if train_bin.is_file() and val_bin.is_file():
        train, val = _open_bin(train_bin), _open_bin(val_bin)
        vocab = vocab_size or max(_infer_vocab(train), _infer_vocab(val))
        return TokenCorpus(str(path), train, val, vocab, fingerprint(train, val))
    if train_bin.is_file() or val_bin.is_file():
        raise DataError(f"corpus folder {str(path)!r} needs both train.bin and val.bin, found only one")
    files = walk_files(path, TEXT_EXTENSIONS, skip_dirs=frozenset({"__pycache__"}))
    if not files:
        raise DataError(f"corpus folder {str(path)!r} holds no usable files; allowed: {ALLOWED_SPECS}")
    return _split(str(path), _byte_tokens(files, path), val_fraction, byte_vocab)


# Corpora loaded ahead by a process that forks runs (the warm launcher): a child finds its corpus here.
_PRELOADED: dict[tuple, TokenCorpus] = {}


def _preload_key(spec: str | os.PathLike[str], val_fraction: float, vocab_size: int | None) -> tuple | None:
    """What names a corpus's content without reading it: the spec, and a file's size and mtime.
    None for a folder (its files could change unseen): folders are never preloaded."""
    if str(spec) == "stdlib":  # the running interpreter's own sources: fixed for the process's life
        return (str(spec), val_fraction, vocab_size)
    path = Path(spec).expanduser()
    try:
        st = path.stat()
    except OSError:
        return None
    if not path.is_file():
        return None
    return (str(spec), str(path.resolve()), st.st_mtime_ns, st.st_size, val_fraction, vocab_size)


def preload(spec: str) -> None:
    """Load a corpus (default split) once in this process, so that processes forked from it later
    skip reading, tokenizing and hashing it. A changed file is read again: its size or mtime differs."""
    key = _preload_key(spec, 0.05, None)
    if key is not None and key not in _PRELOADED:
        _PRELOADED[key] = load_corpus(spec)


def _split(name: str, tokens: np.ndarray, val_fraction: float, vocab_size: int) -> TokenCorpus:
    n_val = max(1, int(len(tokens) * val_fraction))
    if len(tokens) - n_val < 2:
        raise DataError(f"corpus {name!r} has only {len(tokens)} tokens, too few to split into train/val")
    train, val = tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]
    if not isinstance(tokens, np.memmap) and int(tokens.max()) >= vocab_size:
        raise DataError(f"corpus {name!r} holds token {int(tokens.max())} >= vocab_size {vocab_size}")
    return TokenCorpus(name, train, val, vocab_size, fingerprint(train, val))


def _open_bin(path: Path) -> np.ndarray:
    size = path.stat().st_size
    if size == 0 or size % 2:
        raise DataError(
            f"{str(path)!r} is not a uint16 token file (size {size} bytes); allowed: {ALLOWED_SPECS}"
        )
    return np.memmap(path, dtype=np.uint16, mode="r")


def _infer_vocab(tokens: np.ndarray) -> int:
    # nanoGPT layout carries no vocabulary size; max+1 padded to 64 (50257 -> 50304, as nanoGPT does)
    top = max(int(tokens[i : i + (1 << 26)].max()) for i in range(0, len(tokens), 1 << 26))
    return (top + 1 + 63) // 64 * 64


def walk_files(root: Path, extensions: frozenset[str], skip_dirs: frozenset[str]) -> list[Path]:
    found = []
    for d, dirnames, filenames in os.walk(root):
        dirnames[:] = [x for x in dirnames if x not in skip_dirs and not x.startswith(".")]
        found += [Path(d) / f for f in filenames if Path(f).suffix in extensions]
    return sorted(found)  # sorted full paths: the same bytes in the same order on every run


def _byte_tokens(files: list[Path], name: Path, max_bytes: int | None = None) -> np.ndarray:
    chunks, total = [], 0
    for f in files:
        try:
            data = f.read_bytes()
        except OSError:
            continue  # unreadable files (permissions, broken links) are skipped, not fatal
        if data and not data.endswith(b"\n"):
            data += b"\n"  # keep the last line of one file from gluing onto the next file
        chunks.append(data)
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    blob = b"".join(chunks)[:max_bytes]
    if not blob:
        raise DataError(f"corpus {str(name)!r} is empty; allowed: {ALLOWED_SPECS}")
    return np.frombuffer(blob, dtype=np.uint8).astype(np.uint16)


def _cache_dir(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("RECIPETUNE_CACHE", Path.home() / ".cache" / "recipetune"))


def _stdlib_tokens(cache_dir: Path) -> np.ndarray:
    """The running Python's stdlib sources: real text on every machine, nothing to download."""
    root = Path(sysconfig.get_paths()["stdlib"])
    v = sys.version_info
    # key on the stdlib location too: two installs of the same version may be patched differently
    where = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    cache = cache_dir / f"stdlib-py{v.major}.{v.minor}.{v.micro}-{where}-{STDLIB_MAX_BYTES}.npy"
    if cache.is_file():
        try:
            return np.load(cache)
        except (OSError, ValueError, EOFError):
            pass  # a truncated or foreign file: rebuild it below
    files = walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"})
    tokens = _byte_tokens(files, root, STDLIB_MAX_BYTES)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, tokens)
        os.replace(tmp, cache)  # atomic: concurrent trials never read a half-written cache
    except OSError:
        pass  # a read-only home is no reason to fail; we just rebuild next time
    return tokens


# ---------------------------------------------------------------------------- sampling


class GlobalBatchSampler:
    """Random window starts for each global step, from a generator seeded by (seed, step) alone."""

    def __init__(self, n_tokens: int, seq_len: int, global_batch_size: int, seed: int) -> None:
        if n_tokens < seq_len + 1:
            raise ValueError(f"need more than seq_len={seq_len} tokens to draw windows, have {n_tokens}")
        if global_batch_size < 1:
            raise ValueError(f"global_batch_size must be >= 1, got {global_batch_size}")
        self.n_tokens, self.seq_len = n_tokens, seq_len
        self.global_batch_size, self.seed = global_batch_size, seed

    def offsets(self, step: int) -> np.ndarray:
        # a fresh generator per step: any step can be produced on its own (resume, any rank)
        rng = np.random.default_rng([self.seed, step])
        # window [o, o + seq_len + 1) holds inputs and shifted targets, so o <= n_tokens - seq_len - 1
        return rng.integers(0, self.n_tokens - self.seq_len, size=self.global_batch_size, dtype=np.int64)

    def fingerprint(self, step: int) -> str:
        """The global batch of ``step``, named: equal for any micro-batch split or process count,
        different for another sample order (the guard's evidence that a candidate replayed the data)."""
        return hashlib.blake2b(self.offsets(step).tobytes(), digest_size=8).hexdigest()

    def rank_slice(self, step: int, rank: int, world_size: int) -> np.ndarray:
        per_rank, _ = split_batch(self.global_batch_size, world_size, 1, f"world_size={world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} is outside world_size={world_size}")
        return self.offsets(step)[rank * per_rank : (rank + 1) * per_rank]


def gather_windows(tokens: np.ndarray, offsets: np.ndarray, seq_len: int) -> torch.Tensor:
    """int64[len(offsets), seq_len + 1]: each row holds inputs [:-1] and targets [1:]."""
    rows = np.stack([np.asarray(tokens[o : o + seq_len + 1]) for o in offsets.tolist()])
    return torch.from_numpy(rows.astype(np.int64))


class StepBatches(Dataset):
    """Item k = this rank's windows for global step start_step + k, as int64[per_rank, seq_len + 1]."""

    def __init__(
        self,
        corpus_tokens: np.ndarray,
        sampler: GlobalBatchSampler,
        rank: int,
        world_size: int,
        start_step: int,
        num_steps: int,
    ) -> None:
        if sampler.n_tokens > len(corpus_tokens):
            raise ValueError(f"sampler expects {sampler.n_tokens} tokens, corpus has {len(corpus_tokens)}")
        sampler.rank_slice(start_step, rank, world_size)  # fail now, not inside a worker process
        self.tokens, self.sampler = corpus_tokens, sampler
        self.rank, self.world_size = rank, world_size
        self.start_step, self.num_steps = start_step, num_steps

    def __len__(self) -> int:
        return self.num_steps

    def __getitem__(self, k: int) -> torch.Tensor:
        if not 0 <= k < self.num_steps:
            raise IndexError(f"step index {k} outside [0, {self.num_steps})")
        offsets = self.sampler.rank_slice(self.start_step + k, self.rank, self.world_size)
        return gather_windows(self.tokens, offsets, self.sampler.seq_len)


def make_loader(dataset: Dataset, num_workers: int, pin_memory: bool) -> DataLoader:
    """Items arrive in step order; workers only prefetch, so they cannot change the data."""
    return DataLoader(
        dataset,
        batch_size=None,  # each item already is one step's batch
        shuffle=False,
        num_workers=num_workers,
        pin_memory=pin_memory and torch.cuda.is_available(),  # pinning without a GPU only warns
        persistent_workers=num_workers > 0,
    )


def split_micro_batches(
    batch: torch.Tensor, micro_batch_size: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut one step's rows into (x, y) micro-batches, in row order; the rows never change."""
    split_batch(batch.shape[0], 1, micro_batch_size)
    # contiguous so y.view(-1) in the loss works
    return [(m[:, :-1].contiguous(), m[:, 1:].contiguous()) for m in batch.split(micro_batch_size)]


def eval_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, n_batches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed validation windows, evenly spaced over the split: every run is scored on the same data."""
    if len(tokens) < seq_len + 1:
        raise DataError(f"val split has {len(tokens)} tokens, need at least seq_len + 1 = {seq_len + 1}")
    starts = np.linspace(0, len(tokens) - seq_len - 1, batch_size * n_batches).round().astype(np.int64)
    windows = gather_windows(tokens, starts, seq_len)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in windows.split(batch_size)]
