"""A model of the search space from the tree's own results: Optuna's TPE fitted to the measured nodes
(``SpaceModel``, the analyst's ``search.explore: model``), and the moves that raised a parent's
score elsewhere in the tree (``helped_moves``, the analyst's ``helped`` rule)."""

from __future__ import annotations

import json
import math
import random

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from recipetune.core.recipe import Scalar
from recipetune.engine.researcher import SearchContext, fmt_value, member
from recipetune.engine.samplers import FeasibleSampler, StableTPE, distributions
from recipetune.engine.status import Status
from recipetune.engine.tree import Node, Tree


def helped_moves(tree: Tree, knobs: list[str]) -> list[tuple[dict[str, Scalar], Node, float]]:
    """Every move in the tree that raised its parent's score: (the knobs it changed, as the child
    has them; the child; its gain on the parent), the largest gain first, each move once (at its
    largest gain). Only a node that ran to its end counts: a pruned child's value is from a
    checkpoint, a failed or refused one has none. Only moves within ``knobs``.

    Made on another node, such a move is a step the tree has already seen pay off: where two moves
    each helped on their own, their combination is one child away instead of two expansions deep."""
    best: dict[str, tuple[dict[str, Scalar], Node, float]] = {}
    allowed = set(knobs)
    for child in tree:
        parent = child.parent
        if (parent is None or child.status != Status.PASSED or child.score is None or parent.score is None
                or not math.isfinite(child.score) or not math.isfinite(parent.score)):
            continue
        gain = child.score - parent.score
        move = child.recipe.edits_from(parent.recipe)
        if gain <= 0 or not move or not set(move) <= allowed:
            continue
        key = json.dumps(move, sort_keys=True, default=str)
        if key not in best or gain > best[key][2]:
            best[key] = (move, child, gain)
    return sorted(best.values(), key=lambda m: -m[2])


def _gamma(n: int) -> int:
    """How many of ``n`` nodes TPE counts as good: Optuna's default ``gamma``, for the rationale."""
    return min(math.ceil(0.1 * n), 25)


class SpaceModel:
    """A model of the space fitted to the tree's own results: Optuna's TPE over the nodes measured so
    far (each node's values of the searched knobs; its score, or a poor result where it failed, was
    refused or was pruned), in an in-memory study, asked for points anywhere in the space. Where knobs
    are related it draws only feasible points (engine/samplers.py: ``FeasibleSampler``). Seeded by the
    campaign's seed, the node and the tree's size: the same tree gets the same draws, a resumed campaign
    the ones the uninterrupted one would have. Below ``min_scored`` nodes with a score it has no model
    (``fit`` returns None): the analyst falls back to the seeded uniform choice."""

    def __init__(self, seed: int = 0, min_scored: int = 2, asks: int = 4):
        self.seed, self.min_scored, self.asks = seed, min_scored, asks

    def trials(self, context: SearchContext) -> tuple[dict[str, BaseDistribution], list[FrozenTrial]]:
        """The tree as Optuna trials: a scored node COMPLETE with its score, every other one that
        is done (failed, refused, pruned) PRUNED without a value, which TPE ranks below every score."""
        dists = distributions(context.space, context.baseline)
        out = []
        for node in context.tree:
            params = {n: node.recipe.get(n) for n in dists}
            if any(not member(v, tuple(d.choices)) for v, d in  # type: ignore[attr-defined]
                   zip(params.values(), dists.values(), strict=True)):
                continue  # a value outside the space (a derived or repaired knob): not a point of it
            if node.status in (Status.BASELINE, Status.PASSED) and node.score is not None and math.isfinite(node.score):
                out.append(create_trial(params=params, distributions=dists, value=float(node.score)))
            else:
                out.append(create_trial(params=params, distributions=dists, state=TrialState.PRUNED))
        return dists, out

    def fit(self, node: Node, context: SearchContext, k: int) -> tuple[list[dict[str, Scalar]], str] | None:
        """Up to ``asks * k + 8`` distinct draws of TPE, and what the model was (for the rationale)."""
        dists, trials = self.trials(context)
        scored = sorted((t.value for t in trials if t.state == TrialState.COMPLETE), reverse=True)
        if len(scored) < self.min_scored or not dists:
            return None
        seed = random.Random(f"{self.seed}-model-{node.id}-{len(context.tree)}").getrandbits(32)
        sampler: optuna.samplers.BaseSampler = StableTPE(seed=seed, n_startup_trials=0)
        if context.relations:
            sampler = FeasibleSampler(sampler, dists, context.relations, context.baseline)
        study = optuna.create_study(direction="maximize", sampler=sampler)
        study.add_trials(trials)
        draws: list[dict[str, Scalar]] = []
        for _ in range(self.asks * k + 8):
            draw = dict(study.ask(dists).params)
            if draw not in draws:
                draws.append(draw)
        good = _gamma(len(trials))
        failed = len(trials) - len(scored)
        note = (f"model: TPE over {len(trials)} nodes ({failed} failed, refused or stopped) draws near the best "
                f"{good} (score >= {fmt_value(scored[min(good, len(scored)) - 1])})")
        return draws, note


# One child an analyst rule offers: the edits, whether those knobs stay as asked when relations are
# repaired, and its own account where the model drew it or it is a move that helped elsewhere.
