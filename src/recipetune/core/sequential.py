"""Group-sequential machinery shared by both jobs: how much evidence, when to look, when to stop.

The speed guard's parity test (guard/sequential.py: SeedDesign, docs/guard.md "A planned design")
and the quality job's test-split decision (``GainDesign`` below, docs/finetune.md "The decision")
plan, look and stop with these pieces; this module only computes (numpy + scipy, no runs, no files).
The ingredients, all standard in clinical-trial statistics (Jennison & Turnbull, "Group Sequential
Methods", 2000), written here because no maintained Python package offers them:

- **alpha spending** (Lan & DeMets 1983): a look at information fraction t (the evidence so far
  over the evidence the plan needs) may have spent at most alpha(t) of the test's level in all;
  O'Brien-Fleming-like spending keeps the early looks strict and the last one close to a
  fixed-sample test, Pocock-like spends evenly;
- **boundaries**: the critical value of each look given the ones before, from the joint law of the
  statistics at successive looks (a Brownian motion observed at the fractions), by the recursive
  numerical integration of Armitage, McPherson & Rowe (1969);
- **sample size**: the seeds a one- or two-sided test needs at the stated power, Student's t included;
- **predictive power** (Spiegelhalter, Freedman & Blackburn 1986): the chance, given the evidence
  so far, that the planned final look decides as hoped; below the futility level a test stops.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import brentq

from recipetune.core.stats import norm_cdf, norm_isf, norm_pdf, norm_sf, quantile
from recipetune.core.words import LookOutcome

SPENDING = ("obf", "pocock")
# "Seeds needed" where no number of seeds is likely to show it, and the most any search for a number of seeds
# goes to: both designs' plans, the guard's plan before the candidate runs.
NEVER = 100_000
_GRID = 161  # points of the integration grid below a boundary: 1e-4 accuracy on the boundaries


def spent(kind: str, t: float, alpha: float) -> float:
    """Cumulative one-sided level spent by information fraction ``t`` (0..1)."""
    t = min(max(t, 0.0), 1.0)
    if t == 0.0:
        return 0.0
    if kind == "obf":  # Lan-DeMets O'Brien-Fleming: 2 (1 - Phi(z_{1 - alpha/2} / sqrt(t)))
        return float(2.0 * norm_sf(norm_isf(alpha / 2.0) / math.sqrt(t)))
    if kind == "pocock":  # Lan-DeMets Pocock: alpha ln(1 + (e - 1) t)
        return float(alpha * math.log1p((math.e - 1.0) * t))
    raise ValueError(f"unknown spending function {kind!r}; one of {SPENDING}")


def boundaries(fractions: Sequence[float], increments: Sequence[float]) -> list[float]:
    """Critical values c_1..c_k (standard normal scale) of a one-sided test looked at at the increasing
    information ``fractions``, such that under the null the chance to cross first at look j is
    ``increments[j]``. The statistic at fraction t is W(t) / sqrt(t) for a Brownian motion W; the
    density of the paths still below every boundary is carried on a grid from look to look."""
    cs: list[float] = []
    u = g = np.empty(0)
    prev = 0.0
    for t, a in zip(fractions, increments, strict=True):
        if t <= prev:
            raise ValueError(f"information fractions must increase: {list(fractions)}")
        if not cs:
            c = float(norm_isf(a)) if a > 0 else math.inf
            top = c if math.isfinite(c) else 8.0
            u = np.linspace(-10.0, top, _GRID)
            g = norm_pdf(u)
        else:
            r, s = math.sqrt(prev / (t - prev)), math.sqrt(t / (t - prev))

            def cross(c: float, u: np.ndarray = u, g: np.ndarray = g, r: float = r, s: float = s) -> float:
                return float(np.trapezoid(g * norm_sf(c * s - u * r), u))

            c = _solve(cross, a)
            top = c if math.isfinite(c) else 8.0
            new = np.linspace(-10.0, top, _GRID)
            kernel = s * norm_pdf(new[:, None] * s - u[None, :] * r)
            u, g = new, np.trapezoid(kernel * g[None, :], u, axis=1)
        cs.append(c)
        prev = t
    return cs


@functools.lru_cache(maxsize=4096)
def _boundaries(fractions: tuple[float, ...], increments: tuple[float, ...]) -> tuple[float, ...]:
    """``boundaries``, kept: a design's looks are at whole seeds, so the same few come back (simulations)."""
    return tuple(boundaries(fractions, increments))


def _solve(cross: Callable[[float], float], a: float) -> float:
    """The critical value whose chance to be crossed first is ``a`` (inf: nothing to spend)."""
    if a <= 0:
        return math.inf
    return float(brentq(lambda c: cross(c) - a, -8.0, 40.0)) if cross(-8.0) > a else -8.0


