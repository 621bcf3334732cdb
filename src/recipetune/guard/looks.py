"""Parity evidence, planned and gathered in looks (docs/guard.md, "A planned design").

The parity test (guard/parity.py) is the same whatever the trainer; the evidence it needs is not. A
candidate that replays the baseline's batches is resolved by the profile's few seeds, one that trains
on other batches may need many. So the verdict plans before the candidate runs, and again after each
look, and says what it expects to spend:

- **seeds** (independent repeats: a seed knob, or a trainer that seeds itself differently): the first
  look compares the candidate at the profile's seeds, whose baseline runs exist. From the pairs'
  scatter (pooled, while the batches may differ, with what the profile predicts) the plan sizes the
  seeds the test needs to show equivalence at ``parity.power``; then a look at half of them, then the
  last. The levels come from a group-sequential design (guard/sequential.py: the first look spends a
  fixed share of alpha, the later ones the rest by O'Brien-Fleming or Pocock spending). A look whose
  predictive power to show equivalence within the plan is below ``parity.futility`` stops the verdict:
  not shown equivalent.
- **steps** (identical repeats: no seed knob, a constant seed inside; also repeats that differ by float
  noise only, guard/loss.py: replicas): only longer runs add evidence.
  One candidate run at the profile's length; if it cannot tell, pairs up to the length the plan says
  resolves T (at most ``parity.max_steps_factor`` times), with a look at the geometric middle when that
  length is 4x or more (an effect that fades with training still shows there): read from the pair as it
  runs where its records can be read, else a pair of its own; the rest of alpha split between the looks
  (core/sequential.py: SeparateLooks, Bonferroni, which holds whatever the looks' dependence); a look
  whose longest allowed pair would most likely not tell stops for futility (guard/looks_steps.py,
  guard/pair.py).

This module holds ``gather`` and the seeds design; guard/look.py what every look shares. Every run of
a look goes to the executor at once (guard/runs.py), stored and reused by key;
``guard.max_parity_runs`` and ``guard.max_parity_s`` cap what one verdict may spend, and a verdict
stopped by them says what more would have told.
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

from recipetune.core.fmt import fmt_duration
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.core.sequential import NEVER, seeds_needed
from recipetune.core.words import LookOutcome, LooksStop, ParityOutcome
from recipetune.guard.baseline import BaselineProfile, with_seed
from recipetune.guard.config import GuardConfig
from recipetune.guard.look import Gathered, Looking, Progress, Stop, Wanted, grows, look_line, not_shown, stopped
from recipetune.guard.looks_steps import by_steps
from recipetune.guard.parity import (
    Measurements,
    ParityEvidence,
    Sample,
    judge,
    measure,
    seed_note,
)
from recipetune.guard.runs import Runs
from recipetune.guard.sequential import Pairs, SeedDesign, SeedLook
from recipetune.workloads.base import Workload


def gather(
    workload: Workload, profile: BaselineProfile, baseline: Recipe, candidate: Recipe, cand_steps: int,
    settings: GuardConfig, out_dir: Path, equal_tokens: bool, progress: Progress | None = None,
    runs: Runs | None = None,
) -> Gathered:
    """Plan the parity test, then run the candidate (and, past the profile, the baseline) look by look
    until the test tells, futility stops it, or the budget is spent. ``runs``: where the runs go
    (an executor, a folder of stored runs); by default this machine, nothing stored."""
    runs = runs if runs is not None else Runs(workload, timeout_s=settings.timeout_s)
    walls = [r.wall_s for r in profile.runs if r.wall_s > 0]
    v = Looking(workload, profile, baseline, candidate, cand_steps, settings, out_dir, equal_tokens, progress, runs,
                 at_once=max(1, runs.at_once(candidate)), run_s=statistics.median(walls) if walls else 0.0)
    independent, _ = seed_note(profile)
    return _by_seeds(v) if independent else by_steps(v)


def _seeds_runs(v: Looking, have: int, more: int) -> float:
    """Cost of growing from ``have`` to ``have + more`` seeds: a baseline and a candidate run each."""
    total = 0.0
    for k in range(have, have + more):
        seed = v.seed(k)
        total += v.cost(with_seed(v.baseline, seed), v.profile.steps, k)
        total += v.cost(with_seed(v.candidate, seed), v.cand_steps, k)
    return total


def _seed_cap(v: Looking, have: int) -> int:
    """The most seeds guard.max_parity_runs lets this verdict reach from ``have``."""
    left = v.settings.max_parity_runs - v.spent()
    n = have
    while n < have + 1000:
        step = _seeds_runs(v, n, 1)
        if step > left + 1e-9:
            break
        left -= step
        n += 1
    return n


def _pairs(m: Measurements, x: Sample, profile: BaselineProfile) -> Pairs:
    """One measure's pairs for the design, with the profile's prediction of one pair's scatter if the
    batches differ: two independent runs, each with the baseline's seed-to-seed spread."""
    diffs = [c - b for b, c in zip(x.baseline_finals, x.candidate_finals, strict=True)]
    return Pairs(diffs, x.ses, x.tolerance, (math.sqrt(2.0) * x.sigma, max(1, len(profile.runs) - 1)))


