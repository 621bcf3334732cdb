"""Text primitives the operators share: normalisation, word tokens and n-grams, and the
contamination index that decontamination queries.

Tokens are lower-cased words and single punctuation marks, so ``12+34`` and ``12 + 34`` are the
same three tokens, ``12*34`` another, and case or spacing never hides a copy.

**What counts as evidence of a copy.** Decontamination compares what varies between rows, not what
every row shares. It reads a row's ``input_parts`` (the values the prompt template reads, never the
template's fixed text), and it masks *boilerplate*: every token covered by a word ``COMMON_N``-gram
that at least ``common_share`` of the evaluation rows contain (an instruction every prompt repeats,
a fixed preamble inside a field). What is left of an evaluation row, its *varying text* v, is
indexed by its length:

- v of ``ngram`` tokens or more: its word n-grams; a training row sharing one overlaps it;
- v shorter than that, but of ``min_tokens`` or more: v whole; a training row whose varying text
  contains v as a run of tokens overlaps it (a short prompt copied, whatever was put around it);
- v shorter still (an input that is almost all shared text): a training row overlaps it if its
  varying text *is* v, or if it contains the whole evaluation input, shared text included;
- and a training row whose varying text has an estimated Jaccard similarity of ``near_threshold``
  or more with v (one-permutation MinHash over character 5-grams, ``data/minhash.py``), for v of
  ``min_tokens`` or more, is a near-duplicate (a renamed identifier, a reworded word).

The index keeps hashes and signatures; it answers which split a text overlaps and how, never the
evaluation text itself.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from xxhash import xxh3_64_intdigest

from recipetune.data import minhash

_TOKEN = re.compile(r"\w+|[^\w\s]")
COMMON_N = 3  # boilerplate is found as shared word 3-grams: long enough to be phrasing, short enough to
# cover an instruction's every token
MIN_COMMON_ROWS = 3  # a phrase in fewer evaluation rows than this is never boilerplate (tiny splits)


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def ngrams(text: str, n: int) -> set[str]:
    toks = tokens(text)
    if len(toks) < n:
        return {" ".join(toks)} if toks else set()
    return {" ".join(toks[i : i + n]) for i in range(len(toks) - n + 1)}


def part_tokens(parts: Sequence[str]) -> list[str]:
    out: list[str] = []
    for part in parts:
        out += tokens(part)
    return out


class Boilerplate:
    """Phrases (word COMMON_N-grams) in at least ``share`` of the evaluation rows, and the masking of
    the tokens they cover."""

    def __init__(self, rows: list[list[str]], share: float):
        df: Counter = Counter()
        for toks in rows:
            df.update({tuple(toks[i : i + COMMON_N]) for i in range(len(toks) - COMMON_N + 1)})
        need = max(MIN_COMMON_ROWS, share * len(rows))
        self.phrases = {g for g, c in df.items() if c >= need} if share < 1 else set()
        self.words = {w for g in self.phrases for w in g}  # only these tokens can be masked

    def varying(self, toks: list[str]) -> tuple[list[str], list[int]]:
        """The tokens no common phrase covers, and their positions in ``toks``."""
        n, masked = len(toks), None
        if self.phrases:
            for i in range(n - COMMON_N + 1):
                if toks[i] in self.words and tuple(toks[i : i + COMMON_N]) in self.phrases:
                    if masked is None:
                        masked = [False] * n
                    masked[i : i + COMMON_N] = [True] * COMMON_N
        if masked is None:
            return toks, list(range(n))
        keep = [i for i in range(n) if not masked[i]]
        return [toks[i] for i in keep], keep


class ContaminationIndex:
    """Evaluation rows (their input parts, by split) indexed as the module docstring says.
    ``settings`` has ``ngram``, ``min_tokens``, ``common_share``, ``near_threshold``, ``num_perm``."""

    def __init__(self, evals: dict[str, list[list[str]]], settings: Any):
        self.n = settings.ngram
        self.min_tokens = settings.min_tokens
        self.num_perm = settings.num_perm
        labelled = [(split, part_tokens(parts)) for split, rows in evals.items() for parts in rows]
        self.boilerplate = Boilerplate([toks for _, toks in labelled], settings.common_share)
        self.grams: dict[int, str] = {}  # hash of a varying n-gram -> split ("test" wins)
        self.whole: dict[int, dict[int, str]] = {}  # length -> hash of a whole (short) varying text -> split
        # length -> hash of a very short varying text -> (split, its offset in the input, input length, input hash)
        self.tiny: dict[int, dict[int, list[tuple[str, int, int, int]]]] = {}
        self.rows = Counter(split for split, _ in labelled)
        self.all_boilerplate: Counter = Counter()
        near_texts, self.near_split = [], []
        for split, toks in labelled:
            v, pos = self.boilerplate.varying(toks)
            if not v:
                self.all_boilerplate[split] += 1  # nothing varies: nothing to find a copy of
            elif len(v) >= self.n:
                for i in range(len(v) - self.n + 1):
                    _put(self.grams, _key(v[i : i + self.n]), split)
            elif len(v) >= self.min_tokens:
                _put(self.whole.setdefault(len(v), {}), _key(v), split)
            else:
                self.tiny.setdefault(len(v), {}).setdefault(_key(v), []).append(
                    (split, pos[0], len(toks), _key(toks)))
            if len(v) >= self.min_tokens:
                near_texts.append(" ".join(v))
                self.near_split.append(split)
        self.near = None
        if settings.near_threshold < 1 and near_texts:
            self.near = minhash.BucketIndex(minhash.signatures(near_texts, self.num_perm), settings.near_threshold)

    def hits(self, parts: Sequence[str]) -> tuple[str, str] | None:
        return self.hits_batch([parts])[0]

    def hits_batch(self, rows: Sequence[Sequence[str]]) -> list[tuple[str, str] | None]:
        """For each training row's input parts: (split, how) of an overlap, else None. ``how`` is
        ``<n>-gram``, ``contains a whole <split> input``, ``same input`` or ``near-duplicate``."""
        out: list[tuple[str, str] | None] = []
        full = [part_tokens(parts) for parts in rows]
        varying = [self.boilerplate.varying(toks) for toks in full]
        for toks, (v, pos) in zip(full, varying, strict=True):
            out.append(self._exact_hit(toks, v, pos))
        if self.near is not None:
            todo = [i for i, hit in enumerate(out) if hit is None and len(varying[i][0]) >= self.min_tokens]
            if todo:
                sig = minhash.signatures([" ".join(varying[i][0]) for i in todo], self.num_perm)
                for i, j in zip(todo, self.near.query(sig).tolist(), strict=True):
                    if j >= 0:
                        out[i] = (self.near_split[j], "near-duplicate")
        return out

    def _exact_hit(self, toks: list[str], v: list[str], pos: list[int]) -> tuple[str, str] | None:
        if not v:
            return None
        if len(v) >= self.n and self.grams:
            for i in range(len(v) - self.n + 1):
                split = self.grams.get(_key(v[i : i + self.n]))
                if split:
                    return split, f"{self.n}-gram"
        for length, table in self.whole.items():
            for i in range(len(v) - length + 1):
                split = table.get(_key(v[i : i + length]))
                if split:
                    return split, "contains a whole input"
        # an input with (almost) nothing but shared text: the same varying tokens, or the whole input copied
        for length, table in self.tiny.items():
            for i in range(len(v) - length + 1):
                for split, offset, size, digest in table.get(_key(v[i : i + length]), ()):
                    if len(v) == length:
                        return split, "same input"
                    at = pos[i] - offset
                    if at >= 0 and at + size <= len(toks) and _key(toks[at : at + size]) == digest:
                        return split, "contains a whole input"
        return None


def _key(toks: list[str]) -> int:
    """A stable 64-bit name of a token run (the same in every process, unlike ``hash``)."""
    return xxh3_64_intdigest("\x1f".join(toks).encode())


def _put(table: dict[int, str], key: int, split: str) -> None:
    if table.get(key) != "test":
        table[key] = split
