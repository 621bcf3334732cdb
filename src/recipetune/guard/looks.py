"""Parity evidence gathered in looks: more seeds (or longer runs) until the test can tell.

The parity test (guard/parity.py) is the same in every mode; what a mode changes is how much evidence
it needs. A candidate that replays the baseline's batches is resolved at the first look (a few seeds);
independent runs often are not. Rather than answering "too short to tell" at once, the verdict plans
its looks in advance: the seeds double up to ``parity.max_seeds``, or, for a trainer whose repeats are
identical (no seed knob, a constant seed inside), the runs grow 4x up to ``parity.max_steps_factor``
times ``parity.steps``. All looks share ``parity.alpha`` (Bonferroni), so stopping at the first look
that tells keeps the stated confidence. T stays the one the profile defined.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.guard.baseline import BaselineProfile, run_checked, with_seed
from recipetune.guard.config import GuardConfig
from recipetune.guard.parity import ParityEvidence, compare, seed_note
from recipetune.workloads.base import Workload


@dataclass(frozen=True)
class Look:
    pairs: int  # seeds (or repeats) compared
    factor: int  # run length as a multiple of the first look's


def plan_looks(profile: BaselineProfile, settings: GuardConfig) -> list[Look]:
    """The looks a verdict may take, fixed before any candidate runs (the test's alpha is split over them)."""
    p = settings.parity
    independent, _ = seed_note(profile)
    if not independent:  # identical repeats: only longer runs add evidence
        factors = [1]
        while factors[-1] < p.max_steps_factor:
            factors.append(min(4 * factors[-1], p.max_steps_factor))
        return [Look(1, f) for f in factors]
    n = [min(p.seeds, len(profile.runs))]
    while n[-1] < p.max_seeds:
        n.append(min(2 * n[-1], p.max_seeds))
    return [Look(k, 1) for k in n]


@dataclass
class Gathered:
    evidence: ParityEvidence | None  # None: a candidate run failed
    failure: str  # the failed candidate run's status and cause
    runs: int  # training runs launched for the parity test (baseline and candidate)
    looks: list[str]  # what each look showed, for the verdict's notes


def _seed(profile: BaselineProfile, k: int) -> int | None:
    first = profile.seeds[0]
    return None if first is None else first + k


def gather(
    workload: Workload, profile: BaselineProfile, baseline: Recipe, candidate: Recipe, cand_steps: int,
    settings: GuardConfig, out_dir: Path, equal_tokens: bool, progress: Callable[[str], None] | None = None,
) -> Gathered:
    """Run the candidate (and, past the profile, the baseline) look by look until the test tells."""
    plan = plan_looks(profile, settings)
    base_runs: dict[tuple[int, int], RunResult] = {(k, 1): r for k, r in enumerate(profile.runs)}
    cand_runs: dict[tuple[int, int], RunResult] = {}
    launched, notes = 0, []
    evidence: ParityEvidence | None = None
    for i, look in enumerate(plan):
        for k in range(look.pairs):
            seed = _seed(profile, k)
            name = f"seed-{seed}" if seed is not None else f"repeat-{k}"
            sub = "" if look.factor == 1 else f"x{look.factor}/"
            if (k, look.factor) not in base_runs:
                if progress:
                    progress(f"parity look {i + 1}/{len(plan)}: baseline {name}, {profile.steps * look.factor} steps")
                base_runs[k, look.factor] = run_checked(
                    workload, with_seed(baseline, seed), profile.steps * look.factor,
                    out_dir / "baseline" / f"{sub}{name}", settings, "baseline run")
                launched += 1
            if (k, look.factor) not in cand_runs:
                if progress:
                    progress(f"parity look {i + 1}/{len(plan)}: candidate {name}, {cand_steps * look.factor} steps")
                result = workload.run(with_seed(candidate, seed), cand_steps * look.factor,
                                      out_dir / "parity" / f"{sub}{name}", timeout_s=settings.timeout_s)
                launched += 1
                if not result.ok:
                    return Gathered(None, f"candidate run failed at {name.replace('-', ' ')}: {result.status}: "
                                    f"{result.cause}", launched, notes)
                cand_runs[k, look.factor] = result
        keys = [(k, look.factor) for k in range(look.pairs)]
        evidence = compare(profile, [cand_runs[x] for x in keys], settings.parity, equal_tokens,
                           baselines=[base_runs[x] for x in keys], looks=len(plan), longer=look.factor)
        what = f"{look.pairs} seed(s)" if look.factor == 1 else f"{look.factor}x the steps"
        det = f"{evidence.detectable:.4f}" if evidence.detectable is not None else "unbounded"
        notes.append(f"parity look {i + 1}/{len(plan)} ({what}): {evidence.outcome}, difference "
                     f"{evidence.mean_diff:+.4f}, detectable {det}, T {evidence.tolerance:.4f}")
        if evidence.outcome != "inconclusive" or (evidence.too_short and look.factor == plan[-1].factor):
            break  # decided; or too short, which more seeds cannot change
    assert evidence is not None
    if evidence.outcome == "inconclusive" and evidence.evidence_factor is not None:
        last = plan[-1]
        need = evidence.evidence_factor
        evidence.reasons.append(
            f"after {len(plan)} look(s), the most the settings allow: about {math.ceil(last.pairs * need)} seeds "
            "would resolve T (guard.parity.max_seeds)" if last.factor == 1 and seed_note(profile)[0] else
            f"after {len(plan)} look(s), the most the settings allow: runs of about "
            f"{math.ceil(profile.steps * last.factor * need)} steps would resolve T (guard.parity.max_steps_factor)")
    return Gathered(evidence, "", launched, notes)
