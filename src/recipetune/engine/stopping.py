"""When a campaign starts no more trials: its budget and its stop rules, in one place.

The loop (engine/loop.py) asks ``left`` before each launch and ``why`` for a reason to stop although
runs are left. ``runs`` counts the runs this campaign started (a resumed one's included), ``trial_s``
the seconds its trials ran; ``spent`` is the study's word that other drivers' runs took every slot of
the shared budget (engine/drivers.py: take_run).
"""

from __future__ import annotations

import time

from recipetune.engine.config import Budget
from recipetune.engine.job import Root
from recipetune.engine.status import Status
from recipetune.engine.tree import Tree


class Stopping:
    """The budget a campaign spends (``search.budget``) and the rules that end it early."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self.runs = 0
        self.trial_s = 0.0  # seconds the trials have run, this session and before (budget.trial_s)
        self.spent = False  # every run slot of the study's shared budget is taken
        self.spent_checked = False  # a sync has looked for a dead driver's slots since it was spent
        self.elapsed_before = 0.0  # search time of the sessions before a resume
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.started

    def left(self) -> bool:
        """Runs are left: the trial budget, the shared slots and the wall time all allow one more."""
        wall = self.budget.wall_time_s
        return self.runs < self.budget.trials and not self.spent and (wall is None or self.elapsed() < wall)

    def slots_taken(self) -> None:
        """Other drivers' runs took every slot: no launch until a sync has looked for a dead one's."""
        self.spent, self.spent_checked = True, False

    def why(self, root: Root, tree: Tree) -> str:
        """Why the campaign starts no more trials although runs are left (the job's word on its baseline,
        budget.trial_s, budget.plateau), or ''."""
        if root.stop:
            return root.stop
        budget = self.budget
        if budget.trial_s is not None and self.trial_s >= budget.trial_s:
            return f"the compute budget is spent: the trials ran {self.trial_s:.0f} s of {budget.trial_s:.0f} s"
        if budget.plateau is not None:
            gain = budget.plateau_gain if budget.plateau_gain is not None else root.noise
            best, since = root.score, 0
            for node in sorted((n for n in tree if n.trial is not None), key=lambda n: n.trial or 0):
                if node.status == Status.REJECTED:
                    continue  # refused before running: it cost nothing
                if node.score is not None and node.status == Status.PASSED and (best is None or
                                                                                node.score > best + gain):
                    best, since = node.score, 0
                else:
                    since += 1
            if since >= budget.plateau:
                return f"a plateau: {since} runs in a row without a gain beyond {gain:.4g} over the best ({best:.4g})"
        return ""
