"""How the next trial is chosen: the strategy interface of the one search loop (engine/loop.py).

    strategy.ask()            the next candidate, WAIT (what is left to try is running), or None (done)
    strategy.tell(c, node)    a candidate's node: refused at once, or landed after its run

Two implementations: ``TreeStrategy`` (MCTS: the tree selects a node and the Researcher proposes
its children) and ``SamplerStrategy`` (an Optuna sampler proposes from the root: tpe, gp, random,
grid). Both see the search only through ``SearchView``: the tree, what is taken, the job's check.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Protocol

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from recipetune.core.recipe import KnobError, Recipe
from recipetune.core.relations import Relations
from recipetune.engine.effects import Effects, Pooled
from recipetune.engine.researcher import Proposal, Proposer, SearchContext
from recipetune.engine.store import CampaignStore
from recipetune.engine.tree import Node, Tree


@dataclass
class Candidate:
    """A recipe to try: where it hangs in the tree, who proposed it and why, and (for a sampler)
    the study's trial that asked for it."""

    recipe: Recipe
    parent: Node
    proposal: Proposal
    note: str = ""  # what the job's check set on the way (coupled knobs)
    trial: optuna.trial.Trial | None = None


class Wait:
    """Everything new to try is running (here or on another driver): wait for a run to land."""


WAIT = Wait()


class SearchView(Protocol):
    """What a strategy may read and do: the search's tree, what is taken, the job's coupling, and
    the study (a sampler's repeats are recorded there so it hears them)."""

    tree: Tree
    store: CampaignStore
    dists: dict[str, BaseDistribution]
    effects: Effects | None  # the set-aside rule (engine/effects.py); None: nothing is set aside

    def taken(self, recipe: Recipe) -> bool: ...

    def inflight_ids(self) -> set[str]: ...

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]: ...

    def phase(self, text: str) -> None: ...

    def record_rejections(self, context: SearchContext) -> None: ...

    def record_repeat(self, candidate: Candidate, prior: Node | None) -> None: ...

    def record_set_aside(self, candidate: Candidate, value: float) -> None: ...


def released(view: SearchView) -> Candidate | None:
    """Nothing else is left: the set-aside recipe predicted fastest, as a candidate (its rationale
    says it was set aside and why it runs now), or None when none is."""
    pooled: Pooled | None = view.effects.release(view.taken) if view.effects is not None else None
    if pooled is None:
        return None
    aside = pooled.aside
    why = (f"set aside earlier (predicted {aside.predicted:.2g}x the incumbent's speed, for {aside.culprit()}); "
           "run now: nothing else is left")
    view.phase(f"running {aside.change}, {why}")
    recipe, note = view.couple(aside.recipe)
    return Candidate(recipe, pooled.parent, Proposal(pooled.edits, why, pooled.source), note)


class Strategy(Protocol):
    name: str

    def ask(self) -> Candidate | Wait | None: ...

    def tell(self, candidate: Candidate, node: Node | None) -> None:
        """``node`` is None when another driver holds the recipe (it was not run here)."""

    def exhausted(self) -> str:
        """Why there is nothing left to try, for the log."""


class TreeStrategy:
    """MCTS (TREX): select a node (UCT, or the ablation's greedy/sequential), let the Researcher
    propose children, try them in turn; a node whose ideas are all tried is exhausted."""

    def __init__(self, view: SearchView, proposer: Proposer, context: SearchContext, children: int,
                 selection: str = "uct"):
        self.view, self.proposer, self.context = view, proposer, context
        self.children, self.selection = children, selection
        self.name = f"mcts-{proposer.name}"
        self.queue: list[Candidate] = []  # the current expansion's proposals not yet started

    def ask(self) -> Candidate | Wait | None:
        view, tree = self.view, self.view.tree
        while True:
            if not self.queue:
                node = tree.select(self.selection)
                if node is None:
                    return released(view)
                proposals = self.proposer.propose(node, self.context, self.children)
                view.record_rejections(self.context)
                # Proposers skip what was tried; this holds for any proposer, so a node can only be
                # selected again if it produced something new.
                fresh = [p for p in proposals if not view.taken(view.couple(node.recipe.with_(**p.edits))[0])]
                if not fresh:
                    if any(view.couple(node.recipe.with_(**p.edits))[0] not in tree for p in proposals):
                        return WAIT  # its ideas are running (here or elsewhere), not used up
                    node.exhausted = True
                    if node.id in self.context.failed:  # a failed Researcher, not one with nothing new: say so
                        where = node.recipe.describe_diff(tree.root.recipe)
                        view.phase(f"{self.proposer.name} proposer failed at {where}: {self.context.failed[node.id]}")
                    continue
                self.queue = [Candidate(node.recipe, node, p) for p in fresh]
            c = self.queue.pop(0)
            recipe, note = view.couple(c.parent.recipe.with_(**c.proposal.edits))
            if view.taken(recipe):  # two proposals of one round may coincide
                continue
            c.recipe, c.note = recipe, note
            return c

    def tell(self, candidate: Candidate, node: Node | None) -> None:
        pass  # the tree the next selection reads is the search's own: nothing more to learn

    def exhausted(self) -> str:
        failed = self.context.failed
        why = f" ({len(failed)} of its nodes only because no answer of the Researcher was usable)" if failed else ""
        return f"the tree is exhausted: no proposer has anything new to try{why}"


