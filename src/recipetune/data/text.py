"""Text primitives the operators share: normalisation, word tokens, template fields, and the
boilerplate (phrases most evaluation rows repeat) that decontamination (``data/decontam.py``) masks.

Tokens are lower-cased words and single punctuation marks, so ``12+34`` and ``12 + 34`` are the
same three tokens, ``12*34`` another, and case or spacing never hides a copy.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from recipetune.data.minhash import normalize  # noqa: F401  (one normalisation: MinHash's, re-exported)

_TOKEN = re.compile(r"\w+|[^\w\s]")
_TRUE = [True] * 3
COMMON_N = 3  # boilerplate is found as shared word 3-grams: long enough to be phrasing, short enough to
# cover an instruction's every token
MIN_COMMON_ROWS = 3  # a phrase in fewer evaluation rows than this is never boilerplate (tiny splits)


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


