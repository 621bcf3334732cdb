"""After approval: does a training run of the approved recipe drift away from the baseline's curve? The design.

The statistics of ``recipetune watch`` (docs/guard.md, "After approval: recipetune watch"), before the
run is read: the baseline curves in, a ``Plan`` out (the blocks, the noise measured on the baselines,
the boundary for a stated false-alarm chance, the delay it states); no files, no runs. The run is fed
through it by guard/monitor.py. A curve is one loss measure of a run (the training loss, or the
validation loss where the runs record one): the design is the same on either.

The gap ``g_t = run_t - mean(baseline)_t`` is cut into blocks of ``B`` logged steps. A block's mean gap
is the sum of two independent parts under the null (an equivalent run: another seed, other batches):

- the **offset**, one for the whole run: how far one run's loss level sits from another's by its seed
  (its trajectory from its initialisation and its batches). Its standard deviation is the guard's
  seed-to-seed spread sigma_M (the profile's ``loss_reference``; T = ``parity.tolerance`` x sigma_M),
  or the baseline curves' own spread of levels where several are given and it is larger;
- the **block noise**: the within-run scatter of a block mean about the curve's trend. Consecutive
  losses of one curve are correlated (an EMA-smoothed loss strongly so): blocks are at least twice the
  curve's integrated autocorrelation time ``tau`` long, so block means are close to independent, and
  their scatter is measured on the block means themselves (robust second differences), not derived from
  step-to-step noise.

So the standardised block gaps ``z_k = G_k / sd_k`` are equicorrelated normals (correlation ``rho_k``,
the offset's share of the variance), not a random walk: a CUSUM would accumulate the offset of an
equivalent run forever, and the Brownian-motion boundaries of guard/sequential.py assume independent
increments. The boundary ``h`` is instead set exactly for this law, on both sides: a loss that falls
below the baseline's beyond noise (data repeated, leaked, a loss over fewer tokens) is as suspect as
one that rises. The chance that an equivalent run shows ``persist`` consecutive blocks beyond ``h`` on
the same side (``z_k > h``, or ``z_k < -h``) anywhere over the planned blocks is ``alpha`` (the error
spent evenly over the run's length and over both sides; integrated over the offset, a Markov chain over
the current streak and its side). A spike that recovers within fewer blocks is a warning that clears.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from scipy import special
from scipy.optimize import brentq

from recipetune.core import stats
from recipetune.core.stats import norm_isf, norm_sf

ALPHA = 0.05  # the chance an equivalent run raises a (false) alarm over the whole compared length
PERSIST = 3  # consecutive blocks beyond the boundary that make an alarm; fewer: a warning that clears
MAX_RHO = 1.0 - 1e-9
_Q = (np.arange(1200) + 0.5) / 1200  # the offset's law integrated over its quantiles (equal weights)


@functools.cache
def _offsets(dof: int | None) -> np.ndarray:
    """The standardised offset at the quantiles ``_Q``: normal where its sd is known, Student's t on
    ``dof`` degrees of freedom where it was estimated from ``dof + 1`` runs (a new run's offset from
    the mean of m runs, over the sd those m show, is t on m - 1)."""
    return norm_isf(1.0 - _Q) if dof is None else special.stdtrit(dof, _Q)


class DriftInputError(ValueError):
    """The curves cannot be compared (no common steps, too short, no noise to judge by)."""


@dataclass(frozen=True)
class Curve:
    """One run's logged training loss: increasing steps, their losses, where it came from."""

    steps: np.ndarray
    loss: np.ndarray
    source: str

    @staticmethod
    def of(steps: Sequence[int], loss: Sequence[float], source: str) -> Curve:
        s, x = np.asarray(steps, dtype=int), np.asarray(loss, dtype=float)
        order = np.argsort(s, kind="stable")
        return Curve(s[order], x[order], source)

    def at(self, steps: np.ndarray) -> np.ndarray:
        """Losses at ``steps`` (NaN where this curve logged none)."""
        out = np.full(len(steps), np.nan)
        if len(self.steps):
            idx = np.clip(np.searchsorted(self.steps, steps), 0, len(self.steps) - 1)
            hit = self.steps[idx] == steps
            out[hit] = self.loss[idx[hit]]
        return out


# ------------------------------------------------------------------------------------ the boundary


