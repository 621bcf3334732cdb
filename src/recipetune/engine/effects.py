"""What the search learned of each knob value's effect on speed, and the one rule it sets settings aside by.

Every trial that measured its speed is evidence (``Evidence``): its ratio to the baseline, or, where it
ran out of time or memory, the most that ratio can be (censored: a timeout says "slower than the
timeout allows", an OOM "too big to run", never "no value"). ``Effects`` fits an additive model of the
log speed ratio over the searched knobs' values (the baseline's values the reference), Bayesian ridge
regression: each value's effect with its uncertainty, from every trial measured with it. A censored
trial enters at its bound, which only makes the model think it faster than it was.

The rule (``Effects.judge``): a recipe is set aside when even the optimistic end of its prediction
(``Z`` standard deviations above it) is below ``factor`` of the incumbent's speed (``search.set_aside``,
0.5 by default). The prediction's spread joins the effects' own uncertainty, the measurement noise the
job measured on its baseline, and an allowance for interactions the additive model cannot see: ``TAU``
per knob the recipe is away from the nearest measured one (raised where the measured trials themselves
show interactions), so a value measured slow next to one knob may still be tried next to another unless
it was far slower than the allowance. ``SetAside`` is the typed result: the recipe, its prediction, the
values that make it slow and the measurements that say so. The strategies (engine/strategy.py) and the
proposers (engine/researcher.py: fresh_recipe) ask ``judge`` before a candidate is run; what was set
aside runs only when nothing else is left (``release``).

The first measurement of a far slower value cannot be predicted; it can be cut short. ``stop`` is the
same bar on a running trial's own speed reports (speed/job.py: SpeedJob.windows, after the warm-up): a
trial whose report's optimistic end (two spreads, its own and the baseline's A/A) is already below
``factor`` of the incumbent's speed (the pessimistic end of its estimate) is stopped there, and what it
measured is its evidence.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from recipetune.core.recipe import Recipe, Scalar, SearchSpace
from recipetune.engine.record import Evidence
from recipetune.engine.status import Status
from recipetune.engine.tree import Node, Tree

Z = 2.0  # standard deviations: "predicted with high confidence" is its optimistic end below the bar
TAU = 0.5  # log-ratio allowance for unseen interactions, per knob away from the nearest measured recipe
PRIOR_SD = math.log(4.0)  # a value's effect before any measurement: within 16x either way (2 sd)
MIN_NOISE = 0.02  # a baseline's measured noise is never taken below 2%


@dataclass(frozen=True)
class Measurement:
    """A trial the rule read: its number, its change from the baseline, what it measured."""

    trial: int | None
    change: str
    evidence: Evidence

    def text(self) -> str:
        return f"trial {self.trial} ({self.change}): {self.evidence.text()}"


@dataclass(frozen=True)
class Effect:
    """One knob value's effect on the log speed ratio, against the baseline's value of that knob."""

    knob: str
    value: Scalar
    log_ratio: float
    sd: float
    trials: tuple[int, ...]  # the trials measured with it

    @property
    def ratio(self) -> float:
        return math.exp(self.log_ratio)


@dataclass(frozen=True)
class SetAside:
    """The rule's answer for a recipe it sets aside: predicted (mean) and at most (optimistic end)
    as ratios to the incumbent's speed, the bar (``factor``), the values that make it slow, and the
    measurements that say so."""

    recipe: Recipe
    change: str
    predicted: float
    upper: float
    factor: float
    incumbent: float  # the incumbent's speed over the baseline's, as the model estimates it
    values: dict[str, Scalar]
    measurements: tuple[Measurement, ...]

    def culprit(self) -> str:
        return ", ".join(f"{k}={json.dumps(v)}" for k, v in self.values.items())

    def line(self) -> str:
        """The log's words: what was set aside, why, on which measurements."""
        shown = "; ".join(m.text() for m in self.measurements[:4])
        more = f" and {len(self.measurements) - 4} more" if len(self.measurements) > 4 else ""
        return (f"set aside {self.change}: predicted {self.predicted:.2g}x the incumbent's speed "
                f"(at most {self.upper:.2g}x, below {self.factor:g}x), for {self.culprit() or 'its values'}; "
                f"measured: {shown}{more}")

    def record(self) -> dict[str, Any]:
        """What the campaign folder keeps of it (core/filenames.py: SET_ASIDE), and the report reads."""
        return {"recipe": dict(self.recipe), "recipe_id": self.recipe.id, "change": self.change,
                "predicted": self.predicted, "upper": self.upper, "factor": self.factor,
                "incumbent": self.incumbent, "values": self.values,
                "measurements": [{"trial": m.trial, "change": m.change, "ratio": m.evidence.ratio,
                                  "censored": m.evidence.censored} for m in self.measurements]}


@dataclass
class Pooled:
    """A set-aside recipe, kept to run where nothing else is left: where it would hang, and who asked."""

    aside: SetAside
    parent: Node
    edits: dict[str, Scalar]
    source: str
    announced: bool = False


def _key(value: Scalar) -> str:
    return json.dumps(value)  # True and 1 stay apart


