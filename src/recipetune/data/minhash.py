"""MinHash signatures and LSH banding, vectorised over a batch of texts (numpy).

datasketch builds one ``MinHash`` object per text and runs ``num_perm`` hash permutations over
every shingle: at a million rows that is minutes and gigabytes of Python objects. Here a batch of
texts is one byte buffer, and the signature is a *one-permutation* MinHash (Li, Owen & Zhang 2012):
every character shingle is hashed once, the hash range is cut into ``num_perm`` bins, and each bin
keeps its smallest value. Bins a short text leaves empty are filled from the next non-empty bin to
the right, shifted by the distance (rotation densification, Shrivastava & Li 2014), which keeps the
estimate of Jaccard similarity unbiased and the signatures usable for LSH. Cost: a few passes over
the bytes instead of ``num_perm`` passes over the shingles.

Shingles are character ``k``-grams of the normalised text (lower case, runs of whitespace as one
space), so case and spacing do not change a signature; a text shorter than ``k`` is one shingle.

``near_duplicates`` finds, for each row, an earlier row in the same LSH bucket of some band whose
estimated similarity is at least the threshold: the rule ``dedup_near`` applies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

EMPTY = np.uint32(0xFFFFFFFF)
CHUNK = 2000  # texts per vectorised pass
BUCKET_CHECKS = 16  # members of one LSH bucket compared with a query (evaluation buckets are small)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: every input bit moves every output bit (in place)."""
    h ^= h >> np.uint64(30)
    h *= _M1
    h ^= h >> np.uint64(27)
    h *= _M2
    h ^= h >> np.uint64(31)
    return h


def signatures(texts: Sequence[str], num_perm: int = 64, k: int = 5, seed: int = 1) -> np.ndarray:
    """(len(texts), num_perm) uint32 one-permutation MinHash signatures of the texts' k-shingles
    (k <= 8 bytes). An empty text gets a signature of EMPTY values, which matches nothing."""
    if not 1 <= k <= 8:
        raise ValueError("shingle length k must be 1..8 bytes")
    if len(texts) > CHUNK:  # a chunk's arrays stay in the CPU's cache: 100k texts at once run 5x slower
        return np.concatenate([signatures(texts[i : i + CHUNK], num_perm, k, seed)
                               for i in range(0, len(texts), CHUNK)])
    return _signatures(texts, num_perm, k, seed)


def _signatures(texts: Sequence[str], num_perm: int, k: int, seed: int) -> np.ndarray:
    n = len(texts)
    sig = np.full(n * num_perm, EMPTY, dtype=np.uint32)
    if n == 0:
        return sig.reshape(0, num_perm)
    encoded = [normalize(t).encode() for t in texts]
    lengths = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=n)
    raw = b"".join(encoded) + b"\0" * 8  # padding: the last windows read past the end
    total = len(raw) - 8
    ends = np.cumsum(lengths)
    salt = np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
    # the k bytes at every position, read as one little-endian integer (an unaligned strided view)
    span = max(total - k + 1, 0)
    windows = np.ndarray(shape=(span,), dtype="<u8", buffer=raw, strides=(1,))
    h = windows & np.uint64((1 << (8 * k)) - 1) if k < 8 else windows.copy()
    # a window crossing into the next text is no shingle: the last k-1 positions of every text
    valid = np.ones(span, dtype=bool)
    tail = (ends[:, None] - np.arange(1, k)[None, :]).ravel()
    valid[tail[(tail >= 0) & (tail < span)]] = False
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)[:span][valid]
    h = h[valid]
    # texts shorter than k: one shingle, the whole text (its bytes, padded with zeros)
    short = np.flatnonzero((lengths > 0) & (lengths < k))
    if len(short):
        starts = ends[short] - lengths[short]
        whole = np.ndarray(shape=(total + 1,), dtype="<u8", buffer=raw, strides=(1,))[starts]
        whole &= (np.uint64(1) << (lengths[short].astype(np.uint64) * np.uint64(8))) - np.uint64(1)
        h, row = np.concatenate([h, whole]), np.concatenate([row, short])
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps on purpose
        h ^= salt
        _mix(h)
    bins = ((h >> np.uint64(32)) * np.uint64(num_perm)) >> np.uint64(32)  # uniform in [0, num_perm)
    np.minimum.at(sig, row * num_perm + bins.astype(np.int64), h.astype(np.uint32))
    return _densify(sig.reshape(n, num_perm))