@dataclass
class Spending:
    """The level a sequence of looks has spent. The first look spends ``first`` of alpha whatever
    the evidence turns out to be (it is fixed before any candidate runs: a level that depended on the
    first look's own scatter would favour the looks whose scatter was small by chance); the later
    looks spend the rest by ``kind`` over their fraction of the planned evidence; a final look spends
    all that is left. The statistics of two looks are correlated as sqrt(n_i / n_j), n the pairs
    each compares: that, not the fractions of a plan that may have grown since, shapes the boundaries."""

    alpha: float
    kind: str = "obf"
    first: float = 0.2
    sizes: list[float] = field(default_factory=list)  # the evidence of each look (pairs compared)
    increments: list[float] = field(default_factory=list)

    def look(self, size: float, fraction: float, final: bool) -> float:
        """Record a look comparing ``size`` pairs, ``fraction`` of the planned evidence; the nominal
        one-sided level it may test at."""
        if self.sizes and size <= self.sizes[-1]:
            raise ValueError(f"a look must add evidence: {size} after {self.sizes[-1]}")
        if final:
            cum = self.alpha
        elif not self.increments:
            cum = self.alpha * self.first
        else:
            cum = self.alpha * self.first + spent(self.kind, min(fraction, 1.0), self.later)
        self.increments.append(max(cum - sum(self.increments), 0.0))
        self.sizes.append(size)
        c = _boundaries(tuple(n / size for n in self.sizes), tuple(self.increments))[-1]
        return float(norm_sf(c)) if math.isfinite(c) else 0.0

    @property
    def later(self) -> float:
        """What the looks after the first may spend in all: alpha less the first look's share. The last look's
        critical value is computed at it (a plan is sized for the last look)."""
        return self.alpha * (1.0 - self.first)


@dataclass(frozen=True)
class SeparateLooks:
    """The level of looks that are separate runs, not a growing sample (the steps design: each longer look
    trains a new pair, so no look's statistic holds another's evidence and ``Spending``'s boundaries do not
    apply): Bonferroni. The first look spends ``first`` of alpha, fixed before any candidate runs; each of at
    most ``later`` looks after it an equal share of the rest; whatever the looks show, the chance that any of
    them errs is at most alpha."""

    alpha: float
    first: float
    later: int = 2

    @property
    def at_first(self) -> float:
        """The first look's one-sided level."""
        return self.alpha * self.first

    @property
    def at_later(self) -> float:
        """Each later look's one-sided level: the rest of alpha over the later looks."""
        return self.alpha * (1.0 - self.first) / self.later

    @property
    def looks(self) -> int:
        """The most looks the split allows: the first and the later ones."""
        return 1 + self.later


def seeds_needed(sigma: float, tolerance: float, level: float, power: float, start: int, cap: int,
                 two_sided: bool = True, pilot: int = 0) -> int:
    """The fewest pairs n (at least ``start``, at most ``cap``) whose mean difference, with per-pair
    standard deviation ``sigma``, shows equivalence within +-T at ``power`` when the true difference
    is 0: ``(t_(level, df) + z_power') sigma / sqrt(n) <= T``, where both one-sided tests must pass,
    so each is given half the shortfall (z at (1 + power) / 2); one-sided: z at ``power``. The error
    is estimated on df = n - pilot - 1 (stats.paired)."""
    z = float(norm_isf((1.0 - power) / 2.0 if two_sided else 1.0 - power))
    # Student's t is above the normal quantile: no n below the known-sigma answer can do (a tiny T asks for
    # tens of thousands, each a quantile to compute)
    known = 0.0 if sigma == 0 else ((quantile(level, None) + z) * sigma / tolerance) ** 2 if tolerance > 0 else math.inf
    first = max(start, pilot + 2, 2, min(math.floor(known), cap) if math.isfinite(known) else cap)
    for n in range(first, cap + 1):
        if (quantile(level, n - pilot - 1) + z) * sigma / math.sqrt(n) <= tolerance:
            return n
    return cap


def factor_needed(se: float, tolerance: float, level: float, power: float, two_sided: bool = True) -> float:
    """For a trainer whose repeats are identical (one pair per look, its within-run error z-based):
    by how much the compared tail must grow for its error to resolve T at ``power``; the error
    shrinks as 1 / sqrt(tokens)."""
    z = float(norm_isf((1.0 - power) / 2.0 if two_sided else 1.0 - power))
    target = tolerance / (quantile(level, None) + z)
    return max(1.0, (se / target) ** 2) if target > 0 and math.isfinite(se) else math.inf


