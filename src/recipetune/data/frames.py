"""Whether a training input that is an evaluation input with one token changed says which input it
is a copy of (``data/decontam.py`` finds such rows; this module weighs them, issue 50).

A one-token copy leaves a **frame**: the input's fields with the changed token's places left open,
``def _(self, other, context=None):``, ``(54 - 51) * _ + 2``, ``Lodz,true,false,_``. Two things
about the frame decide, both learnt from the evaluation inputs alone:

- **Siblings.** Where another evaluation input fills the same frame, the open slot is what tells the
  task's inputs apart (methods that share a parameter list): a training row that fills it a third
  way is one more input of that family, not a copy (``siblings``).
- **Chance.** How many of the N evaluation inputs a legitimate input would match in this frame by
  chance: N x the frame's probability (``chance``), the product over its **runs** (what is left
  alike between the open places, field by field; punctuation alone not counted) of each run's
  probability, the larger of two estimates: the share of the *other* evaluation inputs that hold
  the run anywhere in their fields (text the inputs share is probable however it is placed:
  ``( * args , * * kwargs ) :`` ends many signatures, and keeping it says little), and the product
  of the shares of its names and numbers at their places (each word counted in the input itself
  too, so one only it has is 1 in N, never impossible; a word found at many places gets at least
  its average share of a place, since text of varying length before it moves it; and words that
  come together are counted once: a word gets at least its share among the other inputs that have
  the word before it, where that pair recurs in two or more of them; `ttk` after `tkinter`, `false`
  after `true` in a row of flags, say nothing the first did not). Three numbers of an expression in
  their places are improbable; ``347+588=`` keeps one number, a run of probability at least 1/N:
  never a copy.
"""

from __future__ import annotations

import re
import zlib
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Sequence

CONTENT = re.compile(r"\w+")  # a name or a number (`2918ms`: with its unit): what says which input a copy is of
_MASK = (1 << 64) - 1
_LENGTH = 0xD6E8FEB86659FD93


class Frames:
    """The frames, runs and words of the evaluation inputs' fields (``learn`` each input once)."""

    def __init__(self) -> None:
        self.inputs = 0
        self.frames: Counter = Counter()  # frame hash -> how many inputs fill it
        self.places: Counter = Counter()  # (field, offset, name or number) -> inputs with it there
        self.fields: list[tuple[str, ...]] = []  # each input's fields, joined
        self.holding: dict[str, list[int]] = {}  # token -> the inputs whose fields hold it
        self.follows: Counter = Counter()  # (name or number, gap, the next one) -> inputs with that pair
        self._word_places: Counter | None = None
        self._runs: dict[tuple[str, ...], int] = {}  # run -> inputs holding it (asked again and again)

    def learn(self, field: Sequence[str], starts: Sequence[int]) -> None:
        """An evaluation input: its fields' tokens, joined, and where each field starts (a last entry at
        the end)."""
        at: dict[str, list[int]] = {}
        for i, t in enumerate(field):
            if CONTENT.fullmatch(t):
                at.setdefault(t, []).append(i)
        whole = frame(field, ())
        for word, opened in at.items():  # (one pass over the field: a frame's hash is a sum over places)
            self.frames[_reopen(whole, opened, word)] += 1
        self.places.update(set(_places(field, starts)))
        content = sorted(i for places in at.values() for i in places)
        self.follows.update({(field[a], b - a, field[b]) for a, b in zip(content, content[1:], strict=False)})
        for t in set(field):
            self.holding.setdefault(t, []).append(self.inputs)
        self.fields.append(tuple(field))
        self.inputs += 1
        self._word_places = None

    def siblings(self, field: Sequence[str], opened: Sequence[int]) -> int:
        """How many evaluation inputs fill the frame (the input itself among them)."""
        return self.frames[frame(field, opened)]

    def chance(self, field: Sequence[str], starts: Sequence[int], opened: Sequence[int]) -> float:
        """How many evaluation inputs a legitimate input would match by chance in the frame (``field``,
        an evaluation input's, with ``opened`` left open): N x its probability (the module docstring)."""
        if self._word_places is None:
            self._word_places = Counter(word for _, _, word in self.places)
        n = max(self.inputs, 1)
        shut = set(opened)
        chance = float(n)
        bounds = sorted({*starts, *shut, *(i + 1 for i in shut)})
        for lo, hi in zip(bounds, bounds[1:], strict=False):
            if lo in shut or lo >= hi:
                continue
            run = tuple(field[lo:hi])
            if not any(CONTENT.fullmatch(t) for t in run):
                continue  # punctuation alone (a closing quote) says nothing of which input it is
            by_words, before = 1.0, None
            for key in _places(field, starts, lo, hi):
                word, at = key[2], starts[key[0]] + key[1]
                share = max(self.places[key], self.holding_count(word) / self._word_places[word]) / n
                if before is not None and (pair := self.follows[field[before], at - before, word] - 1) >= 2:
                    # how often it follows the word before it in the other inputs that have that one, where
                    # the pair recurs (seen in one other input, it may be chance)
                    share = max(share, pair / (self.holding_count(field[before]) - 1))
                by_words *= share
                before = at
            chance *= max((self.holding_run(run) - 1) / n, by_words)
        return chance

    def holding_count(self, token: str) -> int:
        return len(self.holding.get(token, ()))

    def holding_run(self, run: tuple[str, ...]) -> int:
        """How many evaluation inputs hold ``run`` (a run of tokens) somewhere in their fields."""
        if run not in self._runs:
            if len(self._runs) >= 20_000:
                self._runs.clear()
            rarest = min(run, key=self.holding_count)
            k = len(run)
            self._runs[run] = sum(any(f[i : i + k] == run for i in range(len(f) - k + 1))
                                  for f in (self.fields[j] for j in self.holding.get(rarest, ())))
        return self._runs[run]


