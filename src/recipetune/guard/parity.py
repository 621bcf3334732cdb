"""Loss parity: does the candidate still train the model as the baseline does?

Two questions, both answered against the baseline's own variation (the profile):

- Same seed, same data, same steps: the candidate's smoothed loss curve must track the baseline's
  much more closely than a run with another seed does. Numerically different but equivalent
  settings see the same batches and stay close step by step; a change to what is learned (another
  sample order, a lost gradient, a drifting learning rate, stalled updates) moves the curve by
  about as much as another seed, or more.
- Over the seeds: the candidate's final loss is not worse than the baseline's by more than a
  stated margin (a one-sided non-inferiority test).

A semantic knob the campaign allowed to change (e.g. the global batch) alters the trajectory by
design: then only the second question is asked, with the loss compared at equal tokens.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel

from recipetune.guard import stats
from recipetune.guard.baseline import BaselineProfile, final_loss
from recipetune.guard.config import ParitySettings
from recipetune.measure import RunResult
from recipetune.recipe import SPEED


class ParityEvidence(BaseModel):
    mode: Literal["same seed", "equal tokens"]
    passed: bool
    reasons: list[str]
    window: int
    seeds: list[int | None]
    steps_compared: int
    gap: float | None  # RMS of the smoothed paired loss difference, pooled over seeds (nats)
    gaps: list[float]  # the same, per seed
    tolerance: float | None  # the band the gap must stay in (same-seed mode)
    reference: float  # seed-to-seed spread of the baseline's smoothed loss curves (nats)
    reference_kind: str
    tolerance_fraction: float
    final_metric: str
    baseline_finals: list[float]
    candidate_finals: list[float]
    mean_diff: float  # candidate - baseline final loss, averaged over seeds
    margin: float
    p_value: float | None
    alpha: float


def semantic_edits(profile: BaselineProfile, recipe: dict) -> list[str]:
    """Knobs that may change learning and differ from the baseline (the seed aside)."""
    return sorted(name for name, role in profile.roles.items()
                  if role != SPEED and name != "seed" and recipe.get(name) != profile.recipe.get(name))


def _by_step(run: RunResult) -> dict[int, float]:
    return {s.step: s.loss for s in run.steps}


def _tokens(run: RunResult) -> np.ndarray:
    return np.cumsum([s.tokens for s in run.steps], dtype=float)


def compare(
    profile: BaselineProfile, candidates: list[RunResult], settings: ParitySettings, equal_tokens: bool = False
) -> ParityEvidence:
    """Judge candidate runs; ``candidates[i]`` ran with ``profile.seeds[i]``."""
    if not candidates or len(candidates) > len(profile.runs):
        raise ValueError(f"need 1..{len(profile.runs)} candidate runs, one per profiled seed; got {len(candidates)}")
    w = settings.window
    pairs = list(zip(profile.runs, candidates, strict=False))
    diffs: list[np.ndarray] = []
    base_finals: list[float] = []
    cand_finals: list[float] = []
    metric = ""
    n_compared = 0
    for base, cand in pairs:
        if equal_tokens:
            cs, bs = stats.at_equal_tokens(_tokens(cand), cand.losses(), _tokens(base), base.losses(), w)
            if not len(bs):
                raise ValueError("the candidate and baseline runs share no token range")
            diffs.append(cs - bs)
            n_compared = len(bs)
            full = abs(_tokens(cand)[-1] - _tokens(base)[-1]) < base.steps[-1].tokens
            if full and base.evals and cand.evals:
                b_final, metric = final_loss(base, w)
                c_final, _ = final_loss(cand, w)
            else:
                b_final, c_final, metric = float(bs[-1]), float(cs[-1]), f"training loss at equal tokens (window {w})"
        else:
            b, c = _by_step(base), _by_step(cand)
            common = sorted(b.keys() & c.keys())
            if not common:
                raise ValueError("the candidate and baseline runs share no step")
            bl, cl = [b[s] for s in common], [c[s] for s in common]
            diffs.append(stats.smooth(cl, w) - stats.smooth(bl, w))
            n_compared = len(common)
            whole = len(common) == len(base.steps) == len(cand.steps)
            if whole and base.evals and cand.evals:
                b_final, metric = final_loss(base, w)
                c_final, _ = final_loss(cand, w)
            else:
                b_final, c_final = float(stats.smooth(bl, w)[-1]), float(stats.smooth(cl, w)[-1])
                metric = f"training loss at step {common[-1]} (last {w} steps)"
        base_finals.append(b_final)
        cand_finals.append(c_final)

    reference, kind = profile.reference(n_compared if not equal_tokens else None, w)
    if settings.margin is not None:
        margin = settings.margin
    elif metric == profile.final_metric or equal_tokens:
        margin = profile.loss_margin
    else:  # compared earlier than the profile's end: the baseline's spread at that step
        at_end = [float(stats.smooth(r.losses()[:n_compared], w)[-1]) for r in profile.runs]
        margin = max(settings.floor, stats.sample_std(at_end) if kind == "seeds" else reference)
    ni = stats.non_inferiority(cand_finals, base_finals, margin, settings.alpha)
    gaps = [stats.rms(d) for d in diffs]
    gap = stats.rms(np.concatenate(diffs))
    tol = None if equal_tokens else stats.tolerance(reference, settings.tolerance, settings.floor)

    reasons = []
    if tol is not None and gap > tol:
        reasons.append(
            f"the loss curve departs from the baseline's at the same seed and data: smoothed gap {gap:.4f} nats "
            f"> tolerance {tol:.4f} ({settings.tolerance:g} x the baseline's {kind} spread {reference:.4f})"
        )
    if not ni.passed:
        test = f"one-sided p = {ni.p_value:.3g} >= {ni.alpha:g}" if ni.p_value is not None else "single seed"
        reasons.append(
            f"final {metric} is {ni.mean_diff:+.4f} nats vs the baseline over {ni.n} seed(s); not shown to be "
            f"within the margin {margin:.4f} ({test})"
        )
    return ParityEvidence(
        mode="equal tokens" if equal_tokens else "same seed",
        passed=not reasons,
        reasons=reasons,
        window=w,
        seeds=profile.seeds[: len(candidates)],
        steps_compared=n_compared,
        gap=gap,
        gaps=gaps,
        tolerance=tol,
        reference=reference,
        reference_kind=kind,
        tolerance_fraction=settings.tolerance,
        final_metric=metric,
        baseline_finals=base_finals,
        candidate_finals=cand_finals,
        mean_diff=ni.mean_diff,
        margin=margin,
        p_value=ni.p_value,
        alpha=ni.alpha,
    )