def predictive_power(mean: float, spread: float, low: float = -math.inf, high: float = math.inf) -> float:
    """The chance that the final look's mean lies in (``low``, ``high``), the band in which it decides (the
    parity test's: within T less the last look's critical value times its error; the quality job's: above
    the threshold plus it), when it is normal around ``mean`` with standard deviation ``spread``: given what
    is known now (flat prior), sqrt(se_now^2 - se_final^2) where the final look adds to these pairs
    (``Design.chance``). 0 for an empty band."""
    if high <= low:
        return 0.0
    spread = max(spread, 1e-12)
    if high == math.inf:
        return float(norm_sf((low - mean) / spread))
    below = float(norm_cdf((high - mean) / spread))
    return below - float(norm_cdf((low - mean) / spread)) if low > -math.inf else below


class Design:
    """What a group-sequential design of either job looks with: the parity test over seeds (guard/sequential.py:
    ``SeedDesign``) and the quality job's gain (``GainDesign`` below). Each says its own outcomes; these are
    the pieces they share:

    - ``Spending``: the level of each look, the first a share of alpha fixed in advance, the later ones the
      rest by O'Brien-Fleming or Pocock over the fraction of the plan, the last all that is left;
    - the plan: the seeds the last look is at, drawn at the first look and raised (never lowered) at the
      second, at most the budget's (``replan``); a look at the plan or the budget is the last (``level``);
    - futility: the predictive power that the planned last look decides (``chance``), below ``futility``."""

    def __init__(self, alpha: float, power: float, futility: float, kind: str, first: float):
        self.spending = Spending(alpha, kind, first)
        self.power, self.futility = power, futility
        self.planned = 0  # seeds the plan counts on (at most the budget's)
        self.needed = 0  # seeds the evidence so far needs, whatever the budget (NEVER: none would do)

    def replan(self, needed: int, cap: int) -> None:
        """A look that draws the plan: ``needed`` seeds, the plan raised to them (never lowered), at most ``cap``."""
        self.needed = needed
        self.planned = min(cap, max(self.planned, needed))

    def level(self, n: int, cap: int) -> tuple[float, bool]:
        """Record a look at ``n`` seeds: its nominal one-sided level, and whether it is the last (at the plan or
        at ``cap``), which spends all that is left."""
        final = n >= cap or n >= self.planned
        return self.spending.look(n, n / max(self.planned, n), final), final

    def critical(self, sd: float, df: int | None) -> float:
        """What the planned last look's mean must clear by: its critical value (at ``Spending.later``, on ``df``
        degrees of freedom) times its error, one pair's ``sd`` over sqrt(planned)."""
        return quantile(self.spending.later, df) * sd / math.sqrt(self.planned)

    def chance(self, mean: float, sd: float, n: int, low: float = -math.inf, high: float = math.inf) -> float:
        """Predictive power (flat prior): the planned last look's mean is normal around ``mean``, the mean of the
        ``n`` seeds so far, with variance sd^2 (1/n - 1/planned), ``sd`` one pair's; the chance it lands in
        (``low``, ``high``)."""
        return predictive_power(mean, sd * math.sqrt(max(1.0 / n - 1.0 / self.planned, 0.0)), low, high)


# ---------------------------------------------------------------------------- a gain over a threshold


@dataclass
class GainLook:
    """What ``GainDesign`` says at one look: the paired gain so far, its one-sided bound at the
    look's level, and the outcome."""

    look: int  # 1, 2, ...
    n: int  # seeds (pairs) compared
    level: float  # the look's nominal one-sided level
    mean: float  # mean paired gain (candidate - baseline)
    se: float  # its standard error (the pairs' scatter / sqrt(n))
    low: float  # mean - t(level, n - 1) se: the gain is shown above the threshold when this is
    high: float  # mean + t(level, n - 1) se (the interval's other end, for the record)
    outcome: LookOutcome  # shown | continue | futility | budget | plan
    planned: int  # seeds the plan counts on now (at most the cap)
    needed: int  # seeds that would show the gain seen so far at ``power``, whatever the cap
    next: int  # seeds of the next look ("continue")
    chance: float | None = None  # predictive power that the planned seeds show the gain


