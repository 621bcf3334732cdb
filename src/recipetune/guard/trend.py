"""The trend is part of parity: is the gap between the two recipes growing over the compared window?

The parity test compares M, a mean over the last share of the tokens: a candidate equal at first and
then drifting away (error that accumulates in low precision, a loss scale that drifts, a schedule that
bites late) can have that mean within T while its gap grows. The same runs, read along the window,
give the gap as a function of training: per pair of runs its least-squares slope, with an error from
the residuals' own noise and autocorrelation (as the within-run error of M, guard/loss.py), pooled
over the pairs as M's difference is (core/stats.py: ``paired``). A gap shown (at
``parity.trend_alpha``, two-sided) to grow away from zero, by more than ``parity.trend_margin`` x T per
horizon (the steps compared) at its estimate, is not approved; a gap that shrinks toward zero (an
effect that fades) is the fade rule's business, not this one's. docs/guard.md, "What a verdict proves".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from recipetune.core import stats
from recipetune.core.measure import RunResult
from recipetune.core.words import TrendOutcome
from recipetune.guard.evidence import Trend
from recipetune.guard.loss import MIN_TAIL, aligned, tail, tokens


class Slope(NamedTuple):
    """The gap's slope over one pair's window: per step, its standard error, the window's first and last step."""

    slope: float
    se: float
    first: int
    last: int


def pair_slope(base: RunResult, cand: RunResult, total: float, share: float) -> Slope | None:
    """The slope of the candidate's loss minus the baseline's over the tail M averages (``stats.line_fit``:
    its error from the residuals' noise and autocorrelation); None when too few records. Step by step where
    both runs logged the same steps (guard/loss.py: ``aligned``; batch difficulty cancels when the batches
    were replayed); otherwise each run's own slope against its tokens, in the baseline's steps, the errors
    in quadrature."""
    bt, ct = tail(base, total, share), tail(cand, total, share)
    if min(len(bt), len(ct)) < MIN_TAIL:
        return None
    both = aligned(bt, ct)
    if both is not None:
        fit = stats.line_fit(both.steps, both.cand - both.base)
        return Slope(fit.slope, fit.se, both.steps[0], both.steps[-1])
    per_step = total / max(1, len(base.steps))  # the baseline's tokens per step
    fits = []
    for run, records in ((base, bt), (cand, ct)):
        at = dict(zip((s.step for s in run.steps), tokens(run), strict=True))
        fits.append(stats.line_fit([at[s.step] / per_step for s in records], [s.loss for s in records]))
    fb, fc = fits
    return Slope(fc.slope - fb.slope, math.hypot(fb.se, fc.se), bt[0].step, bt[-1].step)


def judge_trend(slopes: Sequence[Slope], *, independent: bool, replayed: bool, two_sided: bool, tolerance: float,
                mean_diff: float, steps: int, tokens: int, alpha: float, margin: float) -> Trend | None:
    """The trend test over the pairs' ``slopes``: the gap's mean slope and its bounds at ``alpha`` (two-sided).
    The gap grows when the bounds exclude zero (significant), the slope moves it away from zero (away from
    ``mean_diff``'s side of it; for an allowed semantic change, ``two_sided`` False: toward a worse loss), and
    it amounts to more than ``margin`` x ``tolerance`` (T) per horizon (``steps`` compared, ``tokens``) at
    its estimate (relevant: a slope that replayed batches resolve beyond doubt but that would take many
    horizons to reach T is left to ``watch``). ``independent``: the pairs are independent repeats;
    ``replayed``: they replayed the baseline's batches. None where a pair's slope has no error."""
    if not slopes or any(not math.isfinite(s.se) for s in slopes):
        return None
    # Replayed batches: each pair's difference series is what the change alone does, and its slope's error is
    # its own within-run error; the pairs' scatter then measures how the effect differs between seeds (no
    # effect, no scatter), and judged by it on n - 1 degrees of freedom (t = 9.9 at 3 seeds and 0.5%) the test
    # could not see a drift the replayed pairs each show. Elsewhere, as for M: the larger of the two.
    p = stats.paired([s.slope for s in slopes], [s.se for s in slopes], independent and not replayed)
    q = stats.quantile(alpha / 2, p.df)
    low, high = p.mean - q * p.se, p.mean + q * p.se
    first, last = min(s.first for s in slopes), max(s.last for s in slopes)
    shown = low > 0 or high < 0
    away = p.mean * mean_diff > 0 if two_sided else p.mean > 0
    grows = shown and away and abs(p.mean) * steps > margin * tolerance
    per_k = 1000.0
    trend = Trend(steps=steps, tokens=tokens, first_step=first, last_step=last, slope=per_k * p.mean,
                  low=per_k * low, high=per_k * high, level=alpha, margin=margin * tolerance, source=p.source,
                  outcome=TrendOutcome.GROWS if grows else TrendOutcome.FLAT)
    if grows:
        trend.reason = (f"the gap between the two recipes grows: {trend.summary()}, "
                        f"{abs(p.mean) * steps:.4f} nats per {steps:,} steps, more than parity.trend_margin x T = "
                        f"{margin * tolerance:.4f}; its mean ({mean_diff:+.4f} nats) is within T, but a longer run "
                        "would see it larger: not approved on this evidence")
    return trend