def _densify(sig: np.ndarray) -> np.ndarray:
    """Fill each empty bin from the next non-empty bin to its right (circularly), offset by the
    distance, so two texts with the same non-empty bins fill their empty bins alike."""
    n, m = sig.shape
    empty = sig == EMPTY
    fill = empty.any(axis=1) & ~empty.all(axis=1)
    if not fill.any():
        return sig
    s = sig[fill]
    doubled = np.concatenate([s, s], axis=1)
    cols = np.where(doubled != EMPTY, np.arange(2 * m), 2 * m)
    nxt = np.minimum.accumulate(cols[:, ::-1], axis=1)[:, ::-1][:, :m]  # next non-empty column, circular
    dist = (nxt - np.arange(m)).astype(np.uint64)
    with np.errstate(over="ignore"):
        src = np.take_along_axis(doubled, nxt, axis=1).astype(np.uint64)
        filled = ((src + dist * np.uint64(0x9E3779B1)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    s = np.where(s == EMPTY, filled, s)
    sig = sig.copy()
    sig[fill] = s
    return sig


def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Estimated Jaccard similarity of rows of ``a`` and ``b`` (same shape): the share of equal bins.
    Empty texts are similar to nothing."""
    same = (a == b) & (a != EMPTY)
    return same.mean(axis=-1)


@lru_cache(maxsize=64)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) minimising false positives plus false negatives around ``threshold``,
    the weighting datasketch's MinHashLSH uses (equal weights)."""

    def collide(s: np.ndarray, b: int, r: int) -> np.ndarray:
        return 1.0 - (1.0 - s**r) ** b

    steps = 200
    below = (np.arange(steps) + 0.5) / steps * threshold
    above = threshold + (np.arange(steps) + 0.5) / steps * (1.0 - threshold)
    best, best_err = (1, num_perm), math.inf
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            fp = collide(below, b, r).mean() * threshold
            fn = (1.0 - collide(above, b, r)).mean() * (1.0 - threshold)
            if fp + fn < best_err:
                best, best_err = (b, r), fp + fn
    return best


def band_keys(sig: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: one hash per band of ``rows`` signature values. Rows whose signature is
    all EMPTY get distinct keys, so they share no bucket."""
    n = sig.shape[0]
    keys = np.zeros((n, bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for b in range(bands):
            h = np.full(n, np.uint64(b + 1) * _M1, dtype=np.uint64)
            for r in range(rows):
                h = _mix(h ^ sig[:, b * rows + r].astype(np.uint64))
            keys[:, b] = h
    blank = (sig == EMPTY).all(axis=1)
    if blank.any():
        keys[blank] = np.arange(blank.sum(), dtype=np.uint64)[:, None] * np.uint64(2654435761) + np.uint64(7)
    return keys


def near_duplicates(sig: np.ndarray, threshold: float) -> np.ndarray:
    """For each row, the index of an earlier row that is a near duplicate of it (shares an LSH
    bucket and has estimated similarity >= threshold), or -1. Earlier = smaller index."""
    n, m = sig.shape
    bands, rows = lsh_params(threshold, m)
    keys = band_keys(sig, bands, rows)
    match = np.full(n, -1, dtype=np.int64)
    for b in range(bands):
        _, first, inverse = np.unique(keys[:, b], return_index=True, return_inverse=True)
        earlier = first[inverse]
        cand = np.flatnonzero((earlier < np.arange(n)) & (match < 0))
        if len(cand):
            ok = similarity(sig[cand], sig[earlier[cand]]) >= threshold
            match[cand[ok]] = earlier[cand[ok]]
    return match


class BucketIndex:
    """LSH buckets of a fixed set of signatures (the evaluation rows), queried by others."""

    def __init__(self, sig: np.ndarray, threshold: float):
        self.threshold = threshold
        self.sig = sig
        self.bands, self.rows = lsh_params(threshold, sig.shape[1])
        keys = band_keys(sig, self.bands, self.rows)
        self.tables = []
        for b in range(self.bands):
            order = np.argsort(keys[:, b], kind="stable")
            self.tables.append((keys[order, b], order))

    def query(self, sig: np.ndarray) -> np.ndarray:
        """For each query row, the index of an indexed row it nearly duplicates, or -1."""
        n = sig.shape[0]
        match = np.full(n, -1, dtype=np.int64)
        if n == 0 or self.sig.shape[0] == 0:
            return match
        keys = band_keys(sig, self.bands, self.rows)
        for b, (sorted_keys, order) in enumerate(self.tables):
            pos = np.searchsorted(sorted_keys, keys[:, b])
            for _ in range(BUCKET_CHECKS):  # the bucket's members in turn, while the key is the same
                at = np.minimum(pos, len(sorted_keys) - 1)
                cand = np.flatnonzero((pos < len(sorted_keys)) & (sorted_keys[at] == keys[:, b]) & (match < 0))
                if not len(cand):
                    break
                other = order[at[cand]]
                ok = similarity(sig[cand], self.sig[other]) >= self.threshold
                match[cand[ok]] = other[ok]
                pos = pos + 1
        return match
