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

Many trainers cannot replay the baseline's batches: nanoGPT draws them from the global RNG, so
another micro-batch size trains on other sequences. Then the same-seed question is meaningless and
the runs are compared as independent samples ("independent runs"): the end-of-run loss, with the
noise of each run estimated from the run itself. Which mode applies is decided first, and said.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel
from scipy import stats as sps

from recipetune.guard import stats
from recipetune.guard.baseline import BaselineProfile, final_loss
from recipetune.guard.config import ParitySettings
from recipetune.measure import RunResult
from recipetune.recipe import SPEED

REPLAY_STEPS = 3  # first logged losses compared to find out whether the candidate saw the same batches
REPLAY_FRACTION = 0.1  # ... they must agree to this fraction of the baseline's step-to-step noise
MIN_TAIL = 10  # fewer logged losses than this in a compared tail: too short to tell


class ParityEvidence(BaseModel):
    mode: Literal["same seed", "equal tokens", "independent runs"]
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
    mode_reason: str = ""  # why this mode: declared, or what the first losses showed
    outcome: Literal["holds", "fails", "inconclusive"] = "holds"
    notes: list[str] = []  # e.g. a trainer without a seed knob
    se: float | None = None  # independent runs: standard error of the final difference
    bound: float | None = None  # independent runs: one-sided upper bound of the final difference
    noise: dict[str, float] = {}  # independent runs: step-to-step noise of each run's logged loss

    def summary(self) -> str:
        if self.mode == "independent runs":
            return (f"independent runs: final {self.final_metric} {self.mean_diff:+.4f} nats, upper bound "
                    f"{self.bound:+.4f} < margin {self.margin:.4f}")
        return (f"{self.mode}: gap {self.gap:.4f}" + (f" <= {self.tolerance:.4f}" if self.tolerance is not None else "")
                + f", final {self.mean_diff:+.4f} within margin {self.margin:.4f}")


def semantic_edits(profile: BaselineProfile, recipe: dict) -> list[str]:
    """Knobs that may change learning and differ from the baseline (the seed aside)."""
    return sorted(name for name, role in profile.roles.items()
                  if role != SPEED and name != "seed" and recipe.get(name) != profile.recipe.get(name))


def _by_step(run: RunResult) -> dict[int, float]:
    return {s.step: s.loss for s in run.steps}


def _tokens(run: RunResult) -> np.ndarray:
    return np.cumsum([s.tokens for s in run.steps], dtype=float)


def replayed(base: RunResult, cand: RunResult) -> tuple[bool, str]:
    """Did the candidate see the baseline's batches? Its first logged losses (before its updates can
    drift apart numerically) then agree far more closely than two different batches would."""
    b, c = _by_step(base), _by_step(cand)
    common = sorted(b.keys() & c.keys())[:REPLAY_STEPS]
    if not common:
        return False, "the runs share no logged step"
    gap = max(abs(c[t] - b[t]) for t in common)
    tol = max(1e-6, REPLAY_FRACTION * stats.step_noise(base.losses()))
    same = gap <= tol
    return same, (f"its first {len(common)} logged losses {'match' if same else 'differ from'} the baseline's "
                  f"(largest difference {gap:.2e} nats, numerical precision taken as {tol:.2e} = "
                  f"{REPLAY_FRACTION:g} x the baseline's step-to-step noise): "
                  + ("it saw the same batches" if same else "it trained on other batches, or logs another average"))


def choose_mode(profile: BaselineProfile, cand: RunResult, settings: ParitySettings,
                equal_tokens: bool) -> tuple[str, str]:
    """Same seed (the candidate replays the baseline's batches), equal tokens, or independent runs."""
    if equal_tokens:
        return "equal tokens", "an allowed semantic knob changed: the trajectory differs by design"
    order = settings.data_order if settings.data_order != "auto" else profile.data_order
    if order == "fixed":
        return "same seed", "the sample order is fixed (the workload replays its batches, or guard.parity.data_order)"
    if order == "varies":
        return "independent runs", "guard.parity.data_order declares that the sample order varies with the recipe"
    moved = [k for k in settings.data_order_knobs if cand.recipe.get(k) != profile.recipe.get(k)]
    if moved:
        return "independent runs", (f"the campaign declares that the sample order depends on {', '.join(moved)}, "
                                    "which the candidate changes (guard.parity.data_order_knobs)")
    same, why = replayed(profile.runs[0], cand)
    return ("same seed" if same else "independent runs"), why


def compare(
    profile: BaselineProfile, candidates: list[RunResult], settings: ParitySettings, equal_tokens: bool = False
) -> ParityEvidence:
    """Judge candidate runs; ``candidates[i]`` ran with ``profile.seeds[i]``."""
    if not candidates or len(candidates) > len(profile.runs):
        raise ValueError(f"need 1..{len(profile.runs)} candidate runs, one per profiled seed; got {len(candidates)}")
    mode, why = choose_mode(profile, candidates[0], settings, equal_tokens)
    if mode == "independent runs":
        return compare_independent(profile, candidates, settings, why)
    evidence = _compare_tracking(profile, candidates, settings, equal_tokens)
    evidence.mode_reason = why
    return evidence


