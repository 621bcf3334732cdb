"""The loss measure M of a run and the tolerance T on it (docs/guard.md, "The standard of proof").

M is the mean logged training loss over the records in the last ``parity.tail`` share of the run's
tokens (equal-token windows: a recipe that logs more often or trains more tokens per step is compared
on the same data volume), or the validation loss at the run's last step where independent repeats
make its noise measurable. T is a multiple of the baseline's own seed-to-seed standard deviation of
M: what the initial recipe itself shows. Both the profile and the parity test compute them here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import NamedTuple

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
    """Whether the baseline's repeats are independent samples: repeats that differ beyond float noise
    (``replicas``), at distinct seeds where the workload has a seed knob (a trainer without one seeds
    itself). Identical repeats are one sample, and so are repeats that differ by float noise only, at
    any seeds: a seed knob the trainer does not read is deaf (``deaf``)."""
    if seeds and seeds[0] is not None and len(set(seeds)) < 2:
        return False
    return len(runs) > 1 and any(not replicas(runs[0], r) for r in runs[1:])


def deaf(seeds: Sequence[int | None], runs: Sequence[RunResult]) -> bool:
    """A declared seed knob the trainer does not read: repeats at distinct seeds that are identical, or
    equal up to float noise (``replicas``), as a seed passed where the trainer never looks gives."""
    return (bool(seeds) and seeds[0] is not None and len(set(seeds)) > 1 and len(runs) > 1
            and not independent_repeats(seeds, runs))


REPLICA_RATIO = 0.5  # independent runs differ step by step by ~1.4x the step noise; float noise by ~0


def replicas(a: RunResult, b: RunResult) -> bool:
    """Two runs of one recipe that trained on the same batches: over the second half of the steps both
    logged, their losses differ step by step by less than ``REPLICA_RATIO`` x the logged loss's
    step-to-step noise. A constant seed replays the batches; a GPU's nondeterministic kernels then move
    the losses by far less than another batch does, and such repeats are no more a sample than
    identical ones (run on other batches, two runs differ by about sqrt(2) x that noise)."""
    return replica_curves({s.step: s.loss for s in a.steps}, {s.step: s.loss for s in b.steps})


def replica_curves(la: Mapping[int, float], lb: Mapping[int, float]) -> bool:
    """``replicas`` on two loss curves, step -> loss (``recipetune watch``'s baselines are curves)."""
    if la == lb:
        return True
    both = matched(la, lb)
    late = both.steps[len(both.steps) // 2:] if both is not None else []
    if len(late) < 3:
        return False
    gap = float(np.sqrt(np.mean([(lb[t] - la[t]) ** 2 for t in late])))
    return gap < REPLICA_RATIO * stats.step_noise([la[t] for t in late])


class Aligned(NamedTuple):
    """The steps two curves (or two tails) both logged, in order, and each one's loss at them."""

    steps: list[int]
    base: np.ndarray
    cand: np.ndarray


def matched(base: Mapping[int, float], cand: Mapping[int, float], least: int = 1) -> Aligned | None:
    """Two loss curves (step -> loss) at the steps both logged, in order; None where fewer than ``least``.
    The one rule that pairs two curves' steps: each caller states how many common steps it needs
    (``aligned``, ``replica_curves``, the parity gap in guard/parity.py, the report's gap plot)."""
    common = sorted(base.keys() & cand.keys())
    if len(common) < least:
        return None
    return Aligned(common, np.array([base[t] for t in common]), np.array([cand[t] for t in common]))


def aligned(bt: Sequence[StepRecord], ct: Sequence[StepRecord]) -> Aligned | None:
    """The two tails step by step, where both logged the same steps: at least ``MIN_TAIL`` common steps and
    80% of the longer tail (then batch difficulty cancels in the difference when the batches were replayed);
    None where they logged other steps, and each tail is read on its own. The one alignment rule of the
    loss measure (``tail_measure``) and the gap's slope (guard/trend.py)."""
    both = matched({s.step: s.loss for s in bt}, {s.step: s.loss for s in ct}, MIN_TAIL)
    return both if both is not None and len(both.steps) >= 0.8 * max(len(bt), len(ct)) else None


class TailMeasure(NamedTuple):
    """The loss measure M of a pair of runs over their tails."""

    base: float  # the baseline's M
    cand: float  # the candidate's M
    se: float  # the standard error of their difference
    shortest: int  # the fewest records in a tail


def tail_measure(base: RunResult, cand: RunResult, total: float, share: float) -> TailMeasure:
    """The pair's M over the last ``share`` of ``total`` tokens.

    Where both runs logged the same steps (``aligned``), the difference is taken step by step and its error
    comes from the difference series: when the batches were the same, batch difficulty cancels and the error
    is tiny; when they were not, the series carries both runs' noise and its error says so (valid either
    way). Otherwise (other logging steps, or equal tokens over other step sizes) each tail's error, in
    quadrature."""
    bt, ct = tail(base, total, share), tail(cand, total, share)
    shortest = min(len(bt), len(ct))
    both = aligned(bt, ct)
    if both is not None:
        d = stats.mean_with_error(both.cand - both.base)
        bm = float(np.mean(both.base))
        return TailMeasure(bm, bm + d.mean, d.se, shortest)
    eb, ec = stats.mean_with_error([s.loss for s in bt]), stats.mean_with_error([s.loss for s in ct])
    return TailMeasure(eb.mean, ec.mean, float(math.hypot(eb.se, ec.se)), shortest)


def tolerance_of(sigma: float, settings: ParitySettings) -> float:
    """T from sigma, the baseline's seed-to-seed standard deviation of M: ``parity.tolerance`` x sigma, at
    least ``parity.floor``; ``parity.margin`` states T instead where set. The one rule: the verdict's T
    (``tolerance``), and wherever T is derived from a spread measured otherwise (watch's fallback)."""
    return settings.margin if settings.margin is not None else max(settings.floor, settings.tolerance * sigma)


MARGIN = "guard.parity.margin"  # how T was set where the campaign states it (the verdict's words)


class ReferenceKind(StrEnum):
    """How sigma, the spread T is a multiple of, was measured: what its law is. The profile stores its value
    (``loss_reference_kind``); ``recipetune watch`` takes the offset's law from it (speed/watch_read.py)."""

    SEEDS = "seeds"  # the sample std of independent repeats' training-loss measure: Student's t on n - 1
    WITHIN_RUN = "within-run"  # the runs' within-run standard error of M, from hundreds of points: known
    VALIDATION_SEEDS = "validation seeds"  # the sample std of independent repeats' final validation loss

    @classmethod
    def read(cls, text: str) -> ReferenceKind:
        """The kind a profile stores; a profile written before the kind was typed holds the words instead
        ("seed-to-seed std of ...", "within-run standard error of ...", or "guard.parity.margin", which
        hid how sigma was measured: read as seeds, the wider law, so a false-alarm chance is never understated).
        ValueError where the text is none of them."""
        if text in cls._value2member_map_:
            return cls(text)
        if text.startswith("seed-to-seed std of the baseline's final validation loss"):
            return cls.VALIDATION_SEEDS
        if text.startswith("seed-to-seed std") or text == MARGIN:
            return cls.SEEDS
        if text.startswith("within-run standard error"):
            return cls.WITHIN_RUN
        raise ValueError(f"{text!r} is not a kind of spread: allowed are {', '.join(k.value for k in cls)}")


class Spread(NamedTuple):
    """sigma, the baseline's seed-to-seed standard deviation of a loss measure, how it was measured, and
    that in words (the verdict's)."""

    sigma: float
    kind: ReferenceKind
    words: str

    def how(self, settings: ParitySettings) -> str:
        """What T rests on, as the verdict says it: the margin where the campaign states T, else these words."""
        return MARGIN if settings.margin is not None else self.words


class Tolerance(NamedTuple):
    """T on a loss measure, the spread it is a multiple of, and how that spread was measured (the profile's)."""

    T: float
    sigma: float
    kind: ReferenceKind  # how sigma was measured, also where guard.parity.margin states T


def spread(runs: Sequence[RunResult], settings: ParitySettings, use_val: bool, total: float | None,
           independent: bool) -> Spread:
    """sigma over ``runs`` (cut at ``total`` tokens): the baseline's own seed-to-seed standard deviation of M.

    For the training-loss measure sigma is the larger of the seeds' sample standard deviation and the
    runs' within-run standard error of M, the part of the variation that sampling within a run alone
    causes (the whole cannot be smaller): it keeps three unluckily close seeds from making T too tight.
    Without independent repeats the within-run error is all there is."""
    if use_val:
        vals = [r.evals[-1].val_loss for r in runs if has_final_val(r)]
        return Spread(stats.sample_std(vals), ReferenceKind.VALIDATION_SEEDS,
                      f"seed-to-seed std of the baseline's final validation loss ({len(vals)} seeds)")
    ests = []
    for r in runs:
        cut = min(total, tokens(r)[-1]) if total is not None else tokens(r)[-1]
        ests.append(stats.mean_with_error([s.loss for s in tail(r, cut, settings.tail)]))
    within = float(np.sqrt(np.mean([e.se**2 for e in ests if math.isfinite(e.se)] or [0.0])))
    seeds = stats.sample_std([e.mean for e in ests]) if independent and len(ests) > 1 else 0.0
    if seeds >= within:
        return Spread(seeds, ReferenceKind.SEEDS,
                      f"seed-to-seed std of the baseline's training-loss measure ({len(ests)} seeds)")
    return Spread(within, ReferenceKind.WITHIN_RUN,
                  "within-run standard error of the baseline's training-loss measure"
                  + (f" (its {len(ests)} seeds' std is {seeds:.4f})" if seeds else ""))


def tolerance(runs: Sequence[RunResult], settings: ParitySettings, use_val: bool, total: float | None,
              independent: bool) -> Tolerance:
    """T on M over ``runs`` (cut at ``total`` tokens), from sigma (``spread``): ``tolerance_of``,
    parity.tolerance x sigma, at least parity.floor, or parity.margin. The kind is how sigma was measured,
    margin or not: a spread measured on three seeds is an estimate whatever T is set to."""
    x = spread(runs, settings, use_val, total, independent)
    return Tolerance(tolerance_of(x.sigma, settings), x.sigma, x.kind)
