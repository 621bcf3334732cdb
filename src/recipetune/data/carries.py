"""Whether what decontamination found of an evaluation input in a training row carries the row's
question (``data/decontam.py``'s "where the copy carries the question"): a short input counts only
where it is at least a share of what each field it lies in says. ``x[1:]`` in ``print(x[1:])`` is a
copy; a literal ``"u"`` in ``self.write("u")`` asks another question.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence


def carries(begin: int, end: int, pos: Sequence[int], starts: Sequence[int], share: float) -> bool:
    """Whether the tokens ``begin:end`` of a training row (its varying tokens at ``pos``, its parts
    starting at ``starts``) make up at least ``share`` of what each field (part) they lie in says, its
    tokens every row shares (boilerplate) outside them not counted."""
    k = bisect_right(starts, begin) - 1
    while starts[k] < end:
        lo, hi = starts[k], starts[k + 1]
        inside = min(end, hi) - max(begin, lo)
        varying = bisect_left(pos, hi) - bisect_left(pos, lo)
        varying_inside = bisect_left(pos, min(end, hi)) - bisect_left(pos, max(begin, lo))
        if inside < share * (inside + varying - varying_inside):
            return False
        k += 1
    return True


def covers(found: set[int], pos: Sequence[int], starts: Sequence[int], share: float) -> bool:
    """``carries`` for varying tokens found apart (``found``: their indices among the row's varying
    tokens; the n-grams a short input shares with a row): in each field they lie in, they are at least
    ``share`` of its varying tokens."""
    ends = [bisect_left(pos, s) for s in starts[1:]]  # where each part's varying tokens end
    for lo, hi in zip([0, *ends[:-1]], ends, strict=True):
        inside = sum(1 for i in found if lo <= i < hi)
        if inside and inside < share * (hi - lo):
            return False
    return True
