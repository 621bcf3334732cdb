import numpy as np
import pytest

from recipetune.trainer.noise_scale import NoiseScaleTracker, from_micro_batches, two_batch_estimates


@pytest.fixture(scope="module")
def per_sample() -> tuple[np.ndarray, float, float]:
    """Per-sample gradients of 0.5 (x.w - y)^2 at a fixed w, and the true |G|^2 and tr(Sigma)."""
    rng = np.random.default_rng(0)
    n, d = 2000, 10
    x = rng.normal(size=(n, d))
    w_star = rng.normal(size=d)
    y = x @ w_star + rng.normal(size=n)
    w = w_star + 0.3 * rng.normal(size=d)
    grads = (x @ w - y)[:, None] * x
    mean = grads.mean(axis=0)
    return grads, float(mean @ mean), float(((grads - mean) ** 2).sum(axis=1).mean())


def _sq_norms(grads: np.ndarray, rng: np.random.Generator, draws: int, batch: int) -> np.ndarray:
    means = grads[rng.integers(0, len(grads), size=(draws, batch))].mean(axis=1)
    return (means**2).sum(axis=1)


def test_two_batch_estimates_are_unbiased(per_sample: tuple[np.ndarray, float, float]) -> None:
    grads, g2, trace = per_sample
    rng = np.random.default_rng(1)
    small, big = _sq_norms(grads, rng, 20000, 8), _sq_norms(grads, rng, 20000, 128)
    est = np.array([two_batch_estimates(s, b, 8, 128) for s, b in zip(small, big, strict=True)])
    assert est[:, 0].mean() == pytest.approx(g2, rel=0.02)
    assert est[:, 1].mean() == pytest.approx(trace, rel=0.04)


def test_two_batch_estimates_exact_on_expectations() -> None:
    # Feeding E|G_B|^2 = g2 + trace/B returns g2 and trace exactly.
    g2, trace = 2.0, 50.0
    est = two_batch_estimates(g2 + trace / 4, g2 + trace / 64, 4, 64)
    assert est == pytest.approx((g2, trace), rel=1e-12)
    with pytest.raises(ValueError, match="b_small < b_big"):
        two_batch_estimates(1.0, 1.0, 64, 64)


def test_tracker_recovers_b_simple(per_sample: tuple[np.ndarray, float, float]) -> None:
    grads, g2, trace = per_sample
    rng = np.random.default_rng(2)
    small, big = _sq_norms(grads, rng, 3000, 8), _sq_norms(grads, rng, 3000, 128)
    tracker = NoiseScaleTracker(ema=0.999)
    assert tracker.b_simple is None
    for s, b in zip(small, big, strict=True):
        estimate = tracker.update(s, b, 8, 128)
    assert estimate == pytest.approx(trace / g2, rel=0.12)
    # Bias correction makes the averages themselves usable, not only their ratio.
    assert tracker.trace == pytest.approx(trace, rel=0.12)


def test_from_micro_batches_matches_truth(per_sample: tuple[np.ndarray, float, float]) -> None:
    grads, g2, trace = per_sample
    rng = np.random.default_rng(3)
    mbs, n_micro = 8, 16
    tracker = NoiseScaleTracker(ema=0.999)
    for _ in range(3000):
        micro = grads[rng.integers(0, len(grads), size=(n_micro, mbs))].mean(axis=1)
        total = micro.mean(axis=0)
        est = from_micro_batches(list((micro**2).sum(axis=1)), float(total @ total), mbs, n_micro)
        tracker.update_estimates(*est)
    assert tracker.b_simple == pytest.approx(trace / g2, rel=0.12)
    with pytest.raises(ValueError, match="n_micro"):
        from_micro_batches([1.0, 2.0], 1.0, 8, 3)


def test_tracker_resume_and_guards() -> None:
    pairs = [(3.0, 1.2), (2.5, 1.1), (3.3, 1.0), (2.9, 1.3)]
    whole = NoiseScaleTracker(0.9)
    for s, b in pairs:
        whole.update(s, b, 4, 32)
    first = NoiseScaleTracker(0.9)
    for s, b in pairs[:2]:
        first.update(s, b, 4, 32)
    resumed = NoiseScaleTracker()
    resumed.load_state_dict(first.state_dict())
    for s, b in pairs[2:]:
        last = resumed.update(s, b, 4, 32)
    assert last == pytest.approx(whole.b_simple)
    # B_big |G_big|^2 < B_small |G_small|^2 makes the g2 average negative: no noise scale to report.
    assert NoiseScaleTracker().update(100.0, 1.0, 4, 32) is None
    with pytest.raises(ValueError, match="ema"):
        NoiseScaleTracker(1.0)
