"""Optuna samplers for the sampler strategy (engine/strategy.py), for comparison with the tree search.

``tpe``, ``gp``, ``random`` and ``grid`` choose recipes through Optuna's ask-and-tell interface over the
campaign's space (a categorical distribution per searched knob: its listed values and the
baseline's). They are screened and rewarded exactly like the tree's candidates; ``mcts`` (the
default) does not use a sampler to choose, only to satisfy the study.

Where knobs are related (recipetune.core.relations) the samplers draw only feasible points: the grid
lists only feasible points; tpe and random draw the searched knobs jointly from their own per-knob
choices until the point is feasible, and after a few tries repair the last draw to the nearest
feasible point. Derived knobs are never sampled: they are computed from the sampled ones.
"""

from __future__ import annotations

import statistics
import warnings
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution

from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine.config import Pruning
from recipetune.engine.store import reference_trial

STRATEGIES = ("mcts", "tpe", "gp", "random", "grid")


def distributions(space: SearchSpace, baseline: Recipe) -> dict[str, BaseDistribution]:
    """Categorical distributions over each searched knob's listed values, plus the baseline's."""
    out: dict[str, BaseDistribution] = {}
    for name, values in space.values.items():
        choices = list(values)
        if baseline.get(name) is not None and not any(
            v == baseline[name] and isinstance(v, bool) == isinstance(baseline[name], bool) for v in choices
        ):
            choices.insert(0, baseline[name])
        out[name] = CategoricalDistribution(choices)
    return out


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler calls Study.stop() after the last grid point, which only works inside
    Study.optimize; under ask-and-tell the campaign checks ``is_exhausted`` itself."""

    def after_trial(self, study, trial, state, values) -> None:  # type: ignore[no-untyped-def]
        pass


class StableTPE(optuna.samplers.TPESampler):
    """Optuna's TPE, whose pick does not hang on the last bits of floating point. TPE keeps the
    candidate of highest acquisition (log l(x) - log g(x)); over categorical knobs several candidates
    often tie in exact arithmetic, and which one the argmax then keeps depends on rounding that
    differs between CPUs (numpy's vectorised log and sums): the same campaign on the same seed drew
    another recipe on another machine, and a few ulps of noise changed a replay's tree from its sixth
    trial (tests/test_engine_replay.py). Values within ``TIE`` (relative) of the best count as the
    best, so the first of them in the seeded draw wins on every machine."""

    TIE = 1e-9

    def _compute_acquisition_func(self, samples: dict[str, np.ndarray], mpe_below: Any, mpe_above: Any
                                  ) -> np.ndarray:
        acq = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        best = float(np.max(acq))
        if not np.isfinite(best):
            return acq
        return np.where(acq >= best - self.TIE * max(1.0, abs(best)), best, acq)


class _Wrapper(optuna.samplers.BaseSampler):
    """A sampler around another one: the trial's life cycle goes to the wrapped sampler as it is."""

    base: optuna.samplers.BaseSampler

    def before_trial(self, study: optuna.Study, trial: Any) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: Any, state: Any, values: Any) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


class FeasibleSampler(_Wrapper):
    """Draws the searched knobs jointly, each from the wrapped sampler's own choice for it, until
    the point keeps every relation; after ``tries`` draws the last one is repaired to the nearest
    feasible point (the fewest knobs moved). The study records what ran: always a feasible point."""

    def __init__(self, base: optuna.samplers.BaseSampler, dists: dict[str, BaseDistribution],
                 relations: Relations, baseline: Recipe, tries: int = 20):
        self.base, self.dists, self.relations, self.baseline, self.tries = base, dists, relations, baseline, tries

    def infer_relative_search_space(self, study: optuna.Study, trial: Any) -> dict[str, BaseDistribution]:
        return dict(self.dists)

    def sample_relative(self, study: optuna.Study, trial: Any, search_space: dict[str, BaseDistribution]
                        ) -> dict[str, Any]:
        if not search_space:
            return {}
        point: dict[str, Any] = {}
        for _ in range(self.tries):
            point = {n: self.base.sample_independent(study, trial, n, d) for n, d in search_space.items()}
            if self.relations.feasible(self.baseline.with_(**point)):
                return point
        space = {n: tuple(d.choices) for n, d in search_space.items()}  # type: ignore[attr-defined]
        fix = self.relations.repair(self.baseline.with_(**point), (), space)
        return {n: fix.recipe[n] for n in search_space}

    def sample_independent(self, study: optuna.Study, trial: Any, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)


