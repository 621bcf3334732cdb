"""Text primitives the operators share: normalisation, word tokens, template fields, and the
contamination index that decontamination queries.

Tokens are lower-cased words and single punctuation marks, so ``12+34`` and ``12 + 34`` are the
same three tokens, ``12*34`` another, and case or spacing never hides a copy.

**What counts as evidence of a copy.** Decontamination compares what varies between rows, not what
every row shares. It reads a row's ``input_parts`` (the values the prompt template reads, never the
template's fixed text), and it masks *boilerplate*: every token covered by a word ``COMMON_N``-gram
that at least ``common_share`` of the evaluation rows contain (an instruction every prompt repeats,
a fixed preamble inside a field). What is left of an evaluation row is its *varying text* v. A
training row (its varying text u, masked alike) overlaps an evaluation row when:

- v has ``ngram`` tokens or more and u holds at least ``min_overlap`` of v's distinct word n-grams
  (a copy, renamed or re-prefixed, keeps most of them; an idiom two functions share, a few);
- v has fewer than 2 x ``ngram`` tokens and u contains v as a run of tokens (``min_tokens`` or
  more of them: a short prompt copied, whatever was put around it), or contains v with one name
  renamed everywhere (the name a word, not a number, and ``RENAME_MIN_WORDS`` other words alike); such
  inputs are found through their two rarest token pairs with no token in common (anchors), so a
  rename leaves one of them;
- v is shorter than ``min_tokens`` (an input that is almost all shared text) and u *is* v, or the
  training row contains the whole evaluation input, shared text included;
- or their estimated Jaccard similarity reaches ``near_threshold`` (one-permutation MinHash over
  character 5-grams, ``data/minhash.py``), both of ``NEAR_MIN_CHARS`` or more.

The index lives in memory, is never written, and answers which split a text overlaps and how, never
the evaluation text itself.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from recipetune.data import minhash
from recipetune.data.minhash import normalize  # noqa: F401  (one normalisation: MinHash's, re-exported)

_TOKEN = re.compile(r"\w+|[^\w\s]")
_IDENTIFIER = re.compile(r"[^\W\d]\w*")  # a word that starts with a letter or _: a name, not a number
_TRUE = [True] * 3
COMMON_N = 3  # boilerplate is found as shared word 3-grams: long enough to be phrasing, short enough to
# cover an instruction's every token
MIN_COMMON_ROWS = 3  # a phrase in fewer evaluation rows than this is never boilerplate (tiny splits)
RENAME_MIN_WORDS = 4  # a short input with one name renamed is a copy only if 4 other words still match:
# "def isabs(s):" and "def isdir(s):" share only punctuation and a keyword; two docstrings, a sentence
NEAR_MIN_CHARS = 32  # MinHash over fewer character 5-grams than ~28 estimates similarity too roughly
# (two 8-character sums share half their shingles by chance): shorter texts have the token rules


@lru_cache(maxsize=256)
def template_fields(template: str) -> tuple[str, ...]:
    """The fields a ``str.format`` template reads (``{a.b}`` and ``{a[0]}`` read ``a``); parsed once per
    template, since rendering a million rows asks a million times."""
    return tuple(re.split(r"[.\[]", name, maxsplit=1)[0] for _, name, _, _ in string.Formatter().parse(template)
                 if name)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


def part_tokens(parts: Sequence[str]) -> list[str]:
    return tokens(" ".join(parts))  # no token spans whitespace: the parts stay apart


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

    def varying(self, toks: list[str]) -> tuple[list[str], Sequence[int]]:
        """The tokens no common phrase covers, and their positions in ``toks``."""
        n, words, phrases = len(toks), self.words, self.phrases
        hits = [i for i, t in enumerate(toks) if t in words] if phrases else ()
        masked = None
        for i in hits:
            if i + COMMON_N <= n and tuple(toks[i : i + COMMON_N]) in phrases:
                if masked is None:
                    masked = [False] * n
                masked[i : i + COMMON_N] = _TRUE
        if masked is None:
            return toks, range(n)
        keep = [i for i in range(n) if not masked[i]]
        return [toks[i] for i in keep], keep


@dataclass(frozen=True)
class _Short:
    """An evaluation input of fewer than 2n varying tokens, checked by alignment at its anchors."""

    split: str
    varying: tuple[str, ...]
    full: tuple[str, ...]  # all its tokens, shared text included
    start: int  # where ``varying`` begins in ``full``


class ContaminationIndex:
    """Evaluation rows (their input parts, by split) indexed as the module docstring says.
    ``settings`` has ``ngram``, ``min_overlap``, ``min_tokens``, ``common_share``, ``near_threshold``,
    ``num_perm``. It lives in memory and is never written anywhere."""

    def __init__(self, evals: dict[str, list[list[str]]], settings: Any):
        self.n, self.min_overlap, self.min_tokens = settings.ngram, settings.min_overlap, settings.min_tokens
        self.num_perm = settings.num_perm
        labelled = [(split, part_tokens(parts)) for split, rows in evals.items() for parts in rows]
        self.boilerplate = Boilerplate([toks for _, toks in labelled], settings.common_share)
        self.grams: dict[tuple[str, ...], list[int]] = {}  # varying n-gram -> the long inputs holding it
        self.long: list[tuple[str, int]] = []  # long input -> (split, its number of distinct n-grams)
        self.short: list[_Short] = []
        # a token pair (or, for a one-token input, the token) -> (short input, the pair's offset there)
        self.anchors: dict[Any, list[tuple[int, int]]] = {}
        self._parts: dict[str, tuple[list[str], list[str], Sequence[int]]] = {}
        varied = [(split, *self._split(parts)) for split, rows in evals.items() for parts in rows]
        df = Counter(p for _, _, v, _ in varied for p in set(zip(v, v[1:], strict=False)))
        near_texts, near_split = [], []
        for split, toks, v, pos in varied:
            if not v:
                continue  # nothing varies: nothing to find a copy of
            if len(v) >= self.n:
                grams = {tuple(v[i : i + self.n]) for i in range(len(v) - self.n + 1)}
                for g in grams:
                    self.grams.setdefault(g, []).append(len(self.long))
                self.long.append((split, len(grams)))
            if len(v) < 2 * self.n:
                for key, offset in _anchors(v, df):
                    self.anchors.setdefault(key, []).append((len(self.short), offset))
                self.short.append(_Short(split, tuple(v), tuple(toks), pos[0]))
            if len(text := " ".join(v)) >= NEAR_MIN_CHARS:
                near_texts.append(text)
                near_split.append(split)
        self.gram_starts = {g[:2] for g in self.grams}  # the token pairs an n-gram can start with
        self.single = any(len(e.varying) == 1 for e in self.short)
        self.near: dict[str, minhash.BucketIndex] = {}  # split -> its inputs' LSH buckets, test first
        if settings.near_threshold < 1 and near_texts:
            sig = minhash.signatures(near_texts, self.num_perm)
            for split in sorted(set(near_split), key=lambda s: s != "test"):
                rows = [i for i, s in enumerate(near_split) if s == split]
                self.near[split] = minhash.BucketIndex(sig[rows], settings.near_threshold)

    def hits(self, parts: Sequence[str]) -> tuple[str, str] | None:
        return self.hits_batch([parts])[0]

    def hits_batch(self, rows: Sequence[Sequence[str]]) -> list[tuple[str, str] | None]:
        """For each training row's input parts: (split, how) of an overlap, else None. ``how`` is
        ``<n>-grams``, ``same input``, ``contains a whole input``, ``renamed copy`` or
        ``near-duplicate``."""
        full, varying = [], []
        for parts in rows:
            toks, v, pos = self._split(parts)
            full.append(toks)
            varying.append((v, pos))
        out = [self._token_hit(toks, v, pos) for toks, (v, pos) in zip(full, varying, strict=True)]
        if self.near:  # rows with no overlap yet, or one with validation only: test may still be near
            texts = {i: " ".join(varying[i][0]) for i, hit in enumerate(out) if hit is None or hit[0] != "test"}
            todo = [i for i, text in texts.items() if len(text) >= NEAR_MIN_CHARS]
            sig = minhash.signatures([texts[i] for i in todo], self.num_perm) if todo else None
            for split, index in self.near.items():
                if not todo:
                    break
                match = index.query(sig)
                for i in [i for i, j in zip(todo, match.tolist(), strict=True) if j >= 0]:
                    if out[i] is None or split == "test":
                        out[i] = (split, "near-duplicate")
                keep = [k for k, i in enumerate(todo) if out[i] is None]  # test rows found: done with them
                todo, sig = [todo[k] for k in keep], sig[keep]
        return out

    def _split(self, parts: Sequence[str]) -> tuple[list[str], list[str], Sequence[int]]:
        """A row's tokens, varying tokens and their positions, part by part: a part every row repeats
        (an instruction field, a system prompt) is tokenised and masked once."""
        if len(parts) == 1:
            return self._part(parts[0])  # (shared with the cache: callers read, never change them)
        toks: list[str] = []
        v: list[str] = []
        pos: list[int] = []
        for part in parts:
            t, pv, pp = self._part(part)
            pos += [p + len(toks) for p in pp]
            toks += t
            v += pv
        return toks, v, pos

    def _part(self, part: str) -> tuple[list[str], list[str], Sequence[int]]:
        hit = self._parts.get(part)
        if hit is None:
            toks = tokens(part)
            hit = (toks, *self.boilerplate.varying(toks))
            if len(part) < 2000:  # short parts repeat; long ones rarely do
                if len(self._parts) >= 20_000:
                    self._parts.clear()
                self._parts[part] = hit
        return hit

    def _token_hit(self, toks: list[str], v: list[str], pos: Sequence[int]) -> tuple[str, str] | None:
        """The first overlap with test, else with validation, else None: a training row that overlaps
        both must be reported as test text (its example is withheld)."""
        found: tuple[str, str] | None = None
        for hit in self._token_hits(toks, v, pos):
            if hit[0] == "test":
                return hit
            found = found or hit
        return found

    def _token_hits(self, toks: list[str], v: list[str], pos: Sequence[int]):
        if not v:
            return
        n = self.n
        pairs = list(zip(v, v[1:], strict=False))
        if len(v) >= n and self.grams:
            grams, starts, shared = self.grams, self.gram_starts, Counter()
            for i in [i for i, p in enumerate(pairs[: len(v) - n + 1]) if p in starts]:
                holders = grams.get(tuple(v[i : i + n]))
                if holders:
                    shared.update(holders)
            for j, count in shared.items():  # (a gram repeated in u counts once per repeat: rare, harmless)
                split, total = self.long[j]
                if count >= self.min_overlap * total:
                    yield split, f"{n}-grams"
        anchors = self.anchors
        keys = list(enumerate(pairs))
        if self.single:  # some inputs are one token: their anchor is that token
            keys += enumerate(v)
        for i, key in [(i, key) for i, key in keys if key in anchors]:
            for j, offset in anchors[key]:
                e = self.short[j]
                at, size = i - offset, len(e.varying)
                if at < 0 or at + size > len(v):
                    continue
                found = _aligned(e.varying, v, at)
                if found == "same":
                    if size == len(v):
                        yield e.split, "same input"
                    elif size >= self.min_tokens:
                        yield e.split, "contains a whole input"
                    else:  # (almost) nothing of it varies: only the whole input, shared text and all, counts
                        first = pos[at] - e.start
                        if first >= 0 and tuple(toks[first : first + len(e.full)]) == e.full:
                            yield e.split, "contains a whole input"
                elif found == "renamed":
                    yield e.split, "renamed copy"


def _anchors(v: list[str], df: Counter) -> list[tuple[Any, int]]:
    """Where a short input is looked for: its rarest token pair, and a second one with none of the
    first's tokens, so a name renamed everywhere leaves one of them; a one-token input, the token."""
    if len(v) == 1:
        return [(v[0], 0)]
    pairs = sorted(range(len(v) - 1), key=lambda i: (df[(v[i], v[i + 1])], i))
    first = pairs[0]
    out = [((v[first], v[first + 1]), first)]
    for i in pairs[1:]:
        if not {v[i], v[i + 1]} & {v[first], v[first + 1]}:
            out.append(((v[i], v[i + 1]), i))
            break
    return out


def _aligned(original: tuple[str, ...], u: list[str], at: int) -> str | None:
    """``same`` when ``u[at:]`` starts with ``original``; ``renamed`` when it does with one identifier
    renamed everywhere and nothing else changed; else None (most candidates fail at once)."""
    old = new = None
    for k, a in enumerate(original):
        b = u[at + k]
        if a != b:
            if old is None:
                old, new = a, b
            elif a != old or b != new:
                return None
    if old is None:
        return "same"
    if not (_IDENTIFIER.fullmatch(old) and _IDENTIFIER.fullmatch(new)) or new in original:
        return None
    words = sum(1 for t in original if t != old and _IDENTIFIER.fullmatch(t))
    return "renamed" if words >= RENAME_MIN_WORDS else None
