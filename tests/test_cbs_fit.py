import json
from pathlib import Path

import numpy as np
import pytest
from scipy.optimize import brentq, curve_fit
from typer.testing import CliRunner

from recipetune.cbs.cli import cbs_app
from recipetune.cbs.fit import (
    PAPER_DATA_EXPONENT,
    critical_batch_size,
    critical_batch_size_ci,
    default_b_opt,
    fit_power_law,
    fit_steps_vs_batch,
)

A, B = 200.0, 3.2e5
GRID = np.geomspace(8, 2048, 9)


def _steps(noise: float, seed: int = 0, a: float = A, b: float = B) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (a + b / GRID) * (1 + noise * rng.normal(size=GRID.size))


def test_noiseless_fit_is_exact() -> None:
    fit = fit_steps_vs_batch(GRID, _steps(0.0))
    assert (fit.a, fit.b) == pytest.approx((A, B), rel=1e-9)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.predict(100.0) == pytest.approx(A + B / 100)


def test_noisy_fit_recovers_parameters_within_covariance() -> None:
    fit = fit_steps_vs_batch(GRID, _steps(0.02))
    assert fit.a == pytest.approx(A, rel=0.1)
    assert fit.b == pytest.approx(B, rel=0.1)
    assert abs(fit.a - A) < 4 * fit.a_se
    assert abs(fit.b - B) < 4 * fit.b_se
    assert fit.n == GRID.size and fit.r2 > 0.99
    lo, hi = critical_batch_size_ci(fit, default_b_opt(GRID))
    assert lo < critical_batch_size(A, B, 8.0) < hi


def test_weighted_fit_matches_curve_fit() -> None:
    steps = _steps(0.02)
    weights = 1.0 / steps**2
    fit = fit_steps_vs_batch(GRID, steps, weights=weights)
    params, cov = curve_fit(lambda b, a, bb: a + bb / b, GRID, steps, p0=[100, 1e5], sigma=weights**-0.5)
    assert (fit.a, fit.b) == pytest.approx(tuple(params), rel=1e-6)
    np.testing.assert_allclose(fit.cov, cov, rtol=1e-5)
    uniform = fit_steps_vs_batch(GRID, steps, weights=np.ones_like(steps))
    assert uniform.a != pytest.approx(fit.a, rel=1e-6)


