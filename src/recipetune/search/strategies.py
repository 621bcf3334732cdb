"""Optuna samplers as search strategies, for comparison with the tree search.

``tpe``, ``random`` and ``grid`` choose recipes through Optuna's ask-and-tell interface over the
campaign's space (a categorical distribution per searched knob: its listed values and the
baseline's). They are screened and rewarded exactly like the tree's candidates; ``mcts`` (the
default) does not use a sampler to choose, only to satisfy the study.
"""

from __future__ import annotations

import math

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from recipetune.recipe import Recipe, SearchSpace
from recipetune.store import CampaignStore, distributions

STRATEGIES = ("mcts", "tpe", "random", "grid")


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler calls Study.stop() after the last grid point, which only works inside
    Study.optimize; under ask-and-tell the campaign checks ``is_exhausted`` itself."""

    def after_trial(self, study, trial, state, values) -> None:  # type: ignore[no-untyped-def]
        pass


def make_sampler(strategy: str, space: SearchSpace, baseline: Recipe, seed: int,
                 parallel: int = 1) -> optuna.samplers.BaseSampler:
    """The sampler of ``strategy``; ``seed`` should differ per session so a resume draws afresh.
    With trials in flight at once, TPE uses its constant liar: a running trial counts as a poor
    result, so the next draw looks elsewhere (Optuna's own batch mechanism)."""
    if strategy == "tpe":
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=min(5, max(2, space.size() // 4)),
                                          constant_liar=parallel > 1)
    if strategy == "grid":
        grid = {n: list(d.choices) for n, d in distributions(space, baseline).items()}  # type: ignore[attr-defined]
        return AskTellGridSampler(grid, seed=seed)
    if strategy in ("random", "mcts"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")


class OptunaStrategy:
    """Asks the study's sampler for the next recipe."""

    def __init__(self, name: str, store: CampaignStore, space: SearchSpace, baseline: Recipe):
        self.name, self.store, self.baseline = name, store, baseline
        self.dists: dict[str, BaseDistribution] = distributions(space, baseline)

    def space_size(self) -> int:
        return math.prod(len(d.choices) for d in self.dists.values() if isinstance(d, CategoricalDistribution))

    def exhausted(self) -> bool:
        sampler = self.store.study.sampler
        return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(self.store.study)

    def ask(self) -> tuple[optuna.trial.Trial, Recipe]:
        trial = self.store.ask(self.dists)
        return trial, self.baseline.with_(**trial.params)
