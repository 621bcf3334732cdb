"""The words the product decides and reports in, defined once: a trial's status (the engine's: every
job's trials have one) and a campaign's decision (both jobs reach it here).

Each is a ``str`` enum whose values are the strings campaigns have always written (the study's
attributes, verdict.json, the report's JSON), so nothing on disk changes: a member compares and
hashes as its string (``Status.PASSED == "passed"``), ``json.dumps`` writes its string, and an
f-string prints its value. Python 3.10 has no ``enum.StrEnum``: ``Word`` is ``(str, Enum)`` with
str's own ``__str__`` and ``__format__``, without which Python 3.11 prints ``Status.PASSED``.
"""

from __future__ import annotations

from enum import Enum


class Word(str, Enum):
    """A product word: a ``str`` that prints, formats and serialises as its value."""

    __str__ = str.__str__
    __format__ = str.__format__


class Status(Word):
    """A trial's status (engine/record.py: ``Trial.status``), as the study keeps it."""

    RUNNING = "running"
    PASSED = "passed"  # ran and passed the job's check: it has a score
    REJECTED = "rejected"  # refused: before running (the job's check) or by its screening
    FAILED = "failed"  # crashed, out of memory, lost ...: the cause says
    PRUNED = "pruned"  # stopped early by the study's pruner
    DUPLICATE = "duplicate"  # a sampler asked for a recipe already tried: nothing ran
    UNRUN = "unrun"  # other drivers' runs took the shared budget first
    INTERRUPTED = "interrupted"  # its driver stopped while it ran: its recipe may run again
    BASELINE = "baseline"  # the tree's root


# A trial's status once its node is in the tree (a resume rebuilds the tree from these).
FINISHED = frozenset({Status.PASSED, Status.REJECTED, Status.FAILED, Status.PRUNED})


class Decision(Word):
    """A campaign's (or a verdict's) decision: verdict.json's ``decision``."""

    APPROVED = "APPROVED"
    KEEP_BASELINE = "KEEP BASELINE"
    REJECTED = "REJECTED"
