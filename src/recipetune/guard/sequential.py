"""The parity test's group-sequential design: how much evidence, when to look, when to stop.

docs/guard.md ("A planned design") states the maths; ``SeedDesign`` below plans and judges the seeds mode
look by look on the ``Design`` both jobs share (core/sequential.py: alpha spending, the plan, predictive
power, seeds needed, with their sources), no runs, no files."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from recipetune.core.sequential import NEVER, Design, predictive_power, seeds_needed
from recipetune.core.stats import Equivalence, equivalence, paired, quantile
from recipetune.core.words import EquivalenceOutcome, LookOutcome, ParityOutcome

# ---------------------------------------------------------------------------- the seeds design


@dataclass(frozen=True)
class Pairs:
    """One loss measure at a look: its paired differences (candidate - baseline, per seed), their
    within-run errors (None: the measure has none), its tolerance T, and what the profile predicts
    for one pair's standard deviation if the batches differ (and on how many degrees of freedom)."""

    diffs: Sequence[float]
    ses: Sequence[float] | None
    tolerance: float
    prior: tuple[float, int] | None = None


@dataclass
class SeedLook:
    """What the design says at one look."""

    level: float  # the look's nominal one-sided level
    outcome: ParityOutcome | LookOutcome  # holds | fails | continue | futility | plan | budget
    pairs: int  # seeds compared at this look
    planned: int  # seeds the plan now counts on (at most the budget's)
    needed: int  # seeds the measures need at their scatter, whatever the budget
    next: int  # seeds of the next look ("continue")
    chance: float | None = None  # predictive power of showing equivalence within the plan
    rejecting: bool = False  # equivalence is out of reach, a difference beyond T is not: the plan shows that
    pilot: int = 0  # pairs left out of the scatter this look judges by (stats.paired)
    tests: list[Equivalence] = field(default_factory=list)


