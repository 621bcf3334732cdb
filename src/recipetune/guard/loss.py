"""The loss measure M of a run and the tolerance T on it (docs/guard.md, "The standard of proof").

M is the mean logged training loss over the records in the last ``parity.tail`` share of the run's
tokens (equal-token windows: a recipe that logs more often or trains more tokens per step is compared
on the same data volume), or the validation loss at the run's last step where independent repeats
make its noise measurable. T is a multiple of the baseline's own seed-to-seed standard deviation of
M: what the initial recipe itself shows. Both the profile and the parity test compute them here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from recipetune.core import stats
from recipetune.core.measure import RunResult, StepRecord
from recipetune.guard.config import ParitySettings

MIN_TAIL = 10  # fewer logged losses than this in a compared tail: too short to tell


def tokens(run: RunResult) -> np.ndarray:
    """Cumulative tokens at each logged step."""
    return np.cumsum([s.tokens for s in run.steps], dtype=float)


def tail(run: RunResult, total: float, share: float) -> list[StepRecord]:
    """Records whose cumulative token count lies in the last ``share`` of ``total`` tokens."""
    return [s for s, k in zip(run.steps, tokens(run), strict=True) if (1 - share) * total < k <= total * (1 + 1e-9)]


def has_final_val(run: RunResult) -> bool:
    return bool(run.evals and run.steps and run.evals[-1].step == run.steps[-1].step)


def independent_repeats(seeds: Sequence[int | None], runs: Sequence[RunResult]) -> bool:
    """Whether the baseline's repeats are independent samples: distinct seeds, or a trainer without a
    seed knob whose repeats differ (it seeds itself); identical repeats are one sample, and so are
    repeats that differ by float noise only (``replicas``)."""
    if seeds and seeds[0] is not None:
        return len(set(seeds)) > 1
    return len(runs) > 1 and any(not replicas(runs[0], r) for r in runs[1:])


REPLICA_RATIO = 0.5  # independent runs differ step by step by ~1.4x the step noise; float noise by ~0


def replicas(a: RunResult, b: RunResult) -> bool:
    """Two runs of one recipe that trained on the same batches: over the second half of the steps both
    logged, their losses differ step by step by less than ``REPLICA_RATIO`` x the logged loss's
    step-to-step noise. A constant seed replays the batches; a GPU's nondeterministic kernels then move
    the losses by far less than another batch does, and such repeats are no more a sample than
    identical ones (run on other batches, two runs differ by about sqrt(2) x that noise)."""
    la, lb = {s.step: s.loss for s in a.steps}, {s.step: s.loss for s in b.steps}
    common = sorted(la.keys() & lb.keys())
    if la == lb:
        return True
    late = common[len(common) // 2:]
    if len(late) < 3:
        return False
    gap = float(np.sqrt(np.mean([(lb[t] - la[t]) ** 2 for t in late])))
    return gap < REPLICA_RATIO * stats.step_noise([la[t] for t in late])


def tail_measure(base: RunResult, cand: RunResult, total: float, share: float) -> tuple[float, float, float, int]:
    """(baseline M, candidate M, se of their difference, fewest records in a tail).

    Where both runs logged the same steps, the difference is taken step by step and its error comes
    from the difference series: when the batches were the same, batch difficulty cancels and the error
    is tiny; when they were not, the series carries both runs' noise and its error says so (valid either
    way). Otherwise (other logging steps, or equal tokens over other step sizes) each tail's error, in
    quadrature."""
    bt, ct = tail(base, total, share), tail(cand, total, share)
    shortest = min(len(bt), len(ct))
    b, c = {s.step: s.loss for s in bt}, {s.step: s.loss for s in ct}
    common = sorted(b.keys() & c.keys())
    if len(common) >= MIN_TAIL and len(common) >= 0.8 * max(len(bt), len(ct)):
        d = stats.mean_with_error([c[t] - b[t] for t in common])
        bm = float(np.mean([b[t] for t in common]))
        return bm, bm + d.mean, d.se, shortest
    eb, ec = stats.mean_with_error([s.loss for s in bt]), stats.mean_with_error([s.loss for s in ct])
    return eb.mean, ec.mean, float(math.hypot(eb.se, ec.se)), shortest


def tolerance(runs: Sequence[RunResult], settings: ParitySettings, use_val: bool, total: float | None,
              independent: bool) -> tuple[float, float, str]:
    """(T, sigma, how): T = parity.tolerance x sigma, the baseline's own seed-to-seed standard deviation
    of M over ``runs`` (cut at ``total`` tokens), at least parity.floor; parity.margin states T instead.

    For the training-loss measure sigma is the larger of the seeds' sample standard deviation and the
    runs' within-run standard error of M, the part of the variation that sampling within a run alone
    causes (the whole cannot be smaller): it keeps three unluckily close seeds from making T too tight.
    Without independent repeats the within-run error is all there is."""
    if use_val:
        vals = [r.evals[-1].val_loss for r in runs if has_final_val(r)]
        sigma = stats.sample_std(vals)
        how = f"seed-to-seed std of the baseline's final validation loss ({len(vals)} seeds)"
    else:
        ests = []
        for r in runs:
            cut = min(total, tokens(r)[-1]) if total is not None else tokens(r)[-1]
            ests.append(stats.mean_with_error([s.loss for s in tail(r, cut, settings.tail)]))
        within = float(np.sqrt(np.mean([e.se**2 for e in ests if math.isfinite(e.se)] or [0.0])))
        seeds = stats.sample_std([e.mean for e in ests]) if independent and len(ests) > 1 else 0.0
        sigma = max(seeds, within)
        if seeds >= within:
            how = f"seed-to-seed std of the baseline's training-loss measure ({len(ests)} seeds)"
        else:
            how = "within-run standard error of the baseline's training-loss measure" + (
                f" (its {len(ests)} seeds' std is {seeds:.4f})" if seeds else "")
    if settings.margin is not None:
        return settings.margin, sigma, "guard.parity.margin"
    return max(settings.floor, settings.tolerance * sigma), sigma, how
