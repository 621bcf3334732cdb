"""Every statistic the control system uses, in one place (numpy + scipy).

The other guard modules only collect measurements and call these functions; ``docs/guard.md``
states the maths of each one. Loss values are in nats; throughput comparisons work on log ratios,
so a speed-up and its inverse are symmetric and a geometric mean summarises the pairs.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy import stats as sps

from recipetune.core.robust import MAD_SD, mad_sigma  # noqa: F401  (the statistics' home exports it)
from recipetune.core.words import EquivalenceOutcome

BOOTSTRAP_SEED = 0  # fixed: the same measurements always give the same interval

# The normal law's functions as scipy.stats computes them (the same special functions, so the same
# bits), without its argument checking: a verdict's design calls them thousands of times, and
# ``sps.norm.sf`` spends ~0.25 ms a call in that checking.
Real = float | np.ndarray  # a number or an array of them: the functions below work elementwise
_SQRT_2PI = np.sqrt(2 * np.pi)


def norm_cdf(x: Real) -> Real:
    return special.ndtr(x)


def norm_sf(x: Real) -> Real:
    return special.ndtr(-x)


def norm_isf(q: Real) -> Real:
    return -special.ndtri(q)


def norm_pdf(x: Real) -> Real:
    return np.exp(-x**2 / 2.0) / _SQRT_2PI


# ---------------------------------------------------------------------------------- loss curves


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average over ``window`` points, only where the window is full.

    A curve shorter than the window is averaged over its whole length (one point).
    """
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        return x
    w = max(1, min(window, len(x)))
    return np.convolve(x, np.ones(w) / w, mode="valid")


def rms(values: Sequence[float] | np.ndarray) -> float:
    x = np.asarray(values, dtype=float)
    return float(np.sqrt(np.mean(x**2))) if len(x) else 0.0


def step_noise(curve: Sequence[float]) -> float:
    """Step-to-step noise sigma of a logged loss, from successive differences (var(x_t - x_t-1) =
    2 sigma^2 when the trend is slow). It shrinks with the sequences the logged loss averages."""
    x = np.asarray(curve, dtype=float)
    return float(np.std(np.diff(x), ddof=1)) / math.sqrt(2) if len(x) >= 3 else 0.0


@dataclass(frozen=True)
class MeanEstimate:
    mean: float
    se: float  # standard error of the mean, autocorrelation included
    n: int
    sigma: float  # residual standard deviation about the linear trend
    tau: float  # integrated autocorrelation time: the series holds n / tau independent values


def least_squares(x: np.ndarray, y: np.ndarray) -> tuple[Real, np.ndarray]:
    """The least-squares line of ``y`` on ``x``: its slope and the residuals about it. ``y`` is one series
    over ``x`` or rows of series over the same ``x``, each fitted on its own (the slopes then an array)."""
    xc = x - x.mean()
    yc = y - y.mean(axis=-1, keepdims=True)
    slope = yc @ xc / float(xc @ xc)
    return slope, yc - np.expand_dims(slope, -1) * xc


@dataclass(frozen=True)
class LineFit:
    """A least-squares line through a noisy series (``line_fit``): its slope, the slope's standard error
    and the residuals' noise about the line."""

    slope: float
    se: float  # the slope's standard error, widened by the residuals' autocorrelation (inf: too few points)
    var: float  # residual variance about the line (n - 2 degrees of freedom)
    tau: float  # the residuals' integrated autocorrelation time (``autocorrelation_time``)
    n: int


