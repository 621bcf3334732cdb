"""Text primitives the operators share: normalisation, word n-grams, MinHash signatures, and the
contamination index that decontamination queries.

Tokens are lower-cased words and single punctuation marks, so ``12+34`` and ``12*34`` stay apart.
A text shorter than ``n`` tokens counts as one n-gram (itself): short examples such as arithmetic
prompts are then matched exactly, as the 13-gram rule of GPT-3's decontamination would miss them.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

_TOKEN = re.compile(r"\w+|[^\w\s]")


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def ngrams(text: str, n: int) -> set[str]:
    toks = tokens(text)
    if len(toks) < n:
        return {" ".join(toks)} if toks else set()
    return {" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def shingles(text: str, n: int = 5) -> set[bytes]:
    """Character n-grams of the normalised text: robust to small edits, for MinHash."""
    t = normalize(text)
    if len(t) <= n:
        return {t.encode()}
    return {t[i : i + n].encode() for i in range(len(t) - n + 1)}


def minhash(text: str, num_perm: int, shingle: int = 5):
    from datasketch import MinHash

    m = MinHash(num_perm=num_perm, seed=1)  # a fixed seed: signatures comparable across runs
    m.update_batch(list(shingles(text, shingle)))
    return m


def _digest(gram: str) -> bytes:
    return hashlib.blake2b(gram.encode(), digest_size=8).digest()


class ContaminationIndex:
    """Hashed n-grams and MinHash LSH of evaluation texts, by split. Queries say which split a text
    overlaps and how; they never return the evaluation text itself."""

    def __init__(self, n: int, near_threshold: float, num_perm: int):
        from datasketch import MinHashLSH

        self.n, self.num_perm = n, num_perm
        self.grams: dict[bytes, set[str]] = {}
        self.lsh = MinHashLSH(threshold=near_threshold, num_perm=num_perm) if near_threshold < 1 else None
        self._count = 0

    def add(self, split: str, texts: Iterable[str]) -> None:
        for text in texts:
            for g in ngrams(text, self.n):
                self.grams.setdefault(_digest(g), set()).add(split)
            if self.lsh is not None:
                self.lsh.insert(f"{split}:{self._count}", minhash(text, self.num_perm))
                self._count += 1

    def hits(self, text: str) -> tuple[str, str] | None:
        """(split, 'ngram' | 'near-duplicate') of the first overlap found, else None."""
        for g in ngrams(text, self.n):
            splits = self.grams.get(_digest(g))
            if splits:
                return ("test" if "test" in splits else "validation"), "ngram"
        if self.lsh is not None:
            keys = self.lsh.query(minhash(text, self.num_perm))
            if keys:
                split = "test" if any(k.startswith("test:") for k in keys) else "validation"
                return split, "near-duplicate"
        return None
