"""The guard's statistics on synthetic data: no training runs, every property could fail."""

from __future__ import annotations

import math

import numpy as np
import pytest

from recipetune.core import stats


def test_smooth_is_a_trailing_mean_over_full_windows():
    assert stats.smooth([1, 2, 3, 4], 2).tolist() == [1.5, 2.5, 3.5]
    assert stats.smooth([1, 2, 3], 10).tolist() == [2.0]  # shorter than the window: one mean


def test_mad_sigma_is_a_normal_sd_that_an_outlier_does_not_move():
    assert stats.mad_sigma([1.0, 2.0, 3.0, 100.0], 2.5) == 1.4826 * 1.0  # |deviations| 1.5, 0.5, 0.5, 97.5
    x = np.random.default_rng(0).normal(0, 2.0, 20_000)
    assert abs(stats.mad_sigma(x, 0.0) - 2.0) < 0.05


def test_equivalence_needs_the_bounds_inside_t_and_the_power_to_resolve_it():
    same = stats.equivalence([0.0, 0.001, -0.001], [0.002] * 3, tolerance=0.02, level=0.05)
    assert same.outcome == "equivalent" and same.detectable <= 0.02
    # the bounds lie inside +-T, but these runs could not have seen a difference of T: not shown
    weak = stats.equivalence([0.0], [0.009], tolerance=0.02, level=0.05)
    assert weak.low > -0.02 and weak.high < 0.02 and weak.detectable > 0.02 and weak.outcome == "inconclusive"


def test_equivalence_is_two_sided_for_a_speed_change_and_one_sided_at_equal_tokens():
    lower = stats.equivalence([-0.05, -0.052, -0.049], [0.002] * 3, tolerance=0.02, level=0.05)
    assert lower.outcome == "different"  # markedly lower is a departure too
    assert stats.equivalence([-0.05, -0.052, -0.049], [0.002] * 3, 0.02, 0.05, two_sided=False).outcome == "equivalent"
    worse = stats.equivalence([0.05, 0.052, 0.049], [0.002] * 3, tolerance=0.02, level=0.05)
    assert worse.outcome == "different" and worse.low > 0.02
    noisy = stats.equivalence([0.05, -0.01, 0.03], [0.03] * 3, tolerance=0.02, level=0.05)
    assert noisy.outcome == "inconclusive"  # neither inside nor shown outside


def test_equivalence_counts_the_pairs_scatter_and_the_look_level():
    tight = stats.equivalence([0.01, -0.01, 0.012, -0.011], [0.001] * 4, tolerance=0.05, level=0.05)
    assert "scatter" in tight.source and tight.se > 0.001 / 2
    one, stricter = (stats.equivalence([0.0], [0.004], 0.05, level) for level in (0.05, 0.01))
    assert stricter.quantile > one.quantile and stricter.detectable > one.detectable
    val = stats.equivalence([0.01, 0.0, 0.005], None, tolerance=0.05, level=0.05)
    assert "Student" in val.source  # one value per run: the scatter alone, with t
    assert stats.equivalence([0.01], None, 0.05, 0.05).outcome == "inconclusive"  # no measurable noise


@pytest.mark.parametrize("effect, two_sided", [(1.0, True), (-1.0, True), (1.0, False)])
def test_equivalence_at_the_boundary_approves_at_most_alpha(effect, two_sided):
    # A candidate whose true difference is exactly T, measured with se = T / 3 (runs that resolve T):
    # the rule may approve it in at most alpha of the repetitions, whatever the seeds' noise.
    rng = np.random.default_rng(0)
    T, se, n = 0.02, 0.02 / 3, 3
    approved = 0
    for _ in range(2000):
        d = rng.normal(effect * T, se * math.sqrt(n), n)
        approved += stats.equivalence(d, [se * math.sqrt(n)] * n, T, 0.05, two_sided=two_sided).outcome == "equivalent"
    assert approved / 2000 <= 0.05
    # ... and a 2T effect is shown different most of the time, never approved
    outcomes = [stats.equivalence(rng.normal(2 * effect * T, se * math.sqrt(n), n), [se * math.sqrt(n)] * n, T, 0.05,
                                  two_sided=two_sided).outcome for _ in range(500)]
    assert "equivalent" not in outcomes and outcomes.count("different") > 250