def _no_alarm(up: np.ndarray, down: np.ndarray, counts: Sequence[int], persist: int) -> np.ndarray:
    """P(no ``persist`` consecutive exceedances on one side) over segments of independent blocks:
    ``counts[i]`` blocks that each exceed above with chance ``up[i, u]`` and below with ``down[i, u]``
    (a column per offset value). A Markov chain over the current streak: none (state 0), above for
    j blocks (state j), below for j blocks (state persist - 1 + j); each segment's transition raised
    to its count by squaring. A block beyond on the other side starts a streak of 1 on that side."""
    n, k = up.shape[1], 2 * persist - 1
    above, below = range(1, persist), range(persist, k)
    state = np.zeros((n, k))
    state[:, 0] = 1.0
    for pu, pd, count in zip(up, down, counts, strict=True):
        step = np.zeros((n, k, k))
        step[:, :, 0] = (1.0 - pu - pd)[:, None]  # a block within the boundary ends the streak
        for side, p, other in ((above, pu, below), (below, pd, above)):
            if persist == 1:
                break  # every exceedance is an alarm: it leaves the chain
            step[:, 0, side[0]] = p
            for j in other:  # a streak on the other side ends, one on this side begins
                step[:, j, side[0]] = p
            for a, b in zip(side[:-1], side[1:], strict=True):
                step[:, a, b] = p  # the streak grows; reaching `persist` leaves the chain (an alarm)
        while count:
            if count & 1:
                state = np.einsum("nj,njk->nk", state, step)
            step = step @ step
            count >>= 1
    return state.sum(axis=1)


def false_alarm(h: float, rhos: Sequence[float], persist: int = PERSIST, dof: int | None = None) -> float:
    """The chance that an equivalent run alarms (either side) somewhere over blocks with offset shares ``rhos``."""
    r = np.clip(np.asarray(rhos, dtype=float), 0.0, MAX_RHO)
    cut = np.flatnonzero(np.abs(np.diff(r)) > 1e-12) + 1  # runs of equal shares: one segment each
    starts = np.concatenate([[0], cut])
    counts = np.diff(np.concatenate([starts, [len(r)]]))
    seg = r[starts][:, None]
    shift, scale = np.sqrt(seg) * _offsets(dof)[None, :], np.sqrt(1.0 - seg)
    up, down = norm_sf((h - shift) / scale), norm_sf((h + shift) / scale)
    return float(1.0 - np.mean(_no_alarm(up, down, [int(c) for c in counts], persist)))


def boundary(alpha: float, rhos: Sequence[float], persist: int = PERSIST, dof: int | None = None) -> float:
    """The boundary ``h`` (in standard deviations of a block gap, on either side) whose false-alarm
    chance over these blocks, both sides together, is ``alpha``: the two-sided law itself, not a
    one-sided boundary mirrored (which would spend about twice ``alpha``)."""
    if not len(rhos):
        return math.inf
    if false_alarm(0.0, rhos, persist, dof) <= alpha:
        return 0.0  # so few blocks that even h = 0 spends less
    return float(brentq(lambda h: false_alarm(h, rhos, persist, dof) - alpha, 0.0, 40.0, xtol=1e-4))


# ----------------------------------------------------------------------------------------- noise


@dataclass(frozen=True)
class Noise:
    """The null's noise, per run (not per gap): what the boundary is computed from."""

    offset: float  # seed-to-seed sd of one run's loss level (nats)
    offset_source: str
    dof: int | None  # the offset's sd was estimated on these degrees of freedom (None: known)
    block: float  # sd of one run's block mean about its trend (nats)
    tau: float  # integrated autocorrelation time of one run's logged loss, in logged points
    block_points: int  # B, logged points per block

    def tail_spread(self, tail_points: float) -> float:
        """The spread of one run's mean over a tail of ``tail_points`` logged points, as the parity verdict
        measures a loss (guard/loss.py: the seed-to-seed spread of that mean, where repeats give one): the
        run's level offset, and its block noise averaged over the tail's blocks (B points a block)."""
        return math.sqrt(self.offset**2 + self.block**2 * self.block_points / tail_points)


