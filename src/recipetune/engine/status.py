"""A trial's status, defined once: the engine's word for where a trial stands (every job's trials have
one), a ``str`` enum whose values are the strings the study has always kept (core/words.py: ``Word``
says why nothing on disk changes)."""

from __future__ import annotations

from typing import Literal

from recipetune.core.words import Word


class Status(Word):
    """A trial's status (engine/record.py: ``Trial.status``), as the study keeps it."""

    RUNNING = "running"
    PASSED = "passed"  # ran and passed the job's check: it has a score
    REJECTED = "rejected"  # refused: before running (the job's check) or by its screening
    FAILED = "failed"  # crashed, out of memory, lost ...: the cause says
    PRUNED = "pruned"  # stopped early by the study's pruner
    DUPLICATE = "duplicate"  # a sampler asked for a recipe already tried: nothing ran
    SET_ASIDE = "set aside"  # predicted far slower than the incumbent (engine/effects.py): not run, yet
    UNRUN = "unrun"  # other drivers' runs took the shared budget first
    INTERRUPTED = "interrupted"  # its driver stopped while it ran: its recipe may run again
    BASELINE = "baseline"  # the tree's root


class Refusal(Word):
    """Why a recipe gets no run (engine/store.py: ``Refused.reason``)."""

    CLAIMED = "claimed"  # a driver, this one included, already has it
    REJECTED = "rejected"  # the job's check refused it
    BUDGET = "budget"  # other drivers' runs took every slot of the shared budget


# The statuses a node of the tree holds (engine/tree.py: Node.status, engine/job.py: Landing.status).
NodeStatus = Literal[Status.BASELINE, Status.PASSED, Status.REJECTED, Status.FAILED, Status.PRUNED]
# A trial's status once its node is in the tree (a resume rebuilds the tree from these).
FINISHED = frozenset({Status.PASSED, Status.REJECTED, Status.FAILED, Status.PRUNED})