def seed_note(profile: BaselineProfile) -> tuple[bool, str]:
    """Whether the baseline's repeats are independent samples, and what to say about the seed."""
    if profile.seeds[0] is not None:
        distinct = len(set(profile.seeds)) > 1
        return distinct, f"seeds {profile.seeds}"
    curves = profile.curves()
    if len(curves) > 1 and any(c != curves[0] for c in curves[1:]):
        return True, ("the workload has no seed knob; its repeats differ (the trainer seeds itself), "
                      "so they count as independent repeats")
    return False, ("the workload has no seed knob and its repeats are identical (it seeds itself with a "
                   "constant): one run per recipe is compared, its noise estimated within the run")


def _tail(run: RunResult, total: float, share: float) -> list[float]:
    """Logged losses whose cumulative token count lies in the last ``share`` of ``total`` tokens."""
    tokens = _tokens(run)
    return [s.loss for s, k in zip(run.steps, tokens, strict=True) if (1 - share) * total < k <= total * (1 + 1e-9)]


def compare_independent(
    profile: BaselineProfile, candidates: list[RunResult], settings: ParitySettings, why: str
) -> ParityEvidence:
    """End-of-run loss of independent runs: over the same last share of tokens, with the noise of each
    run from the run itself (a logged loss averaging fewer sequences is noisier, and counted so)."""
    independent, note = seed_note(profile)
    pairs = list(zip(profile.runs, candidates, strict=False))
    if not independent:
        pairs = pairs[:1]  # identical repeats: one more copy of the same run adds nothing
    use_val = independent and len(pairs) > 1 and all(
        b.evals and c.evals and b.evals[-1].step == b.steps[-1].step and c.evals[-1].step == c.steps[-1].step
        for b, c in pairs)
    notes = [note]
    diffs, ses, b_fin, c_fin, noise = [], [], [], [], {"baseline": [], "candidate": []}
    short = 0
    for base, cand in pairs:
        total = min(_tokens(base)[-1], _tokens(cand)[-1])
        b_tail, c_tail = _tail(base, total, settings.tail), _tail(cand, total, settings.tail)
        short = max(short, MIN_TAIL - min(len(b_tail), len(c_tail)))
        eb, ec = stats.mean_with_error(b_tail), stats.mean_with_error(c_tail)
        bf, cf = (base.evals[-1].val_loss, cand.evals[-1].val_loss) if use_val else (eb.mean, ec.mean)
        b_fin.append(bf)
        c_fin.append(cf)
        diffs.append(cf - bf)
        ses.append(float(np.hypot(eb.se, ec.se)))
        noise["baseline"].append(stats.step_noise(b_tail))
        noise["candidate"].append(stats.step_noise(c_tail))
    share = f"the last {100 * settings.tail:.0f}% of the tokens"
    metric = "validation loss" if use_val else f"training loss (mean over {share})"
    if not use_val and any(b.evals for b, _ in pairs):
        notes.append("the trainer prints a validation loss, but one value per run has no measurable noise "
                     "without independent repeats: the training loss is compared")
    base_final = float(np.mean(b_fin))
    margin = settings.margin if settings.margin is not None else max(
        settings.floor, settings.relative_margin * abs(base_final))
    test = stats.independent_test(diffs, ses, margin, settings.alpha, independent)
    step_noise = {k: float(np.mean(v)) for k, v in noise.items()}
    notes.append(f"step-to-step noise of the logged loss: baseline {step_noise['baseline']:.4f}, candidate "
                 f"{step_noise['candidate']:.4f} nats (it shrinks with the sequences a logged loss averages)")
    conf = f"{100 * (1 - settings.alpha):.0f}%"
    outcome = {"non-inferior": "holds", "worse": "fails", "inconclusive": "inconclusive"}[test.outcome]
    reasons = []
    if short > 0:  # too few values to estimate the noise: neither "worse" nor "within margin" is shown
        outcome = "inconclusive"
        reasons.append(f"the runs are too short to tell: fewer than {MIN_TAIL} logged losses in {share}; "
                       "raise guard.parity.steps")
    elif outcome == "fails":
        reasons.append(f"the candidate trains worse: final {metric} {test.diff:+.4f} nats vs the baseline, "
                       f"beyond the runs' noise (one-sided {conf} lower bound {test.low:+.4f} > 0, se {test.se:.4f})")
    elif outcome == "inconclusive":
        reasons.append(f"the runs are too short to tell: final {metric} {test.diff:+.4f} nats vs the baseline, "
                       f"one-sided {conf} upper bound {test.high:+.4f} is not below the margin {margin:.4f} "
                       f"(se {test.se:.4f}); raise guard.parity.steps (or state guard.parity.margin)")
    return ParityEvidence(
        mode="independent runs", passed=outcome == "holds", reasons=reasons, window=settings.window,
        seeds=profile.seeds[: len(pairs)], steps_compared=min(len(b.steps) for b, _ in pairs), gap=None, gaps=[],
        tolerance=None, reference=test.se, reference_kind="within-run noise", tolerance_fraction=settings.tolerance,
        final_metric=metric, baseline_finals=b_fin, candidate_finals=c_fin, mean_diff=test.diff, margin=margin,
        p_value=float(sps.norm.sf((margin - test.diff) / test.se)) if test.se > 0 else None, alpha=settings.alpha,
        mode_reason=why, outcome=outcome, notes=notes, se=test.se, bound=test.high, noise=step_noise,
    )


def _compare_tracking(
    profile: BaselineProfile, candidates: list[RunResult], settings: ParitySettings, equal_tokens: bool
) -> ParityEvidence:
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
        outcome="fails" if reasons else "holds",
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
