"""Every statistic the control system uses, in one place (numpy + scipy).

The other guard modules only collect measurements and call these functions; ``docs/guard.md``
states the maths of each one. Loss values are in nats; throughput comparisons work on log ratios,
so a speed-up and its inverse are symmetric and a geometric mean summarises the pairs.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

BOOTSTRAP_SEED = 0  # fixed: the same measurements always give the same interval


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


def paired_gap(candidate: Sequence[float], baseline: Sequence[float], window: int) -> float:
    """RMS of the difference of two smoothed loss curves measured on the same steps and batches."""
    n = min(len(candidate), len(baseline))
    return rms(smooth(candidate[:n], window) - smooth(baseline[:n], window))


def seed_spread(curves: Sequence[Sequence[float]], window: int) -> float:
    """How far apart the smoothed loss curves of runs with different seeds are: the RMS of the
    paired gap over every pair of curves (the reference a same-seed candidate is scaled by)."""
    n = min(len(c) for c in curves)
    smoothed = [smooth(c[:n], window) for c in curves]
    diffs = [a - b for a, b in itertools.combinations(smoothed, 2)]
    if not diffs:
        raise ValueError("seed_spread needs at least two curves")
    return rms(np.concatenate(diffs))


def batch_noise_spread(curve: Sequence[float], window: int) -> float:
    """The paired gap expected from a different sample order, estimated from one run alone.

    Batch-to-batch noise sigma comes from successive differences (var(x_t - x_t-1) = 2 sigma^2 when
    the trend is slow); two independent noise sequences smoothed over ``window`` points differ by
    sigma * sqrt(2 / window).
    """
    x = np.asarray(curve, dtype=float)
    if len(x) < 3:
        return 0.0
    return step_noise(x) * math.sqrt(2 / max(1, min(window, len(x))))


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


def mean_with_error(values: Sequence[float]) -> MeanEstimate:
    """Mean of a noisy loss series and its standard error, from the series alone.

    Residuals about a least-squares line (a loss curve's slow descent is not noise) give sigma; their
    autocorrelations rho_k give the integrated autocorrelation time tau = 1 + 2 sum rho_k, summed
    while rho_k > 0 (the initial positive sequence) and k < n / 3. Slow wander of a run's loss, the
    mark of its own trajectory, shows up as positive rho_k and widens the error. SE = sigma sqrt(tau / n).
    """
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 4:
        return MeanEstimate(float(x.mean()) if n else math.nan, math.inf, n, math.nan, math.nan)
    t = np.arange(n)
    r = x - np.polyval(np.polyfit(t, x, 1), t)
    var = float(r @ r) / (n - 2)
    tau = 1.0
    if var > 0:
        for k in range(1, n // 3):
            rho = float(r[:-k] @ r[k:]) / (n - 2) / var
            if rho <= 0:
                break
            tau += 2 * rho
    return MeanEstimate(float(x.mean()), math.sqrt(var * tau / n), n, math.sqrt(var), tau)


@dataclass(frozen=True)
class IndependentTest:
    diff: float  # candidate - baseline, averaged over the pairs of runs (positive: the candidate is worse)
    se: float
    low: float  # one-sided bounds at level alpha: diff -/+ z_(1-alpha) se
    high: float
    margin: float
    alpha: float
    outcome: str  # "non-inferior" | "worse" | "inconclusive"


def independent_test(diffs: Sequence[float], ses: Sequence[float], margin: float, alpha: float,
                     repeats_independent: bool) -> IndependentTest:
    """End-of-run losses of independent runs (different samples), judged against a margin.

    Per pair k: d_k with standard error s_k (the two runs' errors added in quadrature). Pooled:
    d = mean(d_k), se = sqrt(sum s_k^2) / n; with independent repeats also at least the empirical
    std(d_k) / sqrt(n), which catches the run-to-run wander the within-run errors miss.
    non-inferior when d + z se < margin; worse when d - z se > 0 and not non-inferior; else the runs
    cannot tell (too short or too noisy).
    """
    d, s = np.asarray(diffs, dtype=float), np.asarray(ses, dtype=float)
    n = len(d)
    mean = float(d.mean())
    se = float(np.sqrt(np.sum(s**2))) / n
    if repeats_independent and n > 1:
        se = max(se, float(np.std(d, ddof=1)) / math.sqrt(n))
    z = float(sps.norm.ppf(1 - alpha))
    low, high = mean - z * se, mean + z * se
    outcome = "non-inferior" if high < margin else "worse" if low > 0 else "inconclusive"
    return IndependentTest(mean, se, low, high, margin, alpha, outcome)


def tolerance(reference: float, fraction: float, floor: float) -> float:
    """The loss band a same-seed candidate must stay in: a fraction of the reference spread, at
    least ``floor`` (a deterministic workload can show a reference of ~0)."""
    return max(floor, fraction * reference)


def at_equal_tokens(
    candidate_tokens: Sequence[float],
    candidate_loss: Sequence[float],
    baseline_tokens: Sequence[float],
    baseline_loss: Sequence[float],
    window: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Both smoothed curves on the baseline's token grid, where the two runs overlap.

    ``*_tokens`` are cumulative tokens at each record; the candidate is linearly interpolated.
    """
    bt, ct = np.asarray(baseline_tokens, dtype=float), np.asarray(candidate_tokens, dtype=float)
    bs, cs = smooth(baseline_loss, window), smooth(candidate_loss, window)
    # a smoothed point sits at the token count of its window's last record
    bt, ct = bt[len(bt) - len(bs):], ct[len(ct) - len(cs):]
    keep = (bt >= ct[0]) & (bt <= ct[-1])
    return np.interp(bt[keep], ct, cs), bs[keep]


@dataclass(frozen=True)
class NonInferiority:
    mean_diff: float  # candidate - baseline, averaged over seeds (positive: the candidate is worse)
    margin: float
    p_value: float | None  # None with a single seed: then only the observed difference is compared
    alpha: float
    n: int
    passed: bool


def non_inferiority(
    candidate: Sequence[float], baseline: Sequence[float], margin: float, alpha: float = 0.05
) -> NonInferiority:
    """One-sided paired t-test of H0: mean(candidate - baseline) >= margin against H1: < margin.

    The candidate is non-inferior when H0 is rejected at level ``alpha``. Identical differences
    (zero variance, common for deterministic runs) decide on their mean alone.
    """
    d = np.asarray(candidate, dtype=float) - np.asarray(baseline, dtype=float)
    if len(d) == 0:
        raise ValueError("non_inferiority needs at least one pair of final losses")
    mean = float(d.mean())
    if len(d) == 1:
        return NonInferiority(mean, margin, None, alpha, 1, mean < margin)
    if float(np.std(d)) <= 1e-12 * max(1.0, abs(mean)):
        p = 0.0 if mean < margin else 1.0
    else:
        p = float(sps.ttest_1samp(d, popmean=margin, alternative="less").pvalue)
    return NonInferiority(mean, margin, p, alpha, len(d), p < alpha)


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


def t_interval(x: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """The mean of ``x`` and its Student's t interval, ``mean +- t_(n-1) sd / sqrt(n)``; unbounded
    below two points. The speed-up's small-sample interval (over log ratios) and the quality job's
    gain over seeds (over paired differences)."""
    a = np.asarray(x, dtype=float)
    mean = float(a.mean())
    if len(a) < 2:
        return mean, -math.inf, math.inf
    half = float(sps.t.ppf(0.5 + confidence / 2, len(a) - 1) * a.std(ddof=1) / math.sqrt(len(a)))
    return mean, mean - half, mean + half


def speedup_ci(ratios_log: Sequence[float], confidence: float = 0.95, n_resamples: int = 9999) -> SpeedupCI:
    """Confidence interval of the geometric-mean speed-up from per-pair log ratios.

    Below ``SMALL_SAMPLE`` pairs, Student's t over the log ratios: a bootstrap of 2-9 points
    resamples only what it saw and its interval is far too narrow (two pairs that both read 1.02x
    would give [1.02, 1.03] and approve an A/A comparison); t widens with few pairs as it should.
    From ``SMALL_SAMPLE`` pairs on, BCa (bias-corrected and accelerated) over the pairs, seeded; the
    percentile method where BCa is undefined. A point interval when every pair agrees exactly.
    """
    x = np.asarray(ratios_log, dtype=float)
    centre = float(np.exp(x.mean()))
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return SpeedupCI(centre, centre, centre, confidence, "point")
    if len(x) < SMALL_SAMPLE:
        _, low, high = t_interval(x, confidence)
        return SpeedupCI(centre, float(np.exp(low)), float(np.exp(high)), confidence, f"Student t ({len(x)} pairs)")
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DegenerateDataWarning for tiny samples: checked below
            res = sps.bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                                method=method, rng=np.random.default_rng(BOOTSTRAP_SEED))
        low, high = res.confidence_interval
        if math.isfinite(low) and math.isfinite(high):
            return SpeedupCI(centre, float(np.exp(low)), float(np.exp(high)), confidence, method)
    return SpeedupCI(centre, float(np.exp(x.min())), float(np.exp(x.max())), confidence, "range")


def clears(ci: SpeedupCI, margin: float) -> bool:
    """Approved as faster: the interval's lower end lies above 1 + the noise margin."""
    return ci.low > 1 + margin


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


def relative_spread(values: Sequence[float]) -> float:
    """Coefficient of variation (sample std / mean) of repeated measurements."""
    x = np.asarray(values, dtype=float)
    return float(np.std(x, ddof=1) / np.mean(x)) if len(x) > 1 and np.mean(x) > 0 else 0.0


def sample_std(values: Sequence[float]) -> float:
    x = np.asarray(values, dtype=float)
    return float(np.std(x, ddof=1)) if len(x) > 1 else 0.0