def _by_seeds(v: Looking) -> Gathered:
    """Independent repeats: the first look at the profile's seeds, then looks at more seeds as the plan says,
    until the design decides, futility or the budget stops it."""
    p = v.settings.parity
    n = min(p.seeds, len(v.profile.runs))
    base: dict[int, RunResult] = dict(enumerate(v.profile.runs[:n]))
    cand: dict[int, RunResult] = {}
    design = SeedDesign(p.alpha, p.power, p.futility, p.spending, p.first_look, not v.equal_tokens)
    planned = _say_seeds_plan(v, n, design)
    while True:
        got = v.gather(_seeds_wanted(v, n, base, cand), design.looks + 1)
        if isinstance(got, str):
            return Gathered(None, got, v.runs.launched, v.notes, v.runs.reused, round(planned), LooksStop.FAILED)
        for (side, k), result in got.items():
            (base if side == "baseline" else cand)[k] = result
        m = measure(v.profile, [cand[k] for k in range(n)], p, v.equal_tokens, [base[k] for k in range(n)])
        if m.problems or not m.samples:  # not comparable, or too short: more seeds cannot change it
            ev = judge(m, p, p.alpha)
            v.say(look_line(design.looks + 1, f"{n} seed(s)", p.alpha, ev))
            return Gathered(ev, "", v.runs.launched, v.notes, v.runs.reused, round(planned),
                            LooksStop.DECIDED if m.problems else LooksStop.TOO_SHORT)
        # The first look pools the pairs' scatter with the profile's prediction unless the batches are
        # known to be the same (guard/sequential.py: SeedDesign).
        d = design.decide([_pairs(m, x, v.profile) for x in m.samples], _seed_cap(v, n),
                          pooled=m.mode != "same batches")
        ev = judge(m, p, d.level, pilot=d.pilot)
        line = look_line(design.looks, f"{n} seed(s)", d.level, ev)
        stop = _seeds_stop(v, n, d, ev, line)
        if stop is not None:
            stopped(v, ev, stop)
            break
        more = _seeds_runs(v, n, d.next - n)
        if v.settings.max_parity_s is not None and \
                time.monotonic() - v.started + v.seconds(more) > v.settings.max_parity_s:
            stopped(v, ev, Stop(f"{line}; the next look would end after guard.max_parity_s "
                                f"{v.settings.max_parity_s:g} s: stopped",
                                not_shown(ev, _what_more(v, n, d.planned, d.needed, LooksStop.TIME))))
            d.outcome = LookOutcome.BUDGET
            break
        aim = ("equivalence is out of reach, a difference beyond T is not: the last look at "
               if d.rejecting else f"plan: {d.planned} seeds, the next look at ")
        v.say(f"{line}; {aim}{d.next} seeds ({more:.0f} more runs, ~{fmt_duration(v.seconds(more))})")
        n = d.next
    stop = LooksStop.TREND if grows(ev) else (
        LooksStop.DECIDED if d.outcome in (ParityOutcome.HOLDS, ParityOutcome.FAILS) else LooksStop(d.outcome))
    return Gathered(ev, "", v.runs.launched, v.notes, v.runs.reused, round(planned), stop,
                    {"pairs": d.planned, "needed": d.needed, "factor": 1.0, "at_once": v.at_once})


