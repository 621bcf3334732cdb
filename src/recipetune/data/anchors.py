"""Where decontamination looks for an evaluation input in a training row (``data/decontam.py`` judges
what it finds): each input's **anchors**, its two rarest token pairs with no token in common, so
that one changed token leaves one of them, and the **alignment** of the input against the row's
tokens at an anchor: the same tokens, or the same with one name or one number changed (at one place
or everywhere) to another of its type, never an operator; and whether a row that holds an input's
varying tokens holds other values at the input's shared places (``values_differ``). Whether what is
left alike says which input a one-token copy is of is not decided here.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

_IDENTIFIER = re.compile(r"[^\W\d]\w*")  # a word that starts with a letter or _: a name, not a number


@dataclass(frozen=True)
class Input:
    """An evaluation input, checked by alignment at its anchors (whole, or with one token changed)."""

    split: str
    varying: tuple[str, ...]
    full: tuple[str, ...]  # all its tokens, shared text included
    start: int  # where ``varying`` begins in ``full``
    pieces: tuple[tuple[int, int], ...]  # ``varying[lo:hi]`` of each part that has some: found part by part
    where: tuple[int, ...]  # each varying token's position in ``full``
    parts: tuple[tuple[int, int], ...]  # the part (field) of ``full`` each piece lies in
    part_ids: tuple[int, ...]  # and that part's index among the input's parts
    says: int  # how many distinct names and numbers ``varying`` holds: what can say which input it is

    def fields(self) -> tuple[list[str], list[int]]:
        """The fields its varying tokens lie in, their tokens joined, and where each starts (a last entry
        at the end): what a copy of it must hold."""
        field, starts = [], [0]
        for lo, hi in self.parts:
            field += self.full[lo:hi]
            starts.append(len(field))
        return field, starts


def pieces_of(pos: Sequence[int], starts: list[int]) -> tuple[tuple[int, int], ...]:
    """The runs of varying tokens (by their index in the varying tokens) that lie in one part each."""
    out, lo = [], 0
    for end in starts[1:]:
        hi = bisect_left(pos, end)
        if hi > lo:
            out.append((lo, hi))
        lo = hi
    return tuple(out)


def anchors_of(v: list[str], df: Counter, pieces: tuple[tuple[int, int], ...],
             says=lambda word: True) -> list[tuple[Any, int]]:
    """Where an input is looked for: its rarest token pair within one piece (part), and a second one
    with none of the first's tokens, so one changed token leaves one of them; where there is none (4
    tokens, the rarest pair in the middle), the pairs on either side of the first: a change at either
    of its tokens leaves one of them. Where one token is in every anchor still (an input of 2 or 3
    varying tokens: `lodz bergen`, `,true,false,` masked between them), the rarest token outside it
    alone, or, where none is, each of those tokens alone: only a token that ``says`` which input it
    is (a name or a number, not of the task's vocabulary: `def` alone is in every row, and a copy that
    keeps only it is no copy). An input whose pieces are all one token long: its first token."""
    inside = [i for lo, hi in pieces for i in range(lo, hi - 1)]
    if not inside:
        return [(v[0], 0)]
    pairs = sorted(inside, key=lambda i: (df[(v[i], v[i + 1])], i))
    first = pairs[0]
    out = [((v[first], v[first + 1]), first)]
    for i in pairs[1:]:
        if not {v[i], v[i + 1]} & {v[first], v[first + 1]}:
            return [*out, ((v[i], v[i + 1]), i)]
    out += [((v[i], v[i + 1]), i) for i in (first - 1, first + 1) if i in inside]
    every = set.intersection(*({i, i + 1} for _, i in out))  # where one change loses every anchor
    if every:
        outside = [i for i in range(len(v)) if i not in every and says(v[i])]
        alone = [min(outside, key=lambda i: (df[v[i]], i))] if outside else [i for i in sorted(every) if says(v[i])]
        out += [(v[i], i) for i in alone]
    return out


def aligned(original: Sequence[str], u: Sequence[str], at: int) -> str | None:
    """``same`` when ``u[at:]`` starts with ``original``; ``renamed`` when it does with one token
    changed (at one place or everywhere) and nothing else: a name for a name or a number for a number;
    else None (most candidates fail at once). Whether what is left alike says which input it is, and
    whether a word of the task's structure may change, ``data/decontam.py`` decides."""
    if at + len(original) > len(u):
        return None
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
    if kind(old) is None or kind(old) != kind(new) or new in original:
        return None
    return "renamed"


def values_differ(e: Input, toks: Sequence[str], firsts: Sequence[int], starts: Sequence[int],
                  value_for_value: Callable[[str, str], bool]) -> bool:
    """Whether a training row (``toks``, its parts starting at ``starts``), where it holds ``e``'s varying
    tokens (each piece's first at ``firsts``), holds other values than ``e`` at ``e``'s own shared places: a
    run of its fields' shared text changed token for token, each pair a value changed (``value_for_value``:
    the input's token, the row's), where the text on either side is alike (or both fields end there).
    Shared text is masked for being common, and a value of few choices is common (``v=7``,
    ``tab=billing``): a row with an input's user name but another tab and version is another input of
    the URL's template, not that input."""
    for (lo, _), (p_lo, p_hi), first in zip(e.pieces, e.parts, firsts, strict=True):
        k = bisect_right(starts, first) - 1
        ours = e.full[p_lo:p_hi]
        begin = first - (e.where[lo] - p_lo)  # where ours[0] would be in the row's tokens
        theirs = [toks[y] if starts[k] <= y < starts[k + 1] else None for y in range(begin, begin + len(ours))]
        # alike at each place, and past either end where the row's field ends there too
        alike = [begin <= starts[k], *(a == b for a, b in zip(ours, theirs, strict=True)),
                 begin + len(ours) >= starts[k + 1]]
        x = 0
        while x < len(ours):
            end = x  # the run of changed values from x
            while (end < len(ours) and not alike[end + 1] and theirs[end] is not None
                   and value_for_value(ours[end], theirs[end])):
                end += 1
            if end > x and alike[x] and alike[end + 1]:
                return True
            x = end + 1
    return False


def widened(e: Input, toks: Sequence[str], begins: Sequence[int], ends: Sequence[int], starts: Sequence[int]
            ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Where each of ``e``'s pieces lies in a training row's tokens (``toks``, its parts starting at
    ``starts``; the piece's varying tokens from ``begins[m]`` to ``ends[m]``), widened over the input's
    own shared text around it as far as the row's field holds it alike (a docstring's masked "Return"
    is part of the copy): (those spans, and the run of ``e.full`` each holds)."""
    spans, kept = [], []
    for (lo, hi), begin, end in zip(e.pieces, begins, ends, strict=True):
        part = bisect_right(starts, begin) - 1
        a, b = e.where[lo] - 1, begin - 1
        while a >= 0 and b >= starts[part] and e.full[a] == toks[b]:
            a, b, begin = a - 1, b - 1, begin - 1
        first = a + 1
        a, b = e.where[hi - 1] + 1, end
        while a < len(e.full) and b < starts[part + 1] and e.full[a] == toks[b]:
            a, b, end = a + 1, b + 1, end + 1
        spans.append((begin, end))
        kept.append((first, a))
    return spans, kept


def kind(token: str) -> str | None:
    """A token's type for a one-token change: ``name``, ``number``, else None (punctuation, an operator)."""
    return "name" if _IDENTIFIER.fullmatch(token) else "number" if token.isdigit() else None