def curve_tau(curves: Sequence[np.ndarray], chunk: int = 400) -> float:
    """The integrated autocorrelation time of one run's logged loss about its trend, in logged points,
    estimated from the baseline curves (not ``stats.autocorrelation_time``, which is that of given
    residuals: this picks the residuals, and reads each chunk's tau from ``stats.line_fit``).

    With two curves, from their difference (the trend cancels, the noise of both is the same law);
    otherwise from each curve's residuals about a line, over chunks (a loss curve is not a line over
    thousands of steps; over a chunk it nearly is). The median over chunks."""
    series = list(curves)
    if len(curves) >= 2:
        n = min(len(curves[0]), len(curves[1]))
        series, chunk = [curves[0][:n] - curves[1][:n]], max(chunk, n)  # no trend: the whole series
    taus = []
    for x in series:
        for i in range(0, max(len(x) - chunk // 2, 1), chunk):
            part = x[i:i + chunk]
            if len(part) >= 12:
                tau = stats.line_fit(np.arange(len(part)), part).tau
                if math.isfinite(tau):
                    taus.append(tau)
    return float(np.median(taus)) if taus else 1.0


def block_scatter(curves: Sequence[np.ndarray], b: int, tau: float) -> float:
    """One run's block-mean noise: the larger of (a) the robust scatter of second differences of its
    block means (a smooth trend cancels; var = 6 sd^2 for independent blocks) and (b) the residual sd
    about each block's own line times sqrt(tau / B). The larger: each misses what the other sees (a
    line fitted inside a short block absorbs slow wander in (b); a trend's curvature inflates (a) where
    one curve is all there is). With several curves, on the differences of consecutive ones over
    sqrt(2): the trend and the offsets cancel exactly, one run's noise is left."""
    second, within = [], []
    t = np.arange(b) - (b - 1) / 2.0
    if len(curves) >= 2:  # two runs' difference over sqrt(2): one run's noise, no trend, no offset
        pairs = zip(curves[:-1], curves[1:], strict=True)
        curves = [(x[:k] - y[:k]) / math.sqrt(2) for x, y in pairs if (k := min(len(x), len(y)))]
    for x in curves:
        n = len(x) // b
        if n == 0:
            continue
        rows = x[: n * b].reshape(n, b)
        m = rows.mean(axis=1)
        if n >= 4:
            second.extend(np.abs(np.diff(m, 2)))
        if b >= 4:  # residuals about each block's least-squares line, all blocks at once
            _, r = stats.least_squares(t, rows)
            within.extend(np.sqrt((r**2).sum(axis=1) / (b - 2)))
    a = stats.mad_sigma(second, 0.0) / math.sqrt(6) if len(second) >= 3 else 0.0  # the second differences, about 0
    w = float(np.median(within)) * math.sqrt(max(tau, 1.0) / b) if within else 0.0
    return max(a, w)


# ------------------------------------------------------------------------------------- the plan


@dataclass
class Plan:
    """The blocks the run will be compared over, with their baseline, spread and boundary."""

    blocks: list[np.ndarray]  # the steps of each block
    base: list[np.ndarray]  # the baselines' mean loss at those steps
    m: list[int]  # baseline curves behind each block
    sd: np.ndarray  # sd of each block's gap under the null
    rho: np.ndarray  # the offset's share of it
    h: float
    alpha: float
    persist: int
    noise: Noise
    interval: int  # steps between compared points

    @property
    def bounds(self) -> np.ndarray:
        return self.h * self.sd

    @property
    def block_noise(self) -> float:
        """The sd of a block's gap about the run's own level: the run's block noise and the baselines'."""
        return self.noise.block * math.sqrt(1.0 + 1.0 / min(self.m)) if self.m else 0.0

    def describe(self) -> dict:
        return {"blocks": len(self.blocks), "block_points": self.noise.block_points, "interval_steps": self.interval,
                "first_step": int(self.blocks[0][0]) if self.blocks else None,
                "last_step": int(self.blocks[-1][-1]) if self.blocks else None,
                "h": self.h, "alpha": self.alpha, "persist": self.persist,
                "alarm_gap_nats": [float(self.bounds.min()), float(self.bounds.max())] if self.blocks else None,
                "block_noise_nats": self.block_noise}


@dataclass(frozen=True)
class Design:
    """What a plan is asked for (``plan``), besides the curves and where the comparison starts."""

    min_block: int  # the shortest block, in logged points (the watch: the guard's window)
    alpha: float = ALPHA  # the false-alarm chance over all of the blocks, both sides together
    persist: int = PERSIST  # consecutive blocks beyond the boundary that make an alarm
    sigma_m: float | None = None  # the guard's seed-to-seed spread (the profile); None where it is not known
    sigma_dof: int | None = None  # its degrees of freedom (the profile's seeds - 1; None: the within-run error decided)
    rate: float | None = None  # the drift (nats per step, either sign) the block length is tuned for


def plan(baselines: Sequence[Curve], run_steps: np.ndarray, start_step: int, design: Design) -> Plan:
    """The comparison grid (the baselines' steps the run logs too, from ``start_step``), the noise
    measured on the baselines there, and the boundary for ``design.alpha`` over all of its blocks.

    ``run_steps``: the run's first logged steps (at least two): its logging interval picks the grid.
    ``design.rate``: the drift the design is tuned for, e.g. 1 T per the guard's horizon: the block length
    is the one (from twice ``tau`` to 2 x persist blocks) whose stated delay for it (``delay_steps``) is
    shortest: longer blocks average more noise away, but an alarm waits ``persist`` of them. Without it,
    blocks are lengthened while their own noise exceeds the offset's. Either way the false-alarm chance is
    ``alpha``: the boundary is computed for the blocks chosen."""
    grid = _grid(baselines, run_steps, start_step)
    if not len(grid) and len(_grid(baselines, run_steps[:1], start_step)):
        shown = ", ".join(map(str, run_steps[:4]))
        raise DriftInputError(f"steps do not line up: the run logs steps {shown} ...; the baseline logs none of "
                              f"them from step {start_step} on")
    interval = logging_interval(run_steps)
    values = [c.at(grid) for c in baselines]
    full = [v[~np.isnan(v)] for v in values]
    tau = curve_tau(full)
    b = max(design.min_block, math.ceil(2 * tau))
    cap = len(grid) // (2 * design.persist)  # at least 2 x persist blocks are kept

    def built(b: int) -> Plan:
        return _build(values, grid, _measure(values, full, b, tau, design, len(grid), start_step), design, interval)

    first = built(b)
    if rate := design.rate:
        # Chosen on the noise measured at the shortest length, scaled (block means of independent
        # stretches: sd_block x sqrt(b / x)), then measured at the length chosen: choosing on each
        # length's own estimate would favour the length whose noise happens to read low.
        n = first.noise
        lengths = sorted({b, *(round(b * 1.5**j) for j in range(1, 40) if b * 1.5**j <= cap)})
        scaled = {x: _build(values, grid, replace(n, block=n.block * math.sqrt(b / x), block_points=x), design,
                            interval) for x in lengths}
        best = min(lengths, key=lambda x: delay_steps(scaled[x], rate))
        return first if best == b else built(best)
    # Longer blocks while a block's own noise exceeds the offset's: averaging pays until the offset, which
    # no block length removes, dominates.
    n = first.noise
    longer = min(math.ceil(b * (n.block / n.offset) ** 2) if n.offset > 0 else b, cap)
    return built(longer) if longer > b else first


def _build(values: list[np.ndarray], grid: np.ndarray, noise: Noise, design: Design, interval: int) -> Plan:
    """The plan for blocks of ``noise.block_points`` points, with that noise: each block's baseline, the gap's
    sd and the boundary."""
    b, offset, block = noise.block_points, noise.offset, noise.block
    nb = len(grid) // b
    blocks, base, ms = [], [], []
    for k in range(nb):
        cols = np.stack([v[k * b:(k + 1) * b] for v in values])
        m = int(np.min(np.sum(~np.isnan(cols), axis=0)))
        if m == 0:
            break
        blocks.append(grid[k * b:(k + 1) * b])
        base.append(np.nanmean(cols, axis=0))
        ms.append(m)
    inv = 1.0 + 1.0 / np.asarray(ms, dtype=float)  # the run's own part, and the baseline mean's
    var_o, var_b = offset**2 * inv, block**2 * inv
    sd = np.sqrt(var_o + var_b)
    rho = np.divide(var_o, sd**2, out=np.zeros_like(sd), where=sd > 0)
    if not np.all(sd > 0):
        raise DriftInputError("the baseline curves show no noise at all (identical, constant losses): "
                              "nothing to judge a gap by")
    a, persist = design.alpha, design.persist
    return Plan(blocks, base, ms, sd, rho, boundary(a, rho, persist, noise.dof), a, persist, noise, interval)


def _measure(values: list[np.ndarray], full: list[np.ndarray], b: int, tau: float, design: Design, n: int,
             start_step: int) -> Noise:
    """The null's noise for blocks of ``b`` points: the block noise and the offset's sd, its source and degrees
    of freedom."""
    if n // b < design.persist:
        raise DriftInputError(f"the baseline covers {n} comparable logged steps from step {start_step}: "
                              f"fewer than {design.persist} blocks of {b} (twice the loss's autocorrelation time, "
                              "at least the guard's window); give a longer baseline run")
    block = block_scatter(full, b, tau)
    offset, source, dof = _offset(values, b, n // b, design.sigma_m, design.sigma_dof)
    return Noise(offset, source, dof, block, tau, b)


def logging_interval(run_steps: np.ndarray) -> int:
    """Steps between a run's logged points: the smallest step between the ones given (its first ones), 1 where
    fewer than two are given. The one reading of it: the grid's stride and the plan's ``interval`` here, the
    block length the watch derives from the guard's window (speed/watch.py)."""
    return int(np.min(np.diff(run_steps))) if len(run_steps) > 1 else 1


def _grid(baselines: Sequence[Curve], run_steps: np.ndarray, start_step: int) -> np.ndarray:
    steps = np.unique(np.concatenate([c.steps for c in baselines])) if baselines else np.empty(0, int)
    if len(run_steps) >= 2:
        steps = steps[(steps - run_steps[0]) % max(logging_interval(run_steps), 1) == 0]
    return steps[steps >= start_step]


def _offset(values: list[np.ndarray], b: int, nb: int, sigma_m: float | None,
            sigma_dof: int | None) -> tuple[float, str, int | None]:
    """The offset's sd and its degrees of freedom: the guard's sigma_M, or the baselines' own spread
    where several curves are given and it is larger.

    The spread is that of the curves' levels: each curve's mean deviation from the curves' mean over
    the blocks (the block noise averages out of it, to sd_block / sqrt(blocks)). A new run's level
    from the mean of m curves, over this spread, is exactly Student's t on m - 1 degrees of freedom
    (normal noise); no block noise is subtracted from it, so it never reads 0 by chance where the
    block noise is as large as the offset (a spread of block means less the block noise did, in about
    one run in ten with 3 curves, and spent twice alpha on the two-sided test)."""
    spread = None
    if len(values) >= 2:
        means = np.full((len(values), nb), np.nan)
        for j, v in enumerate(values):
            for k in range(nb):
                part = v[k * b:(k + 1) * b]
                if not np.all(np.isnan(part)):
                    means[j, k] = np.nanmean(part)
        shared = np.sum(~np.isnan(means), axis=0) >= 2
        if shared.any():
            dev = means[:, shared] - np.nanmean(means[:, shared], axis=0)  # the trend cancels, block by block
            levels = np.array([np.nanmean(row) for row in dev if not np.all(np.isnan(row))])
            if len(levels) >= 2:
                spread = float(np.sqrt(np.sum(levels**2) / (len(levels) - 1)))
    if sigma_m is None and spread is None:
        raise DriftInputError("no seed-to-seed spread to judge a gap by: the campaign folder holds no baseline "
                              "profile and one baseline run was given; give two or more baseline runs (--baseline "
                              "A --baseline B), or the campaign folder whose baseline_profile.json the guard wrote")
    if spread is not None and (sigma_m is None or spread > sigma_m):
        return spread, f"the {len(values)} baseline curves' spread of levels", len(values) - 1
    return float(sigma_m), "the guard's seed-to-seed spread of the loss measure (sigma_M, the profile)", sigma_dof


def delay_steps(plan: Plan, drift_per_step: float, offset: float = 0.0) -> float:
    """Steps from a drift's start until an alarm: the gap, from ``offset``, reaches the boundary on the
    drift's side plus one sd of a block's own noise (a block that reads one sd short does not count),
    then ``persist`` blocks beyond it. What the docs state; the tests hold real and fixture runs to it."""
    if drift_per_step == 0:
        return math.inf
    toward = offset if drift_per_step > 0 else -offset  # the gap's level before, measured toward the drift's side
    reach = float(np.max(plan.bounds)) + plan.block_noise - toward
    return max(reach, 0.0) / abs(drift_per_step) + plan.persist * plan.noise.block_points * plan.interval