def _say_seeds_plan(v: Looking, n: int, design: SeedDesign) -> float:
    """Before the candidate runs: say the first look, and what T takes if the candidate's batches differ;
    the runs that plan expects."""
    p = v.settings.parity
    T, sigma = v.profile.loss_tolerance, v.profile.loss_reference
    other = seeds_needed(math.sqrt(2.0) * sigma, T, design.sizing, p.power, n + 1, NEVER, not v.equal_tokens)
    planned = n * v.cand_steps / v.profile.steps + _seeds_runs(v, n, other - n)
    v.say(f"parity plan: T {T:.4f} nats; the first look compares {n} seed(s) ({n} candidate run(s), "
          f"~{fmt_duration(v.seconds(n))}): it decides if the candidate replays the baseline's batches; if they "
          f"differ, resolving T takes about {other} seeds ({planned:.0f} runs, ~{fmt_duration(v.seconds(planned))} "
          f"at {v.at_once} at a time); at most {v.settings.max_parity_runs} runs (guard.max_parity_runs)")
    return planned


def _seeds_wanted(v: Looking, n: int, base: dict[int, RunResult], cand: dict[int, RunResult]) -> list[Wanted]:
    """The runs a look at ``n`` seeds still needs: each seed's baseline and candidate not run yet."""
    wanted = []
    for k in range(n):
        seed = v.seed(k)
        name = f"seed-{seed}" if seed is not None else f"repeat-{k}"
        if k not in base:
            wanted.append(Wanted("baseline", k, with_seed(v.baseline, seed), v.profile.steps,
                                 v.out_dir / "baseline" / name))
        if k not in cand:
            wanted.append(Wanted("candidate", k, with_seed(v.candidate, seed), v.cand_steps,
                                 v.out_dir / "parity" / name))
    return wanted


def _seeds_stop(v: Looking, n: int, d: SeedLook, ev: ParityEvidence, line: str) -> Stop | None:
    """Why this look ends the looks (the design decided, or its plan, the run budget or futility ends them);
    None where they go on."""
    p = v.settings.parity
    if d.outcome in (ParityOutcome.HOLDS, ParityOutcome.FAILS):
        return Stop(f"{line}; the gap grows over the window: stopped" if grows(ev) else line)
    if d.outcome in (LookOutcome.PLAN, LookOutcome.BUDGET):
        why = _what_more(v, n, d.planned, d.needed, d.outcome)
        return Stop(f"{line}; {why}: stopped", not_shown(ev, why))
    if d.outcome == LookOutcome.FUTILITY:
        chance = f"{100 * (d.chance or 0):.0f}%"
        return Stop(f"{line}; the chance that {d.planned} seeds show equivalence is {chance}, below parity.futility "
                    f"{100 * p.futility:.0f}%: stopped",
                    not_shown(ev, f"{d.planned} seeds would show equivalence with a chance of {chance} "
                                  f"(parity.futility {100 * p.futility:.0f}%)"))
    return None


def _what_more(v: Looking, n: int, planned: int, need: int, why: str) -> str:
    """What a verdict stopped short of its plan would have needed."""
    more = f"about {need} seeds ({_seeds_runs(v, n, need - n):.0f} more runs) would resolve T"
    if why == LooksStop.TIME:
        return f"guard.max_parity_s ({v.settings.max_parity_s:g} s) ends the looks at {n} seeds; {more}"
    if why == LooksStop.BUDGET and planned > n:
        return (f"guard.max_parity_runs ({v.settings.max_parity_runs}) allows {planned} seeds, too few to show "
                f"even an exact equivalent more often than not; {more}")
    if why == LooksStop.BUDGET:
        return f"guard.max_parity_runs ({v.settings.max_parity_runs}) allowed {n} seeds; {more}"
    return f"the planned {n} seeds did not show it" + (f"; {more}" if need > n else "")


