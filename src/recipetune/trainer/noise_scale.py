"""Gradient noise scale B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, "An Empirical Model of
Large-Batch Training", appendix A).

A mini-batch gradient of size B drawn i.i.d. has E|G_B|^2 = |G|^2 + tr(Sigma)/B, where G is the true
gradient and Sigma the per-sample gradient covariance. Two batch sizes give two equations, hence the
unbiased two-batch estimators below. The training loop gets both sizes for free: a micro-batch gradient
is the small batch and the accumulated (or all-reduced) global gradient is the big one.

Batch sizes count samples (sequences, for a language model); B_simple comes out in the same unit.
Multiply by tokens per sequence for a token count. The per-sample gradients must be means over the
sample's tokens consistently in both batches (mean-reduced losses over equal-sized micro-batches).
"""

from __future__ import annotations

import math


def two_batch_estimates(sq_small: float, sq_big: float, b_small: float, b_big: float) -> tuple[float, float]:
    """Unbiased (|G|^2, tr(Sigma)) from squared gradient norms at batch sizes b_small < b_big.

    Single estimates are noisy and can be negative; average many before taking a ratio.
    """
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g2 = (b_big * sq_big - b_small * sq_small) / (b_big - b_small)
    trace = (sq_small - sq_big) / (1.0 / b_small - 1.0 / b_big)
    return float(g2), float(trace)


def from_micro_batches(
    micro_sq_norms: list[float], mean_sq_norm: float, micro_batch_size: int, n_micro: int
) -> tuple[float, float]:
    """(|G|^2, tr(Sigma)) from one accumulated step.

    micro_sq_norms: |g_k|^2 of each micro-batch gradient (mean loss over micro_batch_size samples);
    mean_sq_norm: |mean_k g_k|^2, the global-batch gradient. B_small = micro_batch_size,
    B_big = micro_batch_size * n_micro. The estimators are linear in |G_small|^2, so averaging the
    micro-batches' squared norms first equals averaging their individual estimates.
    """
    if n_micro < 2:
        raise ValueError(f"need at least 2 micro-batches for two batch sizes, got n_micro={n_micro}")
    if len(micro_sq_norms) != n_micro:
        raise ValueError(f"got {len(micro_sq_norms)} micro-batch norms for n_micro={n_micro}")
    sq_small = math.fsum(micro_sq_norms) / n_micro
    return two_batch_estimates(sq_small, mean_sq_norm, micro_batch_size, micro_batch_size * n_micro)


class NoiseScaleTracker:
    """Exponential moving averages of the two-batch estimates and their ratio B_simple.

    The ratio is taken of the averages, not averaged over ratios, because single estimates are noisy
    and |G|^2 can come out negative. The averages are bias-corrected as in Adam so early values are
    usable (the correction cancels in the ratio but matters for `g2` and `trace`).
    """

    def __init__(self, ema: float = 0.95) -> None:
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"ema must be in [0, 1), got {ema}")
        self.ema = ema
        self._g2 = 0.0
        self._trace = 0.0
        self.steps = 0

    def update(self, sq_small: float, sq_big: float, b_small: float, b_big: float) -> float | None:
        return self.update_estimates(*two_batch_estimates(sq_small, sq_big, b_small, b_big))

    def update_estimates(self, g2: float, trace: float) -> float | None:
        """Feed one (|G|^2, tr(Sigma)) pair, e.g. from `from_micro_batches`; returns B_simple."""
        self._g2 = self.ema * self._g2 + (1.0 - self.ema) * g2
        self._trace = self.ema * self._trace + (1.0 - self.ema) * trace
        self.steps += 1
        return self.b_simple

    def _correction(self) -> float:
        return 1.0 - self.ema**self.steps

    @property
    def g2(self) -> float | None:
        return self._g2 / self._correction() if self.steps else None

    @property
    def trace(self) -> float | None:
        return self._trace / self._correction() if self.steps else None

    @property
    def b_simple(self) -> float | None:
        if self.steps == 0 or self._g2 <= 0:
            return None
        return self._trace / self._g2

    def state_dict(self) -> dict[str, float | int]:
        return {"ema": self.ema, "g2": self._g2, "trace": self._trace, "steps": self.steps}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.ema = float(state["ema"])
        self._g2 = float(state["g2"])
        self._trace = float(state["trace"])
        self.steps = int(state["steps"])