class SeedDesign(Design):
    """The seeds mode of the parity test (guard/looks.py), look by look, as a state machine: the
    caller runs the seeds a look asks for and feeds each measure's pairs; the design says the look's
    level, whether the test is decided, and how many seeds the next look compares.

    - the first look compares the profile's seeds at a level fixed in advance (``Spending.first``);
    - its pairs plan the rest: the seeds each measure needs to show equivalence at ``power`` at their
      scatter, pooled with the profile's prediction where the batches may differ (three pairs alone
      plan wildly), at most ``cap`` (the budget's); a look at half the plan (when that leaves the
      half a few degrees of freedom) may raise the plan, never lower it;
    - the later looks test at the levels of ``Spending``, each with the mean of every pair and the
      scatter of the pairs after the first look (``stats.paired``'s pilot: judged by the scatter that
      chose the plan, a verdict would favour plans drawn after a small scatter by chance; simulated,
      a design that did so approved a difference of exactly T in 6-7% of 3,000 repetitions at
      alpha 5%, this one in 4%: tests/test_guard_sequential.py), every measure must hold;
    - futility: the predictive power that the planned last look shows equivalence, below ``futility``;
    - where equivalence is out of reach (futility, or a budget too small for it) but a measure's
      difference lies beyond T by more than its scatter hides, the plan becomes the seeds that show
      that difference more likely than not, if at most twice the seeds compared (and within the
      budget): one last look, REJECTED if it shows it. A poison just beyond T is not chased (it would take the
      whole budget): it stays stopped, KEEP BASELINE.
    """

    def __init__(self, alpha: float, power: float, futility: float, kind: str = "obf", first: float = 0.2,
                 two_sided: bool = True, independent: bool = True):
        super().__init__(alpha, power, futility, kind, first)  # (needed: the seeds the measures need at their scatter)
        self.two_sided, self.independent = two_sided, independent
        self.looks = 0
        self.pilot = 0  # pairs of the first look
        self.rejecting = False  # the plan was redrawn to show a difference beyond T
        self.pool = False  # this look pools the pairs' scatter with the profile's prediction (the first, if asked)

    def sd(self, x: Pairs, pooled: bool) -> float:
        """One pair's standard deviation as the plan sees it: the pairs' own (their mean's error times
        sqrt(n), so within-run noise counts where it is the larger), pooled with the prediction."""
        est = paired(x.diffs, x.ses, self.independent)
        sd = est.se * math.sqrt(est.n) if math.isfinite(est.se) else math.inf
        if pooled and x.prior is not None and math.isfinite(sd):
            prior, df = x.prior
            sd = math.sqrt(((est.n - 1) * sd**2 + df * prior**2) / (est.n - 1 + df))
        return sd

    @property
    def sizing(self) -> float:
        """The level the plan is sized at: all of alpha until the first look is recorded (the plan the first look
        draws, and the one said before the candidate runs, are those of a single test at alpha), then what the
        looks after the first may spend (``Spending.later``)."""
        return self.spending.later if self.spending.increments else self.spending.alpha

    def decide(self, measures: Sequence[Pairs], cap: int, pooled: bool) -> SeedLook:
        self.looks += 1
        n = len(measures[0].diffs)
        rest = self.sizing
        if self.looks == 1:
            self.pilot = n
        # The plan and every chance below judge by one scatter: pooled at the first look only where the
        # caller says the batches may differ. (Pooled regardless, a plan drawn from replayed batches' pairs
        # would be judged at the other batches' larger scatter, and an equivalent candidate that a few more
        # seeds approve stopped for futility.)
        self.pool = pooled and self.looks == 1
        if self.looks <= 2 and not self.rejecting:  # the plan: made at the first look, raised at the second
            sds = [self.sd(x, self.pool) for x in measures]
            start = max(n, self.pilot + 1)
            needs = [seeds_needed(sd, x.tolerance, rest, self.power, start, NEVER, self.two_sided, self.pilot)
                     if math.isfinite(sd) else NEVER for x, sd in zip(measures, sds, strict=True)]
            self.replan(max(needs) if self.looks == 1 else max(self.needed, *needs), cap)
        level, final = self.level(n, cap)
        # A look after the first judges by the scatter of the pairs after it, save the look a rejection
        # was planned for: its pairs' mean lies beyond T whatever their scatter, so every pair counts.
        pilot = self.pilot if self.looks > 1 and not self.rejecting else 0
        tests = [equivalence(x.diffs, x.ses, x.tolerance, level, self.independent, self.two_sided, pilot)
                 for x in measures]
        outcomes = {t.outcome for t in tests}
        decision = SeedLook(level, LookOutcome.CONTINUE, n, self.planned, self.needed, self.planned, tests=tests,
                            pilot=pilot)
        if EquivalenceOutcome.DIFFERENT in outcomes:
            decision.outcome = ParityOutcome.FAILS
        elif outcomes == {EquivalenceOutcome.EQUIVALENT}:
            decision.outcome = ParityOutcome.HOLDS
        elif final:
            decision.outcome = LookOutcome.BUDGET if self.needed > n else LookOutcome.PLAN
        elif self.needed > self.planned and min(self._power(x) for x in measures) < 0.5:
            # the budget's seeds would show even an exact equivalent less often than not
            decision.outcome = LookOutcome.BUDGET
        else:
            decision.chance = min(self._chance(x, n) for x in measures)
            if decision.chance < self.futility:
                decision.outcome = LookOutcome.FUTILITY
            else:
                half = math.ceil(self.planned / 2)
                decision.next = half if self.looks == 1 and half - self.pilot - 1 >= 3 else self.planned
        if decision.outcome in (LookOutcome.BUDGET, LookOutcome.FUTILITY) and not final:  # (the last: all spent)
            self._chase(decision, measures, n, cap)
        return decision

    def _chase(self, decision: SeedLook, measures: Sequence[Pairs], n: int, cap: int) -> None:
        """Equivalence is out of reach; a difference beyond T may not be: a poison at 4 T whose first three pairs
        scatter widely is shown REJECTED by a few more, not kept as "not shown". Where a measure's difference
        is in reach (``_to_reject``), the plan becomes the seeds that show it and the looks go on."""
        reach = [m for x in measures if (m := self._to_reject(x, n, cap)) is not None]
        if reach:
            self.rejecting = True
            self.planned = decision.planned = decision.next = min(reach)
            decision.outcome, decision.rejecting = LookOutcome.CONTINUE, True

    def _to_reject(self, x: Pairs, n: int, cap: int) -> int | None:
        """The fewest seeds (more than ``n``, at most ``2 n`` and ``cap``) whose one-sided bound shows this
        measure's difference beyond T more likely than not, if its mean so far lies beyond T; None if
        none do."""
        est = paired(x.diffs, x.ses, self.independent)
        gap = (abs(est.mean) if self.two_sided else est.mean) - x.tolerance
        sd = self.sd(x, self.pool)
        if gap <= 0.0 or not math.isfinite(sd):
            return None
        # More likely than not (the median of the final mean beyond its critical value): the chase costs
        # at most as many seeds again, and a rejection says more than a KEEP (the knob breaks training).
        for m in range(n + 1, min(cap, 2 * n) + 1):
            df = m - 1 if est.df is not None else None
            if quantile(self.spending.later, df) * sd / math.sqrt(m) <= gap:
                return m
        return None

    def _band(self, margin: float) -> tuple[float, float]:
        """Where the last look's mean shows equivalence: within +-``margin`` (below it, one-sided), ``margin``
        being T less the last look's critical value times its error; none where that is not positive (the
        last look cannot resolve T, whatever its mean)."""
        if margin <= 0.0:
            return 0.0, 0.0
        return -margin if self.two_sided else -math.inf, margin

    def _power(self, x: Pairs) -> float:
        """The chance that the planned seeds show equivalence if the candidate trained exactly like the
        baseline: what a plan the budget cut short still buys."""
        sd = self.sd(x, self.pool)
        if not math.isfinite(sd):
            return 0.0
        se = sd / math.sqrt(self.planned)
        df = self.planned - self.pilot - 1 if paired(x.diffs, x.ses, self.independent).df is not None else None
        return predictive_power(0.0, se, *self._band(x.tolerance - quantile(self.spending.later, df) * se))

    def _chance(self, x: Pairs, n: int) -> float:
        """Predictive power of one measure (``Design.chance``): its mean difference at the planned seeds, given
        the ``n`` so far, inside the band the last look needs."""
        sd = self.sd(x, self.pool)
        if not math.isfinite(sd):
            return 0.0
        est = paired(x.diffs, x.ses, self.independent)
        df = self.planned - self.pilot - 1 if est.df is not None else None
        return self.chance(est.mean, sd, n, *self._band(x.tolerance - self.critical(sd, df)))