def fill(field: Sequence[str], opened: Sequence[int], value: str) -> str:
    """A frame (an input with the places at ``opened`` left open) and what fills it, as text a data step's
    Arrow column holds: rows that fill one frame alike share the part before the space."""
    return f"{frame(field, opened):016x} {value}"


def families(fills: Sequence[Sequence[str]], renamed: Sequence[str | None]) -> list[bool]:
    """Which training rows' renamed copy (``renamed``: its ``fill``, None where a row's overlap is none)
    is one of a family of the training rows (``fills``: every frame each row fills, a copy or not):
    another row fills its frame with another value (``def _(self, other):``,
    ``self.assertEqual(ev.data, _)``), so the slot is what tells the task's rows apart, as an
    evaluation input's siblings show (``Frames.siblings``). Such a row is no copy: a legitimate row
    would fill the frame as well (issue 50). The training rows are the best sample of how the task's
    rows vary: a frame two of them fill is common, however improbable the evaluation inputs make it
    look. (Two renamed copies of one input, each with another value, are a family too: a blind spot.)"""
    values: dict[str, set[str]] = {}
    for row in fills:
        for f in row:
            where, value = f.split(" ", 1)
            values.setdefault(where, set()).add(value)
    return [r is not None and len(values[r.split(" ", 1)[0]]) > 1 for r in renamed]


def _places(field: Sequence[str], starts: Sequence[int], lo: int = 0, hi: int | None = None
            ) -> Iterator[tuple[int, int, str]]:
    """(field, offset in it, token) of each name or number in ``field[lo:hi]``."""
    hi = len(field) if hi is None else hi
    for i in range(lo, hi):
        if CONTENT.fullmatch(field[i]):
            k = bisect_right(starts, i) - 1
            yield k, i - starts[k], field[i]


def _place(i: int, token: str) -> int:
    """A token at a place, hashed the same in every process (``hash`` of a string is salted per process)."""
    h = (zlib.crc32(token.encode()) + 1) * 0x9E3779B97F4A7C15 ^ (i + 1) * 0xBF58476D1CE4E5B9
    return (h ^ (h >> 29)) * 0x94D049BB133111EB & _MASK


def frame(field: Sequence[str], opened: Sequence[int]) -> int:
    """A hash of ``field`` with the tokens at ``opened`` left open (inputs one token apart there share
    it): the sum of its tokens' hashes at their places, an open place hashed as the empty token."""
    shut = set(opened)
    return sum(_place(i, "" if i in shut else t) for i, t in enumerate(field)) + len(field) * _LENGTH & _MASK


def _reopen(whole: int, opened: Sequence[int], token: str) -> int:
    """``frame(field, opened)`` from ``frame(field, ())``, where ``token`` is at every place of ``opened``."""
    return whole + sum(_place(i, "") - _place(i, token) for i in opened) & _MASK