@pytest.mark.parametrize(
    ("batch", "steps", "match"),
    [
        ([8, 16, 16], [10, 5, 5], "3 distinct"),
        ([8, 16, 32], [10, -5, 2], "steps must be positive"),
        ([8, 0, 32], [10, 5, 2], "batch_sizes must be positive"),
        ([8, 16, 32], [10, 5], "differ in length"),
        ([8, 16, np.nan], [10, 5, 2], "non-finite"),
    ],
)
def test_fit_rejects_bad_input(batch: list[float], steps: list[float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        fit_steps_vs_batch(batch, steps)


def solve_critical_batch_size(a: float, b: float, b_opt: float) -> float:
    """The closed form's B* found numerically: where S(B) = a + b/B exceeds linear scaling from B_opt by 20%."""
    s_opt = a + b / b_opt

    def excess(batch: float) -> float:
        return a + b / batch - 1.2 * s_opt * b_opt / batch

    # excess(B_opt) = -0.2 S(B_opt) < 0 and excess -> a > 0 as B grows: widen until the sign flips.
    hi = 2.0 * b_opt
    while excess(hi) <= 0:
        hi *= 2.0
    return float(brentq(excess, b_opt, hi, xtol=1e-12, rtol=1e-14, maxiter=500))


@pytest.mark.parametrize(("a", "b", "b_opt"), [(200, 3.2e5, 8), (1.0, 1.0, 1.0), (5e3, 1e4, 256), (50, 1e8, 64)])
def test_closed_form_matches_brentq(a: float, b: float, b_opt: float) -> None:
    closed = critical_batch_size(a, b, b_opt)
    assert closed == pytest.approx(b / (5 * a) + 1.2 * b_opt)
    assert closed == pytest.approx(solve_critical_batch_size(a, b, b_opt), rel=1e-9)


def test_cbs_grows_with_noise_and_guards_saturation() -> None:
    values = [critical_batch_size(A, b, 8) for b in (1e4, 1e5, 1e6)]
    assert values == sorted(values) and len(set(values)) == 3
    with pytest.raises(ValueError, match="unbounded"):
        critical_batch_size(0.0, B, 8)
    with pytest.raises(ValueError, match="no linear regime"):
        critical_batch_size(A, -1.0, 8)


def test_power_law_recovers_exponent() -> None:
    rng = np.random.default_rng(0)
    x = np.geomspace(1e8, 1e10, 8)
    y = 3.0 * x**PAPER_DATA_EXPONENT * np.exp(0.05 * rng.normal(size=x.size))
    fit = fit_power_law(x, y)
    assert fit.exponent == pytest.approx(PAPER_DATA_EXPONENT, abs=0.05)
    assert fit.exponent_ci[0] < PAPER_DATA_EXPONENT < fit.exponent_ci[1]
    assert fit.coef_ci[0] < 3.0 < fit.coef_ci[1]
    two = fit_power_law([1.0, 4.0], [2.0, 4.0])
    assert two.exponent == pytest.approx(0.5) and np.isnan(two.exponent_ci[0]) and two.note
    with pytest.raises(ValueError, match="positive"):
        fit_power_law([1.0, 2.0, 3.0], [1.0, 0.0, 2.0])
    with pytest.raises(ValueError, match="distinct"):
        fit_power_law([2.0, 2.0, 2.0], [1.0, 2.0, 3.0])


def _write_csv(path: Path, with_data: bool) -> Path:
    rows = ["batch_size,steps,data_size" if with_data else "batch_size,steps"]
    for d, scale in ((1e8, 1.0), (4e8, 2.0), (1.6e9, 4.0)) if with_data else ((0, 1.0),):
        for bs, s in zip(GRID, _steps(0.01, b=B * scale), strict=True):
            rows.append(f"{bs:g},{s:.1f},{d:g}" if with_data else f"{bs:g},{s:.1f}")
    rows.append("4096,,1e8" if with_data else "4096,")  # never reached the target
    path.write_text("\n".join(rows) + "\n")
    return path


def test_cli_fit_writes_summary(tmp_path: Path) -> None:
    csv = _write_csv(tmp_path / "sweep.csv", with_data=True)
    result = CliRunner().invoke(cbs_app, ["fit", str(csv)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "sweep-cbs"
    for name in ("summary.json", "summary.md", "steps_vs_batch.png", "scaling.png"):
        assert (out / name).is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert len(summary["groups"]) == 3 and summary["excluded_rows"][0]["line"] == 29
    # b doubles per data-size step of x4: B* ~ D^0.5
    assert summary["scaling"][0]["exponent"] == pytest.approx(0.5, abs=0.05)


def test_cli_fit_single_group_with_b_opt(tmp_path: Path) -> None:
    csv = _write_csv(tmp_path / "one.csv", with_data=False)
    result = CliRunner().invoke(cbs_app, ["fit", str(csv), "--b-opt", "16", "--out", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["groups"][0]["b_opt"] == 16 and not (tmp_path / "o" / "scaling.png").exists()


def test_cli_fit_reports_unbounded_cbs(tmp_path: Path) -> None:
    # Pure b/B (a slightly negative): no saturation in range, so B* is unbounded, not an error.
    csv = tmp_path / "sat.csv"
    csv.write_text("batch_size,steps\n8,1000\n16,498\n32,247\n64,122\n")
    result = CliRunner().invoke(cbs_app, ["fit", str(csv)])
    assert result.exit_code == 0, result.output
    group = json.loads((tmp_path / "sat-cbs" / "summary.json").read_text())["groups"][0]
    assert group["b_star"] is None and group["b_star_unbounded"] and "unbounded" in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("batch_size,data_size\n8,1\n16,1\n32,1\n", "missing column(s) steps"),
        ("batch_size,steps\n8,100\n16,abc\n32,30\n", "line 3, column 'steps'"),
        ("batch_size,steps\n8,100\n16,60\n", "need at least 3"),
    ],
)
def test_cli_fit_bad_input_writes_nothing(tmp_path: Path, text: str, message: str) -> None:
    csv = tmp_path / "bad.csv"
    csv.write_text(text)
    result = CliRunner().invoke(cbs_app, ["fit", str(csv)])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "bad-cbs").exists()


def test_cli_fit_missing_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(cbs_app, ["fit", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2 and "nope.csv: no such file" in result.output