class SamplerStrategy:
    """An Optuna sampler (engine/samplers.py) asks the study for the next point; every candidate
    hangs from the root. A point already tried is told to the sampler as that trial's value (it
    must hear an outcome to move on) and is not run again; after 100 repeats in a row, or once every
    feasible point was tried, the space is exhausted. A point the measured trials predict far slower
    than the incumbent (engine/effects.py) is set aside: its trial is told that prediction, nothing
    runs, and it counts as a repeat; the set-aside points run, fastest predicted first, only when
    nothing else is left."""

    MAX_REPEATS = 100

    def __init__(self, view: SearchView, name: str, relations: Relations | None = None):
        self.view, self.name, self.relations = view, name, relations
        self.baseline = view.tree.root.recipe
        self.dists = view.dists
        points = relations.feasible_points(self.baseline, {n: d.choices for n, d in self.dists.items()}) \
            if relations else None  # type: ignore[attr-defined]
        self.n_feasible = len(points) if points is not None else None
        self.repeats = self.before = 0

    def space_size(self) -> int:
        if self.n_feasible is not None:
            return self.n_feasible
        return math.prod(len(d.choices) for d in self.dists.values() if isinstance(d, CategoricalDistribution))

    def grid_done(self) -> bool:
        study = self.view.store.study
        return isinstance(study.sampler, optuna.samplers.GridSampler) and study.sampler.is_exhausted(study)

    def draw(self) -> tuple[optuna.trial.Trial, Recipe]:
        """The sampler's next point, as a recipe (derived knobs computed), and its open trial."""
        trial = self.view.store.ask(self.dists)
        recipe = self.baseline.with_(**trial.params)
        if self.relations:
            with contextlib.suppress(KnobError):  # else the job's check says why
                recipe = self.relations.derive(recipe)
        return trial, recipe

    def ask(self) -> Candidate | Wait | None:
        view, tree = self.view, self.view.tree
        while True:
            aside = len(view.effects.pool) if view.effects is not None else 0
            if self.grid_done() or len(tree) + len(view.inflight_ids()) + aside >= self.space_size() \
                    or self.repeats > self.MAX_REPEATS:
                return released(view)
            trial, recipe = self.draw()
            edits = recipe.edits_from(self.baseline)
            proposal = Proposal(edits, f"{self.name} sampler", self.name)
            recipe, note = view.couple(recipe)
            candidate = Candidate(recipe, tree.root, proposal, note, trial)
            if recipe in tree or recipe.id in view.inflight_ids():
                self.repeats += 1
                view.record_repeat(candidate, tree.nodes.get(recipe.id))
                continue
            judged = view.effects.judge(recipe) if view.effects is not None else None
            if judged is not None:  # the sampler hears the prediction as this point's value; nothing runs
                self.repeats += 1
                view.effects.hold(judged, tree.root, edits, self.name)  # type: ignore[union-attr]
                view.record_set_aside(candidate, judged.predicted * judged.incumbent)
                continue
            self.before, self.repeats = self.repeats, 0  # a new point: the count of repeats starts again
            return candidate

    def tell(self, candidate: Candidate, node: Node | None) -> None:
        if node is None:  # another driver's recipe (told to the sampler as such): a repeat all the same
            self.repeats = self.before + 1

    def exhausted(self) -> str:
        return "the search space is exhausted"
