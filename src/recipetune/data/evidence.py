"""What weighs what decontamination found of an evaluation input in a training row (``data/decontam.py``
finds it; the rule's text is that module's docstring): whether what the row kept of the input says
which input it is. Learnt from the evaluation inputs alone: how many of them use each name or number
(a rare one says which input a copy is of; one a tenth of them use is the task's own vocabulary, not
a name) and their frames (``data/frames.py``). Three questions: is a row that is an input with one
token changed a copy (``renamed``), is what a row kept of an input whose shared text it changed
improbable by chance (``improbable``), and does an input's varying text say which input it is wherever
it is found (``says_which``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter
from collections.abc import Sequence

from recipetune.data.anchors import Input, aligned, kind
from recipetune.data.frames import CONTENT, Frames, fill
from recipetune.data.text import MIN_COMMON_ROWS

RENAME_MIN_WORDS = 4  # an input with one token changed is a copy only if 4 other names or numbers still match
# in its fields: "def isabs(s):" and "def isdir(s):" share only punctuation and a keyword; two docstrings,
# a sentence ...
RENAME_SHORT_WORDS = 2  # ... 2 of them varying (block 17 of a template is not block 7); or 2 varying, one
# rare: `self._waiter.set_result(exc)` renamed keeps `_waiter`; `len(x)` renamed keeps only `len`, and
# `self.x` only `self`, which much of all code has: other inputs
RARE_SHARE, RARE_MIN_ROWS = 0.01, 2  # rare: in at most 1% of the evaluation inputs (and at least 2 may) ...
RARE_MIN_INPUTS = 100  # ... of 100 or more: among fewer, how common a word is cannot be told
STRUCTURE_SHARE = 0.1  # a name or number in a tenth of the evaluation inputs is the task's own vocabulary
# (a keyword, a template's verb: `select`, `buys`), not a name: each type of input of a task with a few types
# repeats its words in a large share; a name, a value is each in a few percent
RENAME_CHANCE = 0.05  # a renamed copy (among RARE_MIN_INPUTS inputs or more) is one where a legitimate input
# would match its frame (what is left alike, in place) by chance at most this often, however few words it
# keeps (data/frames.py): `(54 - 51) * 841 + 2` keeps three numbers in place; `347+589=` keeps one, a run of
# chance 1 in N: never enough


class Evidence:
    """The evaluation inputs' word counts and frames (``learn`` each input once), and the questions they
    answer of a training row."""

    def __init__(self, inputs: Sequence[Sequence[str]]):
        """``inputs``: each evaluation input's tokens (every one, including those with nothing varying)."""
        # how many evaluation inputs use each name or number: a rare one says which input a renamed copy
        # is of; one most use is the task's structure, not a name
        self.word_df = Counter(t for toks in inputs for t in set(toks) if CONTENT.fullmatch(t))
        self.rare_rows = max(RARE_MIN_ROWS, RARE_SHARE * len(inputs)) if len(inputs) >= RARE_MIN_INPUTS else 0
        self.structural_rows = max(MIN_COMMON_ROWS, STRUCTURE_SHARE * len(inputs))  # (as boilerplate's)
        self.frames = Frames()  # what weighs a renamed copy: the inputs' frames and token sequences

    def learn(self, e: Input) -> None:
        self.frames.learn(*e.fields())

    def renamed(self, e: Input, toks: list[str], firsts: list[int], starts: list[int]):
        """("renamed", spans, fill) when each of ``e``'s fields lies whole in the training row's tokens, its
        shared text included, with the one token changed (``firsts``: where each piece's first varying
        token was found), and the names and numbers left alike say which input it is (``fill``: the frame
        the row fills, ``frames.fill``); ("weak", spans, fill) where they do not; else None. The varying
        tokens alone would let a masked slot (a value common enough to be part of a shared
        phrase, ``around 6 .``) differ unseen: a second change; and a value masked in one and not in
        the other (``silva " ,`` common, ``okafor " ,`` not) hides a one-token change from them. The
        change is of one type (``aligned``). Evidence (the module docstring): among enough inputs,
        a frame a legitimate input would match by chance at most ``RENAME_CHANCE`` times, at every
        place the copy could lie; among few, ``RENAME_MIN_WORDS`` distinct names and numbers left
        alike in those fields (their shared text counts: it matched too), of which
        ``RENAME_SHORT_WORDS`` vary and are no word of the task's structure (an input whose one varying
        value changed is another input of its template: block 17 is not block 7), or
        ``RENAME_SHORT_WORDS`` such, one of them rare."""
        spans, field, theirs = [], [], []
        for (lo, _), (p_lo, p_hi), first in zip(e.pieces, e.parts, firsts, strict=True):
            begin = first - (e.where[lo] - p_lo)
            k = bisect_right(starts, first) - 1
            if begin < starts[k] or begin + p_hi - p_lo > starts[k + 1]:
                return None
            spans.append((begin, begin + p_hi - p_lo))
            field += e.full[p_lo:p_hi]
            theirs += toks[begin : begin + p_hi - p_lo]
        changed = {(a, b) for a, b in zip(field, theirs, strict=True) if a != b}
        if len(changed) != 1 or aligned(field, theirs, 0) != "renamed":
            return None
        (old, new), = changed
        opened = [i for i, (a, b) in enumerate(zip(field, theirs, strict=True)) if a != b]
        filled = fill(field, opened, new)
        if self.frames.siblings(field, opened) > 1:
            return "weak", spans, filled  # another evaluation input fills the same frame: the slot tells inputs apart
        # (a word of the task's vocabulary next to a value is left unmasked by the 3-gram mask: no evidence)
        varying = {t for t in e.varying if t != old and CONTENT.fullmatch(t) and not self.structural(t)}
        words = {t for t in field if t != old and CONTENT.fullmatch(t)}
        if (self.structural(old) or self.structural(new)) and (not self.rare_rows or len(varying) < RENAME_MIN_WORDS):
            # a word of the task's structure changed may ask another question (`Create a TCP server.`,
            # `Connect ...`): a copy only where as many of the input's own values are left alike as a
            # renamed copy's words (a meeting moved from Monday to Sunday, its people, date, place, room kept)
            return None
        if not self.rare_rows:  # among few inputs how common a word is cannot be told: count them
            if len(varying) >= RENAME_SHORT_WORDS and (len(words) >= RENAME_MIN_WORDS or any(map(self.rare, varying))):
                return "renamed", spans, filled
            return "weak", spans, filled
        chance = _ways(spans, starts) * self.frames.chance(field, e.fields()[1], opened)
        if len(words) >= RENAME_SHORT_WORDS and chance <= RENAME_CHANCE:
            return "renamed", spans, filled
        return "weak", spans, filled

    def improbable(self, e: Input, kept: list[tuple[int, int]], spans: list[tuple[int, int]],
                    starts: list[int]) -> bool:
        """Whether a legitimate input would hold what a row kept of ``e`` (``kept``: the run of each of its
        fields found, the rest of the field open), at any place of the row's fields it was found in
        (``spans``), by chance at most ``RENAME_CHANCE`` times (``frames.chance``, as a renamed copy)."""
        field, fstarts = e.fields()
        opened = [at + x for (lo, hi), (p_lo, p_hi), at in zip(kept, e.parts, fstarts[:-1], strict=True)
                  for x in range(p_hi - p_lo) if not lo <= p_lo + x < hi]
        return _ways(spans, starts) * self.frames.chance(field, fstarts, opened) <= RENAME_CHANCE

    def value_for_value(self, ours: str, theirs: str) -> bool:
        """``theirs`` in place of ``ours`` (the input's) changes one of the input's values (``values_differ``):
        a number for a number, or a name for a name where the input's is no word of the task's structure
        (a reworded lead-in, `Question:` for `Q:`, changes the question's words, no value of the input)."""
        return kind(ours) is not None and kind(ours) == kind(theirs) and not self.structural(ours)

    def says_which(self, e: Input) -> bool:
        """Whether an input's varying text says which input it is wherever it is found: two names or
        numbers, or one rare one (`'Rounded'`); one common name and punctuation (`y ) :`, the rest of
        `def __init__(self, y):` shared text) only where it is all its field says, as a shorter input."""
        if e.says >= 2 or not self.rare_rows:  # (among few inputs, how common a word is cannot be told)
            return True
        return e.says == 1 and self.rare(next(t for t in e.varying if CONTENT.fullmatch(t)))

    def says(self, word: str) -> bool:
        """A name or a number, not of the task's vocabulary: alone, it may say which input a copy is of."""
        return bool(CONTENT.fullmatch(word)) and not self.structural(word)

    def rare(self, word: str) -> bool:
        return self.word_df.get(word, 0) <= self.rare_rows

    def structural(self, word: str) -> bool:
        """A word of the task's structure (in ``STRUCTURE_SHARE`` of the evaluation inputs and at least
        ``MIN_COMMON_ROWS``; never a number, a value however common): changing it asks another kind of
        question, it renames nothing, and left alike it does not say which input a copy is of."""
        return not word.isdigit() and self.word_df.get(word, 0) >= self.structural_rows


def _ways(spans: Sequence[tuple[int, int]], starts: Sequence[int]) -> int:
    """Where what was found (``spans`` of a training row's tokens, its parts starting at ``starts``) could
    lie by chance: at each offset of each field it lies in."""
    ways = 1
    for begin, end in spans:
        k = bisect_right(starts, begin) - 1
        ways *= starts[k + 1] - starts[k] - (end - begin) + 1
    return ways