class GainDesign(Design):
    """A one-sided group-sequential test that a paired gain lies above ``threshold`` (the quality
    job's decision: the best node against the baseline on the test split, over seeds;
    docs/finetune.md, "The decision"). The caller trains the seeds a look asks for and feeds the
    paired gains; the design says the look's level and outcome and the seeds of the next look.

    - the first look compares the first seeds at a level fixed in advance (``first`` x alpha);
    - its gain and scatter plan the rest: the fewest seeds whose bound would clear the threshold at
      ``power`` if the gain seen is the true one, at most ``cap``; a look halfway there (when that
      adds at least two seeds) may raise the plan, never lower it; the last look is at the plan;
    - the looks after the first test at the levels of ``Spending`` (the rest of alpha, O'Brien-Fleming
      or Pocock over the fraction of the plan), the last one spending all that is left;
    - futility: at a look that does not decide, the predictive power that the planned last look shows
      the gain; below ``futility`` the test stops (``budget`` where the gain seen would need more seeds
      than ``cap``, ``futility`` otherwise). Futility never approves.
    The plan is drawn from the first look's gain, which tilts the later levels: a true gain at the
    threshold is approved in 3-4% of simulated decisions at alpha 2.5% one-sided, at most 5% being the
    bound kept (tests/test_finetune_decision.py, docs/finetune.md "The decision")."""

    def __init__(self, alpha: float, power: float, futility: float, threshold: float, cap: int,
                 kind: str = "obf", first: float = 0.5):
        super().__init__(alpha, power, futility, kind, first)
        self.threshold, self.cap = threshold, cap
        self.looks: list[GainLook] = []

    def decide(self, gains: Sequence[float]) -> GainLook:
        n = len(gains)
        d = np.asarray(gains, dtype=float)
        mean = float(d.mean())
        sd = float(np.std(d, ddof=1)) if n > 1 else math.inf
        sd = 0.0 if sd <= 1e-9 * max(1.0, abs(mean)) else sd  # equal gains (float noise aside)
        first = not self.looks
        if len(self.looks) < 2:  # the plan: drawn at the first look, raised (never lowered) at the second
            self.replan(self._needed(mean, sd, n + 1 if first else n), self.cap)
        level, final = self.level(n, self.cap)  # (the first look plans a seed more than it has: never the last)
        # Seeds whose gains are all equal show no scatter, not no noise (a metric on a few hundred rows moves
        # in steps): such a look shows nothing, and the next adds a seed.
        q = quantile(level, n - 1) * sd / math.sqrt(n) if math.isfinite(sd) and sd > 0 else math.inf
        look = GainLook(len(self.looks) + 1, n, level, mean, sd / math.sqrt(n), mean - q, mean + q,
                        LookOutcome.CONTINUE, self.planned, self.needed, self.planned)
        self.looks.append(look)
        if look.low > self.threshold:
            look.outcome = LookOutcome.SHOWN
        elif final:
            look.outcome = LookOutcome.BUDGET if n < self.needed < NEVER else LookOutcome.PLAN
        else:
            look.chance = self._chance(mean, sd, n)
            if look.chance < self.futility:
                look.outcome = LookOutcome.BUDGET if self.cap < self.needed < NEVER else LookOutcome.FUTILITY
            elif first and self.planned - n >= 4:  # a look halfway, where the plan is long
                look.next = n + math.ceil((self.planned - n) / 2)
        return look

    def resolves(self, sd: float, n: int) -> float:
        """The gain ``n`` seeds show at ``power`` (at the last look's level) when a pair's gain scatters at
        ``sd``: what a plan of n seeds is sized to show."""
        return (quantile(self.spending.later, n - 1) + float(norm_isf(1.0 - self.power))) * sd / math.sqrt(n)

    def _needed(self, mean: float, sd: float, start: int) -> int:
        """Seeds whose bound clears the threshold at ``power`` if ``mean`` is the true gain."""
        gap = mean - self.threshold
        if gap <= 0.0 or not math.isfinite(sd):
            return NEVER
        return seeds_needed(sd, gap, self.spending.later, self.power, start, NEVER, two_sided=False)

    def _chance(self, mean: float, sd: float, n: int) -> float:
        """Predictive power (``Design.chance``): the final mean at the planned seeds must land above the
        threshold plus the last look's critical value times its error."""
        if sd == 0.0:  # (equal gains: the plan is one more seed; no gain seen, none to expect)
            return 1.0 if mean > self.threshold else 0.0
        return self.chance(mean, sd, n, low=self.threshold + self.critical(sd, self.planned - 1))

    def run(self, draw: Callable[[int], Sequence[float] | None], first: int,
            seen: Callable[[GainLook], None] = lambda look: None) -> GainLook | None:
        """Look until decided: ``draw(n)`` returns the paired gains of the first n seeds (training those
        not yet trained), or None where the caller stops the looks (its time budget); ``seen`` is told
        each look. The last look, None if there was none."""
        n = first
        while (gains := draw(n)) is not None:
            look = self.decide(gains)
            seen(look)
            if look.outcome != LookOutcome.CONTINUE:
                return look
            n = look.next
        return self.looks[-1] if self.looks else None