def make_sampler(strategy: str, space: SearchSpace, baseline: Recipe, seed: int,
                 relations: Relations | None = None, parallel: int = 1,
                 order_seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The sampler of ``strategy``; ``seed`` should differ per session so a resume draws afresh.
    ``order_seed``: the campaign's own seed, the same in every session (default ``seed``). Optuna's
    GridSampler shuffles its points by its seed and the study keeps only each trial's grid id, so the
    order must not change on a resume: a session seeded afresh would read the ids of points already
    measured as other points, draw measured points again and count unmeasured ones as visited, and a
    killed and resumed grid campaign would decide otherwise than an uninterrupted one (benchmarks/kill_resume.py).
    With ``relations``, it draws only points that keep them. With trials in flight at once, TPE uses
    its constant liar: a running trial counts as a poor result, so the next draw looks elsewhere
    (Optuna's own batch mechanism)."""
    dists = distributions(space, baseline)
    sampler: optuna.samplers.BaseSampler
    if strategy == "tpe":
        sampler = StableTPE(seed=seed, n_startup_trials=min(5, max(2, space.size() // 4)),
                             constant_liar=parallel > 1)
    elif strategy == "gp":  # a Gaussian process over the categorical knobs (Optuna's GPSampler, torch)
        sampler = optuna.samplers.GPSampler(seed=seed)
    elif strategy == "grid":
        order = seed if order_seed is None else order_seed
        grid = AskTellGridSampler({n: list(d.choices) for n, d in dists.items()}, seed=order)  # type: ignore[attr-defined]
        if seed != order:  # the points in the campaign's order; which unvisited one comes next, afresh
            grid._rng.rng.seed(seed)
        if relations:  # the grid ids index the feasible points only
            names = grid._param_names
            grid._all_grids = [g for g in grid._all_grids
                               if relations.feasible(baseline.with_(**dict(zip(names, g, strict=True))))]
            grid._n_min_trials = len(grid._all_grids)
        return grid
    elif strategy in ("random", "mcts"):
        sampler = optuna.samplers.RandomSampler(seed=seed)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    if relations and strategy != "mcts":
        return FeasibleSampler(sampler, dists, relations, baseline)
    return sampler


class _StudyWithReference:
    """A study as a pruner reads it: its trials, and the baseline's curve as one more finished trial
    (Optuna's pruners read the finished trials through the public ``Study.get_trials``; everything
    else is the study's own)."""

    def __init__(self, study: optuna.Study, reference: optuna.trial.FrozenTrial):
        self._study, self._reference = study, reference

    def get_trials(self, deepcopy: bool = True, states: Any = None) -> list[optuna.trial.FrozenTrial]:
        trials = self._study.get_trials(deepcopy=deepcopy, states=states)
        finished = states is None or optuna.trial.TrialState.COMPLETE in states
        return [self._reference, *trials] if finished else trials

    @property
    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.get_trials()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


class WithReference(optuna.pruners.BasePruner):
    """Optuna's pruner, comparing a trial with the finished trials and the baseline's curve: the
    median and percentile pruners count it among the finished trials (their start-up count and
    their bar), as when it was a trial of the study. The curve is in the study's user attributes
    (engine/store.py: set_reference), not a trial, so no sampler reads it as one."""

    def __init__(self, base: optuna.pruners.BasePruner):
        self.base = base
        self._reference: optuna.trial.FrozenTrial | None = None

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if self._reference is None:
            self._reference = reference_trial(study)
        seen = study if self._reference is None else _StudyWithReference(study, self._reference)
        return self.base.prune(seen, trial)  # type: ignore[arg-type]


def make_pruner(p: Pruning) -> optuna.pruners.BasePruner:
    """The pruner ``search.pruning`` names (Optuna's own, shown the baseline's curve: ``WithReference``;
    ``none`` prunes nothing)."""
    if not p.on:
        return optuna.pruners.NopPruner()
    return WithReference(_pruner(p))


def _pruner(p: Pruning) -> optuna.pruners.BasePruner:
    median = optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=p.warmup_steps)
    if p.pruner == "median":
        return median
    if p.pruner == "percentile":
        return optuna.pruners.PercentilePruner(p.percentile, n_startup_trials=p.startup_trials,
                                               n_warmup_steps=p.warmup_steps)
    if p.pruner == "patient":
        with warnings.catch_warnings():  # experimental since Optuna 2.8, and what `patient` means
            warnings.simplefilter("ignore")
            return optuna.pruners.PatientPruner(median, patience=p.patience)
    if p.pruner == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=p.min_resource,
                                                      reduction_factor=p.reduction_factor)
    return optuna.pruners.HyperbandPruner(min_resource=p.min_resource, max_resource=p.checkpoints,
                                          reduction_factor=p.reduction_factor)


def pruning_bar(p: Pruning, values: list[float]) -> float | None:
    """What the pruner ``p`` keeps a trial above at a report, from the finished trials' reports at
    the same step (the baseline's among them): the bar a running trial's plausible value must fall
    below before it is stopped (engine/trials.py: Trials.prune). The median for ``median`` and
    ``patient``; for ``percentile``, the percentile Optuna's pruner keeps (``percentile: 25`` keeps
    the top quarter, so its bar is the 75th percentile, interpolated as numpy does); for
    ``successive_halving`` and ``hyperband``, the lowest value still among the top
    1/``reduction_factor`` (Optuna's promotion rule, here over the finished trials rather than a
    rung's or a bracket's own). None where no trial has finished there."""
    if not values:
        return None
    if p.pruner == "percentile":
        return float(np.percentile(values, 100.0 - p.percentile))
    if p.pruner in ("successive_halving", "hyperband"):
        ranked = sorted(values, reverse=True)
        return float(ranked[max(len(ranked) // p.reduction_factor - 1, 0)])
    return float(statistics.median(values))
