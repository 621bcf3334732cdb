"""Fits behind the critical batch size (CBS) of arXiv 2410.21676.

For each batch size B the steps S(B) to reach a fixed target loss are measured; the curve is fitted with
S(B) = a + b/B (b/B: the linear-scaling regime, a: the floor of serial steps no batch size removes). The
critical batch size B* is where S(B) overshoots perfect linear scaling from a reference B_opt by 20%.
Scaling of B* with data size D or model size N is a power law fitted in log-log space.

Batch sizes are in whatever unit the measurements use (the paper: sequences of 512 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy import stats

PAPER_DATA_EXPONENT = 0.47  # B* ~ D^0.47 at fixed model size
PAPER_MODEL_EXPONENT = 0.09  # B* ~ N^0.09 at fixed data size
PAPER_CHINCHILLA_COEF = 93.2  # B* = 93.2 N^0.47, N in millions of params, B in 512-token sequences
PAPER_CHINCHILLA_EXPONENT = 0.47
OVERHEAD = 1.2  # the 20% rule: B* is where steps exceed linear scaling by 20%


def _as_positive_1d(name: str, values: npt.ArrayLike) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values: {arr.tolist()}")
    if np.any(arr <= 0):
        raise ValueError(f"{name} must be positive, got {arr.tolist()}")
    return arr


@dataclass
class StepsFit:
    """S(B) = a + b/B fitted by weighted least squares; cov is the covariance of (a, b)."""

    a: float
    b: float
    cov: np.ndarray
    r2: float
    n: int
    batch_sizes: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    steps: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)

    def predict(self, batch_size: float | np.ndarray) -> float | np.ndarray:
        return self.a + self.b / np.asarray(batch_size, dtype=float)

    @property
    def a_se(self) -> float:
        return float(np.sqrt(self.cov[0, 0]))

    @property
    def b_se(self) -> float:
        return float(np.sqrt(self.cov[1, 1]))


def _wls(batch_sizes: np.ndarray, steps: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    design = np.column_stack([np.ones_like(batch_sizes), 1.0 / batch_sizes])
    sw = np.sqrt(weights)
    coef, *_ = np.linalg.lstsq(design * sw[:, None], steps * sw, rcond=None)
    return coef, design


def fit_steps_vs_batch(
    batch_sizes: npt.ArrayLike, steps: npt.ArrayLike, weights: npt.ArrayLike | None = None
) -> StepsFit:
    """Fit S(B) = a + b/B, which is linear in (1, 1/B), by weighted linear least squares.

    weights multiply the squared residuals. By default they are 1/S(B)^2 (relative residuals),
    because step counts to a target scatter roughly in proportion to their size; without that the
    largest S (smallest B) would swamp the fit and leave `a` undetermined. The default uses the
    fitted S from a first unweighted pass, not the noisy observed S, to avoid favouring low points.
    The covariance is scaled by the weighted residual variance (as scipy's curve_fit does with
    absolute_sigma=False); r2 is the weighted coefficient of determination.
    """
    bs = _as_positive_1d("batch_sizes", batch_sizes)
    st = _as_positive_1d("steps", steps)
    if len(bs) != len(st):
        raise ValueError(f"batch_sizes and steps differ in length: {len(bs)} vs {len(st)}")
    if len(np.unique(bs)) < 3:
        raise ValueError(f"need at least 3 distinct batch sizes, got {sorted(set(bs.tolist()))}")
    if weights is None:
        coef, _ = _wls(bs, st, np.ones_like(st))
        pred = coef[0] + coef[1] / bs
        # A wild first pass (non-positive prediction) falls back to the observed steps.
        w = 1.0 / np.where(pred > 0, pred, st) ** 2
    else:
        w = _as_positive_1d("weights", weights)
        if len(w) != len(bs):
            raise ValueError(f"weights has {len(w)} values for {len(bs)} batch sizes")
    coef, design = _wls(bs, st, w)
    resid = st - design @ coef
    n = len(bs)  # >= 3, so the n - 2 degrees of freedom are never zero
    chi2 = float(np.sum(w * resid**2))
    cov = np.linalg.inv(design.T @ (design * w[:, None])) * (chi2 / (n - 2))
    mean = np.sum(w * st) / np.sum(w)
    ss_tot = float(np.sum(w * (st - mean) ** 2))
    r2 = 1.0 - chi2 / ss_tot if ss_tot > 0 else 1.0
    return StepsFit(float(coef[0]), float(coef[1]), cov, r2, n, bs, st)


def _check_cbs_inputs(a: float, b: float, b_opt: float) -> None:
    if b_opt <= 0:
        raise ValueError(f"b_opt must be positive, got {b_opt}")
    if a <= 0:
        raise ValueError(
            f"a = {a:.4g} <= 0: steps show no floor in the measured range, so the critical batch size "
            "is unbounded by this data; measure larger batch sizes"
        )
    if b <= 0:
        raise ValueError(f"b = {b:.4g} <= 0: steps do not fall with batch size, there is no linear regime")


def critical_batch_size(a: float, b: float, b_opt: float) -> float:
    """B* = b/(5a) + 1.2 B_opt: where S(B) exceeds linear scaling from B_opt by 20%.

    Linear scaling from B_opt predicts S_lin(B) = S(B_opt) B_opt / B. Setting S(B*) = 1.2 S_lin(B*):
        a + b/B* = 1.2 (a + b/B_opt) B_opt / B*
        a B* + b = 1.2 a B_opt + 1.2 b
        B* = 1.2 B_opt + 0.2 b / a = b/(5a) + 1.2 B_opt.
    Raises ValueError when a <= 0 (no saturation seen, B* unbounded by the data) or b <= 0.
    """
    _check_cbs_inputs(a, b, b_opt)
    return b / (5.0 * a) + OVERHEAD * b_opt


def default_b_opt(batch_sizes: npt.ArrayLike) -> float:
    """The documented reference B_opt: the smallest measured batch size, taken to be in the linear regime."""
    return float(np.min(_as_positive_1d("batch_sizes", batch_sizes)))


def critical_batch_size_ci(
    fit: StepsFit, b_opt: float, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile interval of B* from a parametric bootstrap of (a, b) ~ N(fit, fit.cov).

    Draws with a <= 0 have an unbounded B*; they count as +inf, so the upper end is inf when more than
    (1 - level)/2 of the draws saw no saturation.
    """
    rng = np.random.default_rng(seed)
    draws = rng.multivariate_normal([fit.a, fit.b], fit.cov, size=n_boot, check_valid="ignore")
    a, b = draws[:, 0], draws[:, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        b_star = np.where(a > 0, b / (5.0 * a) + OVERHEAD * b_opt, np.inf)
    # inverted_cdf picks order statistics, so an inf sample never gets interpolated into a NaN.
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(b_star, [tail, 1.0 - tail], method="inverted_cdf")
    return float(lo), float(hi)


@dataclass
class PowerLawFit:
    """y = coef * x^exponent fitted in log-log space; intervals are two-sided at `level` (t, n-2 dof)."""

    coef: float
    exponent: float
    exponent_ci: tuple[float, float]
    coef_ci: tuple[float, float]
    r2: float
    n: int
    note: str = ""

    def predict(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.coef * np.asarray(x, dtype=float) ** self.exponent


def fit_power_law(x: npt.ArrayLike, y: npt.ArrayLike, level: float = 0.95) -> PowerLawFit:
    """Least squares of log y = log c + alpha log x.

    Needs >= 3 points for an interval; with exactly 2 points the line is exact and the intervals are NaN
    (said in `note`).
    """
    xs = _as_positive_1d("x", x)
    ys = _as_positive_1d("y", y)
    if len(xs) != len(ys):
        raise ValueError(f"x and y differ in length: {len(xs)} vs {len(ys)}")
    if len(np.unique(xs)) < 2:
        raise ValueError(f"need at least 2 distinct x values for a power law, got {sorted(set(xs.tolist()))}")
    res = stats.linregress(np.log(xs), np.log(ys))
    n = len(xs)
    coef = float(np.exp(res.intercept))
    if n < 3:
        nan_ci = (float("nan"), float("nan"))
        note = "2 points: exact line, no interval"
        return PowerLawFit(coef, float(res.slope), nan_ci, nan_ci, 1.0, n, note)
    t = float(stats.t.ppf(0.5 + level / 2.0, n - 2))
    exp_ci = (float(res.slope - t * res.stderr), float(res.slope + t * res.stderr))
    coef_ci = (
        float(np.exp(res.intercept - t * res.intercept_stderr)),
        float(np.exp(res.intercept + t * res.intercept_stderr)),
    )
    return PowerLawFit(coef, float(res.slope), exp_ci, coef_ci, float(res.rvalue**2), n)