def test_speedup_ci_brackets_a_clear_gain_and_is_a_point_for_identical_pairs():
    ci = stats.speedup_ci(np.log([1.30, 1.32, 1.28, 1.31, 1.29]))
    assert 1.28 <= ci.low < ci.speedup < ci.high <= 1.32
    flat = stats.speedup_ci([0.0, 0.0, 0.0])
    assert (flat.low, flat.high, flat.method) == (1.0, 1.0, "point")


def test_two_pairs_that_agree_by_chance_do_not_make_a_narrow_interval():
    # Measured here under load: an A/A verdict of 2 pairs read 1.018x and 1.027x. A bootstrap of two
    # points gave [1.018, 1.027] and approved; Student's t with one degree of freedom spans 1.
    ci = stats.speedup_ci(np.log([1.018, 1.027]))
    assert ci.method.startswith("Student t") and ci.low < 1.0 < ci.high
    assert not stats.clears(ci, 0.01)


def test_from_ten_pairs_on_the_interval_is_a_bootstrap():
    x = np.log([1.1, 0.95, 1.2, 1.02, 0.99, 1.05, 1.0, 0.97, 1.08, 1.03])
    assert stats.speedup_ci(x).method in ("BCa", "percentile")


def test_speedup_ci_is_seeded():
    x = np.log([1.1, 0.95, 1.2, 1.02, 0.99, 1.05, 1.0, 0.97, 1.08, 1.03])
    assert stats.speedup_ci(x) == stats.speedup_ci(x)


def test_noise_margin_is_the_aa_spread_with_a_floor():
    assert stats.noise_margin([], 0.01) == 0.01
    assert stats.noise_margin([0.05, -0.05], 0.01) == pytest.approx(math.expm1(0.05))


def simulate(true_speedup: float, noise: float, n: int, pairs: int = 5, prior: int = 2, seed: int = 0) -> float:
    """Share of simulated interleaved experiments approved as faster, with the default decision rule:
    lognormal run-to-run noise, A/A margin from the baseline repeats (2 from a profile of 3 seeds, and
    the consecutive baseline runs of the pairs), the 95% CI of the speed-up (Student's t for 5 pairs)."""
    rng = np.random.default_rng(seed)
    approved = 0
    for _ in range(n):
        profile = rng.normal(0, noise, prior + 1)
        a = rng.normal(0, noise, pairs)
        b = rng.normal(math.log(true_speedup), noise, pairs)
        aa = [*np.diff(profile), *np.diff(a)]
        ci = stats.speedup_ci(b - a, 0.95, n_resamples=1000)
        approved += stats.clears(ci, stats.noise_margin(aa, 0.01))
    return approved / n


def test_aa_false_approval_rate_is_at_most_5_percent_in_simulation():
    assert simulate(1.0, noise=0.03, n=300) <= 0.05


def test_a_real_gain_well_above_noise_is_approved_in_simulation():
    assert simulate(1.25, noise=0.03, n=100) >= 0.95


def test_smallest_approvable_speedup_is_the_edge_of_what_the_pairs_approve():
    spread = np.array([0.02, -0.01, 0.0, 0.015, -0.025])  # the pairs' scatter about their mean
    edge = stats.smallest_approvable(spread, 0.95, 0.03)
    assert edge is not None and edge > 1.03
    for factor, approved in ((1.001, True), (0.999, False)):
        ratios = spread - spread.mean() + math.log(edge * factor)  # the same scatter, centred just above/below
        assert stats.clears(stats.speedup_ci(ratios, 0.95), 0.03) is approved
    assert stats.smallest_approvable([0.1], 0.95, 0.03) is None


