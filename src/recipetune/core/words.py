"""The words the product decides in, defined once, as ``str`` enums whose values are the strings
campaigns have always written (verdict.json, the study's attributes, the report's JSON), so nothing
on disk changes: a member compares and hashes as its string (``Decision.APPROVED == "APPROVED"``),
``json.dumps`` and pydantic write its string, an f-string prints its value. (YAML's safe dumper does
not know a ``str`` subclass: give it ``.value``.)

Python 3.10 has no ``enum.StrEnum``: ``Word`` is ``(str, Enum)`` with str's own ``__str__`` and
``__format__``, without which Python 3.11 prints ``Decision.APPROVED``.

Here in core/ because the deciders sit in two peer packages that may not import each other (the
guard's verdict, guard/verdict.py; the quality job's, finetune/decide.py) and both jobs report them;
the outcomes the statistics reach on the way (core/stats.py, core/sequential.py, the guard's parity
test) beside them, so that a misspelt outcome is an ``AttributeError``, not a silent "look again".
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


class EquivalenceOutcome(Word):
    """What one equivalence test shows (core/stats.py: ``Equivalence.outcome``)."""

    EQUIVALENT = "equivalent"  # the bounds lie inside +-T and the runs resolve T
    DIFFERENT = "different"  # the bounds lie beyond T: shown to differ by more than T
    INCONCLUSIVE = "inconclusive"  # neither: more seeds or steps would tell


class ParityOutcome(Word):
    """What the parity test shows for one loss measure and for the candidate (verdict.json: ``parity.outcome``)."""

    HOLDS = "holds"  # every measure shown within T: the candidate trains as the baseline does
    FAILS = "fails"  # a measure shown beyond T, or not comparable: REJECTED
    INCONCLUSIVE = "inconclusive"  # not shown either way: KEEP BASELINE


class LookOutcome(Word):
    """What a look of a sequential design says besides the test's own outcome (core/sequential.py): the
    quality job's gain ``SHOWN``, or why the looks go on or end. (The parity test's design decides with
    ``ParityOutcome.HOLDS`` and ``FAILS``.) verdict.json: the quality job's ``looks[].outcome``."""

    SHOWN = "shown"  # the gain's bound clears the threshold
    CONTINUE = "continue"  # not decided: the next look at the seeds the design names
    FUTILITY = "futility"  # the chance that the planned seeds decide is below the futility level
    BUDGET = "budget"  # the seeds it would need exceed the budget
    PLAN = "plan"  # the planned seeds did not decide


class LooksStop(Word):
    """Why a design's looks ended (verdict.json: the speed verdict's ``stop``, the quality verdict's ``stop``).
    The quality job's stop is its last look's ``LookOutcome`` or ``TIME``; the same strings."""

    DECIDED = "decided"  # the test showed its outcome (parity holds or fails)
    TREND = "trend"  # the level held, but the gap is shown growing over the window
    FUTILITY = "futility"  # the chance that the planned looks decide is below the futility level
    BUDGET = "budget"  # the runs (seeds) it would need exceed the budget
    PLAN = "plan"  # the planned looks did not decide
    TIME = "time"  # the time budget (guard.max_parity_s, search.max_test_s) ends the looks
    TOO_SHORT = "too short"  # the runs are too short to measure: more of them cannot change it
    FAILED = "failed"  # a candidate run failed


class TrendOutcome(Word):
    """The gap's slope over the compared window (guard/trend.py; verdict.json: ``parity.trend.outcome``)."""

    FLAT = "flat"  # not shown growing away from zero by more than the margin
    GROWS = "grows"  # shown growing: not approved on this evidence