def line_fit(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> LineFit:
    """The least-squares line of ``y`` on ``x``, the one line fit of the guard: a loss curve's slow descent
    under ``mean_with_error``, the gap's slope under the trend (guard/trend.py). The residuals give the
    variance and their integrated autocorrelation time tau; the slope's error is sqrt(var tau / Sxx), its
    standard error were the residuals independent, widened by tau. Below four points no error: slope nan,
    se inf."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(xs)
    if n < 4:
        return LineFit(math.nan, math.inf, math.nan, math.nan, n)
    slope, r = least_squares(xs, ys)
    var = float(r @ r) / (n - 2)
    tau = autocorrelation_time(r, var)
    xc = xs - xs.mean()
    return LineFit(float(slope), math.sqrt(var * tau / float(xc @ xc)), var, tau, n)


def mean_with_error(values: Sequence[float]) -> MeanEstimate:
    """Mean of a noisy loss series and its standard error, from the series alone.

    Residuals about a least-squares line (``line_fit``: a loss curve's slow descent is not noise) give sigma;
    their autocorrelations rho_k give the integrated autocorrelation time tau = 1 + 2 sum rho_k, summed
    while rho_k > 0 (the initial positive sequence) and k < n / 3. Slow wander of a run's loss, the
    mark of its own trajectory, shows up as positive rho_k and widens the error. SE = sigma sqrt(tau / n).
    """
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 4:
        return MeanEstimate(float(x.mean()) if n else math.nan, math.inf, n, math.nan, math.nan)
    fit = line_fit(np.arange(n), x)
    return MeanEstimate(float(x.mean()), math.sqrt(fit.var * fit.tau / n), n, math.sqrt(fit.var), fit.tau)


def autocorrelation_time(r: np.ndarray, var: float) -> float:
    """The integrated autocorrelation time tau = 1 + 2 sum rho_k of residuals ``r`` about a fitted line
    (two parameters, hence n - 2), ``var`` their variance; the sum runs while rho_k > 0 (the initial
    positive sequence) and k < n / 3."""
    n, tau = len(r), 1.0
    if var > 0:
        for k in range(1, n // 3):
            rho = float(r[:-k] @ r[k:]) / (n - 2) / var
            if rho <= 0:
                break
            tau += 2 * rho
    return tau


POWER = 0.8  # the detectable difference is the true difference these runs would catch 80% of the time


@dataclass(frozen=True)
class Paired:
    """The mean of paired differences and its standard error (docs/guard.md, "The test")."""

    mean: float
    se: float
    df: int | None  # Student's t degrees of freedom; None: the normal quantile (within-run errors decide)
    source: str
    n: int


def paired(diffs: Sequence[float], ses: Sequence[float] | None, independent: bool = True, pilot: int = 0) -> Paired:
    """Per pair of runs k: a difference d_k and (when the measure has one) its within-run standard
    error s_k. The mean d has se = max(sqrt(sum s_k^2) / n, sd(d_k) / sqrt(n)): the within-run errors
    (many degrees of freedom: z) and, with independent repeats, the pairs' own scatter, which catches
    what within-run noise misses (a trajectory's offset from its initialisation); where the scatter
    decides, or the measure has no within-run error (one validation loss per run), it is estimated
    from the pairs alone, so Student's t.

    ``pilot``: the first pairs sized the evidence (a sequential verdict planned its seeds from their
    scatter): the mean is over every pair, the scatter over the pairs after them, on n - pilot - 1
    degrees of freedom. Judged by the scatter that chose how many pairs to run, a verdict would favour
    the plans drawn after a small scatter by chance (Stein's two-stage test: this way the statistic is
    exactly Student's t whatever the plan)."""
    d = np.asarray(diffs, dtype=float)
    n = len(d)
    if n == 0:
        raise ValueError("a paired difference needs at least one pair of runs")
    mean = float(d.mean())
    within = None
    if ses is not None and len(ses) == n and all(math.isfinite(s) for s in ses):
        within = float(np.sqrt(np.sum(np.square(ses)))) / n
    rest = d[pilot:] if 0 < pilot < n - 1 else d
    scatter = float(np.std(rest, ddof=1)) / math.sqrt(n) if independent and len(rest) > 1 else None
    df, kind = len(rest) - 1, f"{n} independent pairs" if len(rest) == n else \
        f"the {len(rest)} pairs after the {n - len(rest)} that sized the plan, over {n}"
    if within is None and scatter is None:  # one value per run and no repeats: no measurable noise
        return Paired(mean, math.inf, None, "no measurable noise (one value per run, no independent repeats)", n)
    if within is None:
        return Paired(mean, float(scatter), df, f"scatter of {kind} (Student's t, {df} df)", n)
    if scatter is not None and scatter > within:  # the pairs vary more than their runs' noise says
        return Paired(mean, float(scatter), df, f"scatter of {kind}, above their within-run noise "
                                                f"(Student's t, {df} df)", n)
    return Paired(mean, within, None, f"within-run noise of {n} pair(s)", n)


def quantile(level: float, df: int | None) -> float:
    """One-sided critical value at nominal ``level``: Student's t on ``df`` degrees of freedom, the
    normal quantile where ``df`` is None."""
    if level <= 0.0:
        return math.inf
    return float(norm_isf(level) if df is None else -special.stdtrit(df, level))


@dataclass(frozen=True)
class Equivalence:
    """The one parity test (docs/guard.md, "The standard of proof"): is the candidate's loss measure
    within +-T of the baseline's, shown at the stated confidence?"""

    diff: float  # candidate - baseline, averaged over the pairs of runs (positive: the candidate is worse)
    se: float  # standard error of ``diff``
    quantile: float  # critical value: z or Student's t at this look's nominal level (one-sided)
    low: float  # diff - quantile * se
    high: float  # diff + quantile * se
    tolerance: float  # T
    detectable: float  # (quantile + z_POWER) * se: the smallest true difference these runs resolve
    two_sided: bool  # a speed change: equivalence; an allowed semantic change: non-inferiority
    outcome: EquivalenceOutcome
    source: str  # where se came from
    df: int | None = None


def equivalence(diffs: Sequence[float], ses: Sequence[float] | None, tolerance: float, level: float,
                independent: bool = True, two_sided: bool = True, pilot: int = 0) -> Equivalence:
    """Two one-sided tests of |candidate - baseline| < T (``two_sided``), or of candidate - baseline < T,
    at the nominal one-sided ``level`` of this look (alpha for a single look; a group-sequential
    design gives each look its own, core/sequential.py). The standard error: ``paired``.

    equivalent: the one-sided bounds lie inside (-T, T) (above -T only matters for a speed change)
      and the runs resolve T: detectable <= T;
    different: the bounds lie entirely outside [-T, T]: shown to differ by more than T;
    inconclusive: otherwise (more seeds or steps would tell).
    """
    est = paired(diffs, ses, independent, pilot)
    q = quantile(level, est.df) if math.isfinite(est.se) else math.inf
    z_power = float(special.ndtri(POWER))
    low, high = (est.mean - q * est.se, est.mean + q * est.se) if math.isfinite(q) else (-math.inf, math.inf)
    detectable = (q + z_power) * est.se if math.isfinite(q * est.se) else math.inf
    if two_sided:
        inside, outside = -tolerance < low and high < tolerance, low > tolerance or high < -tolerance
    else:
        inside, outside = high < tolerance, low > tolerance
    resolved = detectable <= tolerance
    outcome = (EquivalenceOutcome.EQUIVALENT if inside and resolved else
               EquivalenceOutcome.DIFFERENT if outside else EquivalenceOutcome.INCONCLUSIVE)
    return Equivalence(est.mean, est.se, q, low, high, tolerance, detectable, two_sided, outcome, est.source, est.df)


# ----------------------------------------------------------------------------------- throughput


def log_ratios(candidate: Sequence[float], baseline: Sequence[float]) -> np.ndarray:
    """Per-pair log(candidate / baseline) of two throughput series measured in interleaved pairs."""
    c, b = np.asarray(candidate, dtype=float), np.asarray(baseline, dtype=float)
    if len(c) != len(b) or not len(c):
        raise ValueError("log_ratios needs two equally long, non-empty series")
    if (c <= 0).any() or (b <= 0).any():
        raise ValueError("throughputs must be positive")
    return np.log(c / b)


@dataclass(frozen=True)
class SpeedupCI:
    speedup: float  # geometric mean of the per-pair ratios
    low: float
    high: float
    confidence: float
    method: str


SMALL_SAMPLE = 10  # pairs below which the speed-up's interval is Student's t, not a bootstrap


def t_interval(x: Sequence[float], confidence: float = 0.95,
               spread: tuple[float, int] | None = None) -> tuple[float, float, float]:
    """The mean of ``x`` and its Student's t interval, ``mean +- t_df sd / sqrt(n)``, with ``sd`` and
    ``df`` the points' own (``n - 1``) unless ``spread`` gives them; unbounded below two points. The
    speed-up's small-sample interval (over log ratios, ``pair_spread``'s spread) and the quality job's
    gain over seeds (over paired differences)."""
    a = np.asarray(x, dtype=float)
    mean = float(a.mean())
    if len(a) < 2:
        return mean, -math.inf, math.inf
    sd, df = spread if spread is not None else (float(a.std(ddof=1)), len(a) - 1)
    half = float(sps.t.ppf(0.5 + confidence / 2, df) * sd / math.sqrt(len(a)))
    return mean, mean - half, mean + half


def pair_spread(ratios_log: Sequence[float], aa_log_ratios: Sequence[float] = ()) -> tuple[float, int]:
    """One pair's log-ratio standard deviation and its degrees of freedom: the pairs' own, or, where
    the A/A ratios (two runs of one recipe: the same noise as a pair) say more, both pooled. A few
    pairs can agree by chance on a busy machine: three A/A pairs read 1.36x, 1.36x and 1.43x (sd 0.028)
    while the baseline's own A/A ratios moved by 0.23, and the pairs' scatter alone approved them."""
    x = np.asarray(ratios_log, dtype=float)
    n, aa = len(x), np.asarray(aa_log_ratios, dtype=float)
    own = float(x.std(ddof=1)) if n > 1 else math.inf
    if n < 2 or not len(aa):
        return own, n - 1
    pooled = math.sqrt(((n - 1) * own**2 + float((aa**2).sum())) / (n - 1 + len(aa)))
    return (pooled, n - 1 + len(aa)) if pooled > own else (own, n - 1)


def speedup_ci(ratios_log: Sequence[float], confidence: float = 0.95, n_resamples: int = 9999,
               aa_log_ratios: Sequence[float] = ()) -> SpeedupCI:
    """Confidence interval of the geometric-mean speed-up from per-pair log ratios.

    Below ``SMALL_SAMPLE`` pairs, Student's t over the log ratios with ``pair_spread``'s standard
    deviation (never narrower than the A/A ratios say one pair is): a bootstrap of 2-9 points
    resamples only what it saw and its interval is far too narrow (two pairs that both read 1.02x
    would give [1.02, 1.03] and approve an A/A comparison); t widens with few pairs as it should.
    From ``SMALL_SAMPLE`` pairs on, BCa (bias-corrected and accelerated) over the pairs, seeded; the
    percentile method where BCa is undefined. A point interval when every pair agrees exactly and
    no A/A ratio says otherwise.
    """
    x = np.asarray(ratios_log, dtype=float)
    centre = float(np.exp(x.mean()))
    sd, df = pair_spread(x, aa_log_ratios)
    if len(x) < 2 or sd == 0.0:
        return SpeedupCI(centre, centre, centre, confidence, "point")
    if len(x) < SMALL_SAMPLE:
        mean, low, high = t_interval(x, confidence, (sd, df))
        how = "" if df == len(x) - 1 else f", the spread pooled with {df - len(x) + 1} A/A ratios"
        return SpeedupCI(centre, centre * math.exp(low - mean), centre * math.exp(high - mean), confidence,
                         f"Student t ({len(x)} pairs{how})")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning for tiny samples: checked below
            res = sps.bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                                method=method, rng=np.random.default_rng(BOOTSTRAP_SEED))
        low, high = res.confidence_interval
        if math.isfinite(low) and math.isfinite(high):
            return SpeedupCI(centre, float(np.exp(low)), float(np.exp(high)), confidence, method)
    return SpeedupCI(centre, float(np.exp(x.min())), float(np.exp(x.max())), confidence, "range")


def smallest_approvable(ratios_log: Sequence[float], confidence: float, margin: float,
                        aa_log_ratios: Sequence[float] = ()) -> float | None:
    """The smallest speed-up pairs with this scatter could approve: ``(1 + m) exp(q sd / sqrt(n))``,
    with ``sd`` one pair's standard deviation (``pair_spread``), ``m`` the noise margin and ``q``
    the two-sided quantile of the interval the verdict uses (Student's t below ``SMALL_SAMPLE``
    pairs, the normal quantile from there on, where the bootstrap's interval is about as wide).
    None below two pairs, whose interval is unbounded."""
    x = np.asarray(ratios_log, dtype=float)
    n = len(x)
    if n < 2:
        return None
    p = 0.5 + confidence / 2
    sd, df = pair_spread(x, aa_log_ratios) if n < SMALL_SAMPLE else (float(x.std(ddof=1)), n - 1)
    q = float(sps.t.ppf(p, df)) if n < SMALL_SAMPLE else float(sps.norm.ppf(p))
    return (1 + margin) * math.exp(q * sd / math.sqrt(n))


def clears(ci: SpeedupCI, margin: float) -> bool:
    """Approved as faster: the interval's lower end lies above 1 + the noise margin."""
    return ci.low > 1 + margin


def aa_log_ratios(throughputs: Sequence[float]) -> list[float]:
    """log(run i+1 / run i) over consecutive runs of one recipe: the A/A comparisons they hold
    (none under two runs)."""
    if len(throughputs) < 2:
        return []
    return [float(x) for x in log_ratios(throughputs[1:], throughputs[:-1])]


def aa_spread(aa_log_ratios: Sequence[float]) -> float:
    """RMS of baseline-vs-baseline log ratios: how much one throughput comparison moves when nothing
    changed. RMS rather than standard deviation: an A/A ratio is expected to be 1, so any offset
    (drift, order effects) counts as noise too."""
    return rms(aa_log_ratios)


def noise_margin(aa_log_ratios: Sequence[float], floor: float) -> float:
    """The relative speed-up that counts as noise: one A/A spread, at least ``floor``."""
    return max(floor, math.expm1(aa_spread(aa_log_ratios)))


def proportion_ci(k: int, n: int, confidence: float = 0.95) -> tuple[float, float, float]:
    """A rate k/n with its exact (Clopper-Pearson) confidence interval, e.g. a false-approval rate."""
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return k / n, float(ci.low), float(ci.high)


def sample_std(values: Sequence[float]) -> float:
    x = np.asarray(values, dtype=float)
    return float(np.std(x, ddof=1)) if len(x) > 1 else 0.0