def test_a_few_pairs_that_agree_by_chance_are_judged_by_the_aa_spread_too():
    # An A/A verdict at load 10 (the nanoGPT fixture): three pairs read 1.361x, 1.363x and 1.430x
    # while the baseline's own consecutive runs moved by 23% (RMS of its A/A log ratios). The pairs'
    # scatter alone gave [1.29, 1.49] and cleared the 25.9% margin: an A/A approved.
    ratios = [math.log(1.361), math.log(1.363), math.log(1.430)]
    busy = [0.31, -0.22, 0.19, -0.18]
    margin = stats.noise_margin(busy, 0.0)
    assert stats.speedup_ci(ratios, 0.95).low > 1 + margin  # what the pairs alone said
    ci = stats.speedup_ci(ratios, 0.95, aa_log_ratios=busy)
    assert not stats.clears(ci, margin) and "pooled with 4 A/A" in ci.method
    assert stats.smallest_approvable(ratios, 0.95, margin, busy) > 1.43
    # the same pairs on a quiet machine (A/A within 2%): a real 1.38x gain is still approved
    quiet = [0.012, -0.018, 0.009, -0.015]
    ci = stats.speedup_ci(ratios, 0.95, aa_log_ratios=quiet)
    assert stats.clears(ci, stats.noise_margin(quiet, 0.02)) and ci.method == "Student t (3 pairs)"


def test_the_fast_normal_and_student_functions_give_scipy_stats_bits():
    # core/stats.py calls scipy.special directly (the guard's design calls them thousands of times per
    # verdict): the same values as scipy.stats, bit for bit, so no verdict or stored tree moves
    from scipy import stats as sps

    rng = np.random.default_rng(0)
    x, q = rng.normal(0.0, 4.0, 2000), rng.uniform(0.0, 1.0, 2000)
    assert np.array_equal(stats.norm_sf(x), sps.norm.sf(x)) and np.array_equal(stats.norm_cdf(x), sps.norm.cdf(x))
    assert np.array_equal(stats.norm_pdf(x), sps.norm.pdf(x)) and np.array_equal(stats.norm_isf(q), sps.norm.isf(q))
    for df in (None, 1, 2, 4, 11, 47):
        for level in (1e-5, 0.004, 0.025, 0.05, 0.4):
            want = sps.norm.isf(level) if df is None else sps.t.isf(level, df)
            assert stats.quantile(level, df) == float(want)
    assert stats.quantile(0.0, 3) == math.inf and float(stats.norm_isf(0.0)) == math.inf


def test_one_line_fit_gives_the_slope_its_error_and_the_residuals_mean_with_error_uses():
    rng = np.random.default_rng(3)
    x = np.arange(300, dtype=float)
    y = 2.5 - 0.004 * x + rng.normal(0, 0.05, 300)
    fit = stats.line_fit(x, y)
    assert abs(fit.slope + 0.004) < 3 * fit.se and fit.se < 1e-4
    assert math.sqrt(fit.var) == pytest.approx(0.05, rel=0.15) and fit.tau >= 1.0
    m = stats.mean_with_error(y)  # the series' own line: the same residuals
    assert m.sigma == pytest.approx(math.sqrt(fit.var), rel=1e-12) and m.tau == pytest.approx(fit.tau, rel=1e-12)
    # rows of series over the same x, each fitted on its own (a drift monitor's blocks)
    rows = np.stack([y[:100], y[100:200], y[200:]])
    slopes, residuals = stats.least_squares(x[:100], rows)
    for row, slope, r in zip(rows, slopes, residuals, strict=True):
        one, r1 = stats.least_squares(x[:100], row)
        assert slope == pytest.approx(one, rel=1e-12) and r == pytest.approx(r1, abs=1e-12)
    assert np.polyfit(x, y, 1)[0] == pytest.approx(fit.slope, rel=1e-9)
