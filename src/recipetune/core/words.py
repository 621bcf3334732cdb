"""The words the product decides in, defined once, as ``str`` enums whose values are the strings
campaigns have always written (verdict.json, the study's attributes, the report's JSON), so nothing
on disk changes: a member compares and hashes as its string (``Decision.APPROVED == "APPROVED"``),
``json.dumps`` and pydantic write its string, an f-string prints its value. (YAML's safe dumper does
not know a ``str`` subclass: give it ``.value``.)

Python 3.10 has no ``enum.StrEnum``: ``Word`` is ``(str, Enum)`` with str's own ``__str__`` and
``__format__``, without which Python 3.11 prints ``Decision.APPROVED``.

Here in core/ because the deciders sit in two peer packages that may not import each other (the
guard's verdict, guard/verdict.py; the quality job's, finetune/decide.py) and both jobs report them.
A trial's status is the engine's: engine/status.py.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A product word: a ``str`` that prints, formats and serialises as its value."""

    __str__ = str.__str__
    __format__ = str.__format__


class Decision(Word):
    """A verdict's or a campaign's decision (verdict.json: ``decision``)."""

    APPROVED = "APPROVED"  # the candidate is better, with the evidence behind it
    KEEP_BASELINE = "KEEP BASELINE"  # nothing beat the baseline beyond its noise
    REJECTED = "REJECTED"  # the candidate breaks what must hold (the speed job: loss parity, the static check)