@dataclass
class _Fit:
    columns: dict[tuple[str, str], int]
    beta: np.ndarray
    cov: np.ndarray
    rows: list[tuple[Node | None, Recipe, Evidence]]
    tau2: float
    incumbent: float | None = None


@dataclass
class Effects:
    """The model of knob values' effects, fitted to the tree's evidence, and the set-aside rule.

    ``noise``: the job's relative noise of a measured ratio (the baseline's A/A noise); ``factor``:
    the bar as a share of the incumbent's speed (0 turns the rule off)."""

    tree: Tree
    space: SearchSpace
    noise: float = 0.0
    factor: float = 0.5
    pool: dict[str, Pooled] = field(default_factory=dict)
    _fit: _Fit | None = None
    _fitted_at: int = -1
    # the incumbent's speed ``stop`` compares a running trial with: ``settle`` sets it on the loop's
    # thread, ``stop`` reads it on the thread that watches the run (it never walks the growing tree)
    settled: float = 1.0

    # the model -----------------------------------------------------------------------------------

    @property
    def sigma2(self) -> float:
        return math.log1p(max(self.noise, MIN_NOISE)) ** 2

    def knobs(self) -> list[str]:
        return list(self.space.values)

    def features(self, recipe: Recipe) -> list[tuple[str, str]]:
        base = self.tree.root.recipe
        return [(k, _key(recipe.get(k))) for k in self.knobs()
                if k in recipe and _key(recipe.get(k)) != _key(base.get(k))]

    def observations(self) -> list[tuple[Node | None, Recipe, Evidence]]:
        """The baseline (ratio 1) and every node with evidence of its speed."""
        out: list[tuple[Node | None, Recipe, Evidence]] = [(None, self.tree.root.recipe, Evidence(1.0))]
        for node in self.tree:
            if node.parent is not None and node.evidence is not None and node.evidence.ratio > 0:
                out.append((node, node.recipe, node.evidence))
        return out

    def fit(self) -> _Fit | None:
        """The fitted model, refitted when the tree has grown; None without any trial's evidence."""
        if self._fitted_at == len(self.tree):
            return self._fit
        self._fitted_at = len(self.tree)
        rows = self.observations()
        if len(rows) < 2:
            self._fit = None
            return None
        columns: dict[tuple[str, str], int] = {}
        for _, recipe, _ in rows:
            for f in self.features(recipe):
                columns.setdefault(f, len(columns))
        x = np.zeros((len(rows), len(columns)))
        for i, (_, recipe, _) in enumerate(rows):
            for f in self.features(recipe):
                x[i, columns[f]] = 1.0
        y = np.array([math.log(e.ratio) for _, _, e in rows])
        precision = x.T @ x / self.sigma2 + np.eye(len(columns)) / PRIOR_SD**2
        cov = np.linalg.inv(precision)
        beta = cov @ x.T @ y / self.sigma2
        self._fit = _Fit(columns, beta, cov, rows, self.interactions(x, y, cov, rows))
        return self._fit

    def interactions(self, x: np.ndarray, y: np.ndarray, cov: np.ndarray,
                     rows: list[tuple[Node | None, Recipe, Evidence]]) -> float:
        """The per-knob allowance for interactions: ``TAU``, raised where the measured trials
        themselves stray from the additive model beyond their noise (leave-one-out, over the
        trials another one's measurements also inform: leverage below 0.8)."""
        hat = np.einsum("ij,jk,ik->i", x, cov, x) / self.sigma2
        fitted = x @ cov @ x.T @ y / self.sigma2
        errors = []
        for i, (_, _, e) in enumerate(rows):
            if hat[i] >= 0.8:
                continue
            loo = (y[i] - fitted[i]) / (1.0 - hat[i])
            if e.censored and loo < 0:
                continue  # below its own bound's prediction: as a bound says
            errors.append(loo**2)
        excess = (sum(errors) / len(errors) - self.sigma2) if errors else 0.0
        return max(TAU**2, excess)

    def vector(self, recipe: Recipe, fit: _Fit) -> tuple[np.ndarray, int]:
        """``recipe``'s row of the model, and how many of its values were never measured."""
        x = np.zeros(len(fit.columns))
        unseen = 0
        for f in self.features(recipe):
            if f in fit.columns:
                x[fit.columns[f]] = 1.0
            else:
                unseen += 1  # a value never measured: its prior alone
        return x, unseen

    def predict(self, recipe: Recipe) -> tuple[float, float] | None:
        """The log speed ratio of ``recipe`` to the baseline: mean and standard deviation."""
        fit = self.fit()
        if fit is None:
            return None
        x, unseen = self.vector(recipe, fit)
        mean = float(x @ fit.beta)
        var = float(x @ fit.cov @ x) + unseen * PRIOR_SD**2 + self.sigma2 + fit.tau2 * self.distance(recipe, fit)
        return mean, math.sqrt(var)

    def distance(self, recipe: Recipe, fit: _Fit) -> int:
        """Searched knobs between ``recipe`` and the nearest recipe measured."""
        mine = dict(self.features(recipe))
        best = len(self.knobs())
        for _, other, _ in fit.rows:
            theirs = dict(self.features(other))
            best = min(best, sum(mine.get(k) != theirs.get(k) for k in self.knobs()))
        return best

    def effects(self) -> list[Effect]:
        """Every measured value's effect, the slowest first."""
        fit = self.fit()
        if fit is None:
            return []
        out = []
        for (knob, value), j in fit.columns.items():
            trials = tuple(n.trial for n, r, _ in fit.rows if n is not None and n.trial is not None
                           and (knob, value) in self.features(r))
            out.append(Effect(knob, json.loads(value), float(fit.beta[j]), math.sqrt(float(fit.cov[j, j])), trials))
        return sorted(out, key=lambda e: e.log_ratio)

    def incumbent(self) -> float:
        """The incumbent's log speed ratio to the baseline as the model estimates it (a single lucky
        measurement does not raise the bar); the baseline's 0 at least."""
        fit = self.fit()
        if fit is None:
            return 0.0
        if fit.incumbent is None:
            fit.incumbent = self.best_passed(fit, 0.0)
        return fit.incumbent

    def best_passed(self, fit: _Fit, below: float) -> float:
        """The best passed recipe's log speed ratio as ``fit`` estimates it, ``below`` standard
        deviations under each one's mean; the baseline's 0 at least."""
        ends = []
        for n in self.tree:
            if n.status == Status.PASSED and n.score is not None:
                x, _ = self.vector(n.recipe, fit)
                ends.append(float(x @ fit.beta) - below * math.sqrt(max(float(x @ fit.cov @ x), 0.0)))
        return max([0.0, *ends])

    # the rule ------------------------------------------------------------------------------------

    def judge(self, recipe: Recipe) -> SetAside | None:
        """The rule, the one place it is decided: ``recipe`` is set aside when the optimistic end of
        its predicted speed is below ``factor`` of the incumbent's. None: it may run."""
        if self.factor <= 0:
            return None
        predicted = self.predict(recipe)
        if predicted is None:
            return None
        mean, sd = predicted
        incumbent = self.incumbent()
        if mean + Z * sd >= incumbent + math.log(self.factor):
            return None
        fit = self.fit()
        assert fit is not None
        effects = {(e.knob, _key(e.value)): e for e in self.effects()}
        mine = [effects[f] for f in self.features(recipe) if f in effects and effects[f].log_ratio < 0]
        far = [e for e in mine if e.log_ratio + Z * e.sd < math.log(self.factor)]
        culprits = sorted(far or mine, key=lambda e: e.log_ratio)
        values = {e.knob: e.value for e in culprits}
        keys = {(e.knob, _key(e.value)) for e in culprits}
        base = self.tree.root.recipe
        measured = tuple(Measurement(n.trial, r.describe_diff(base), e) for n, r, e in fit.rows
                         if n is not None and keys & set(self.features(r)))
        return SetAside(recipe, recipe.describe_diff(base), math.exp(mean - incumbent),
                        math.exp(mean + Z * sd - incumbent), self.factor, math.exp(incumbent), values, measured)

    def settle(self) -> None:
        """The incumbent's speed as the tree now stands, for the next trial's ``stop`` (the loop calls
        it before each launch): the pessimistic end of its estimate (``Z`` standard deviations below),
        the baseline's at least. A running trial is stopped on its own reading alone, so the bar it
        is held to must not stand on one lucky draw of the incumbent's."""
        fit = self.fit()
        self.settled = 1.0 if fit is None else math.exp(self.best_passed(fit, Z))

    def stop(self, upper: float) -> str:
        """The rule on a running trial's own measurement: why to stop it, when ``upper`` (the most its
        speed over the baseline's can be, from its reports so far) is below ``factor`` of the
        incumbent's; "" to let it go on. Its reports are direct evidence of what ``judge`` predicts."""
        if self.factor <= 0 or upper >= self.factor * self.settled:
            return ""
        return (f"set aside as it ran: at most {upper:.2g}x the baseline's speed, below {self.factor:g} of the "
                f"incumbent's {self.settled:.2g}x")

    def hold(self, aside: SetAside, parent: Node, edits: dict[str, Scalar], source: str) -> None:
        """Keep a set-aside recipe for when nothing else is left (once per recipe)."""
        self.pool.setdefault(aside.recipe.id, Pooled(aside, parent, edits, source))

    def fresh(self) -> list[Pooled]:
        """The set-aside recipes not yet announced (the loop says each once: log, live view, folder)."""
        out = [p for p in self.pool.values() if not p.announced]
        for p in out:
            p.announced = True
        return out

    def release(self, taken: Any) -> Pooled | None:
        """Nothing else is left: the set-aside recipe predicted fastest now, or None. ``taken``: what
        may not be proposed again (tried, running, claimed)."""
        left = [p for p in self.pool.values() if not taken(p.aside.recipe)]
        if not left:
            return None
        ranked = sorted(left, key=lambda p: -(self.predict(p.aside.recipe) or (0.0, 0.0))[0])
        chosen = ranked[0]
        del self.pool[chosen.aside.recipe.id]
        return chosen
