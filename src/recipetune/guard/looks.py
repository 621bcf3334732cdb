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
  resolves T (at most ``parity.max_steps_factor`` times), one at the geometric middle first when that
  length is 4x or more (an effect that fades with training still shows there), the rest of alpha
  split between them (Bonferroni: the looks are separate runs, not a growing sample).

Every run of a look goes to the executor at once (guard/runs.py), stored and reused by key;
``guard.max_parity_runs`` and ``guard.max_parity_s`` cap what one verdict may spend, and a verdict
stopped by them says what more would have told.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from recipetune.core.console import Note
from recipetune.core.fmt import fmt_duration
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.core.sequential import NEVER, factor_needed, predictive_power, seeds_needed
from recipetune.core.stats import paired, quantile
from recipetune.core.words import LookOutcome, LooksStop, ParityOutcome, TrendOutcome
from recipetune.guard.baseline import BaselineProfile, GuardError, with_seed
from recipetune.guard.config import GuardConfig
from recipetune.guard.loss import MIN_TAIL
from recipetune.guard.parity import (
    Measurements,
    ParityEvidence,
    Sample,
    judge,
    loss_line_note,
    measure,
    seed_note,
)
from recipetune.guard.runs import Runs, wait_all
from recipetune.guard.sequential import Pairs, SeedDesign, SeedLook
from recipetune.workloads.base import Workload

Progress = Callable[[str], None]


@dataclass
class Gathered:
    evidence: ParityEvidence | None  # None: a candidate run failed
    failure: str  # the failed candidate run's status and cause
    runs: int  # training runs launched for the parity test (baseline and candidate)
    looks: list[str]  # the plan and what each look showed, for the verdict's notes
    reused: int = 0  # runs found stored (earlier verdicts in the same folder) or in flight for another verdict
    planned: int = 0  # runs the plan made before the candidate ran expected, were its batches other
    stop: LooksStop | str = ""  # why the looks ended ("": not run)
    plan: dict = field(default_factory=dict)  # the last plan: pairs, factor, runs and seconds still to go


@dataclass(frozen=True)
class Wanted:
    """One run a look needs: the baseline's or the candidate's, at seed (or repeat) k."""

    side: str  # "baseline" | "candidate"
    k: int
    recipe: Recipe
    steps: int
    out: Path  # its name in the verdict's folder


@dataclass
class _Verdict:
    """What every look of one verdict needs."""

    workload: Workload
    profile: BaselineProfile
    baseline: Recipe
    candidate: Recipe
    cand_steps: int
    settings: GuardConfig
    out_dir: Path
    equal_tokens: bool
    progress: Progress | None
    runs: Runs
    at_once: int
    run_s: float  # one run of the profile's length, in seconds (the profile's median)
    started: float = field(default_factory=time.monotonic)
    notes: list[str] = field(default_factory=list)

    def say(self, line: str, note: bool = True) -> None:
        if note:
            self.notes.append(line)
        if self.progress:
            self.progress(Note(line) if note else line)

    def seed(self, k: int) -> int | None:
        first = self.profile.seeds[0]
        return None if first is None else first + k

    def repeat(self, k: int) -> int:
        """Which repeat seed k is, for a trainer without a seed knob (guard/runs.py: the stored run's key)."""
        return k if self.profile.seeds[0] is None else 0

    def cost(self, recipe: Recipe, steps: int, k: int = 0) -> float:
        """A run's cost against guard.max_parity_runs, in runs of the profile's length; nothing if stored."""
        return 0.0 if self.runs.has(recipe, steps, self.repeat(k)) else steps / self.profile.steps

    def spent(self) -> float:
        return self.runs.steps_launched / self.profile.steps

    def seconds(self, runs: float) -> float:
        """Wall time of ``runs`` runs of the profile's length, ``at_once`` at a time."""
        return math.ceil(runs / self.at_once) * self.run_s if runs > 0 else 0.0

    def gather(self, wanted: list[Wanted], look: int) -> dict[tuple[str, int], RunResult] | str:
        """Start every run of a look at once; their results by (side, k), or the failed candidate's cause."""
        futures = {(w.side, w.k): self.runs.start(w.recipe, w.steps, w.out, self.repeat(w.k)) for w in wanted}
        total = len(futures)

        def done(k: int) -> None:
            left = self.seconds(total - k) if total > k else 0.0
            self.say(f"parity look {look}: {k}/{total} runs done" + (f", ~{fmt_duration(left)} to go" if left else ""),
                     note=False)

        results = dict(zip(futures, wait_all(list(futures.values()), done), strict=True))
        for w in wanted:
            result = results[w.side, w.k]
            if result.ok:
                continue
            if w.side == "baseline":
                raise GuardError(f"baseline run failed ({result.status}: {result.cause}); see {w.out}")
            return f"candidate run failed at {w.out.name.replace('-', ' ')}: {result.status}: {result.cause}"
        return results


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
    v = _Verdict(workload, profile, baseline, candidate, cand_steps, settings, out_dir, equal_tokens, progress, runs,
                 at_once=max(1, runs.at_once(candidate)), run_s=statistics.median(walls) if walls else 0.0)
    independent, _ = seed_note(profile)
    return _by_seeds(v) if independent else _by_steps(v)


# ------------------------------------------------------------------------------------------ seeds


def _seeds_runs(v: _Verdict, have: int, more: int) -> float:
    """Cost of growing from ``have`` to ``have + more`` seeds: a baseline and a candidate run each."""
    total = 0.0
    for k in range(have, have + more):
        seed = v.seed(k)
        total += v.cost(with_seed(v.baseline, seed), v.profile.steps, k)
        total += v.cost(with_seed(v.candidate, seed), v.cand_steps, k)
    return total


def _seed_cap(v: _Verdict, have: int) -> int:
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


def _by_seeds(v: _Verdict) -> Gathered:
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
            v.say(_look_line(design.looks + 1, f"{n} seed(s)", p.alpha, ev))
            return Gathered(ev, "", v.runs.launched, v.notes, v.runs.reused, round(planned),
                            LooksStop.DECIDED if m.problems else LooksStop.TOO_SHORT)
        # The first look pools the pairs' scatter with the profile's prediction unless the batches are
        # known to be the same (guard/sequential.py: SeedDesign).
        d = design.decide([_pairs(m, x, v.profile) for x in m.samples], _seed_cap(v, n),
                          pooled=m.mode != "same batches")
        ev = judge(m, p, d.level, pilot=d.pilot)
        line = _look_line(design.looks, f"{n} seed(s)", d.level, ev)
        stop = _seeds_stop(v, n, d, ev, line)
        if stop is not None:
            _stopped(v, ev, stop)
            break
        more = _seeds_runs(v, n, d.next - n)
        if v.settings.max_parity_s is not None and \
                time.monotonic() - v.started + v.seconds(more) > v.settings.max_parity_s:
            _stopped(v, ev, Stop(f"{line}; the next look would end after guard.max_parity_s "
                                 f"{v.settings.max_parity_s:g} s: stopped",
                                 _not_shown(ev, _what_more(v, n, d.planned, d.needed, LooksStop.TIME))))
            d.outcome = LookOutcome.BUDGET
            break
        aim = ("equivalence is out of reach, a difference beyond T is not: the last look at "
               if d.rejecting else f"plan: {d.planned} seeds, the next look at ")
        v.say(f"{line}; {aim}{d.next} seeds ({more:.0f} more runs, ~{fmt_duration(v.seconds(more))})")
        n = d.next
    stop = LooksStop.TREND if _grows(ev) else (
        LooksStop.DECIDED if d.outcome in (ParityOutcome.HOLDS, ParityOutcome.FAILS) else LooksStop(d.outcome))
    return Gathered(ev, "", v.runs.launched, v.notes, v.runs.reused, round(planned), stop,
                    {"pairs": d.planned, "needed": d.needed, "factor": 1.0, "at_once": v.at_once})


def _say_seeds_plan(v: _Verdict, n: int, design: SeedDesign) -> float:
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


def _seeds_wanted(v: _Verdict, n: int, base: dict[int, RunResult], cand: dict[int, RunResult]) -> list[Wanted]:
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


@dataclass(frozen=True)
class Stop:
    """Why the looks end: the line to say, and the reason the verdict gives instead of the parity test's own
    (None: the test's reasons say it)."""

    line: str
    reason: str | None = None


def _stopped(v: _Verdict, ev: ParityEvidence, stop: Stop) -> None:
    """Say why the looks end, and give the verdict that reason."""
    v.say(stop.line)
    if stop.reason is not None:
        ev.reasons = [stop.reason]


def _seeds_stop(v: _Verdict, n: int, d: SeedLook, ev: ParityEvidence, line: str) -> Stop | None:
    """Why this look ends the looks (the design decided, or its plan, the run budget or futility ends them);
    None where they go on."""
    p = v.settings.parity
    if d.outcome in (ParityOutcome.HOLDS, ParityOutcome.FAILS):
        return Stop(f"{line}; the gap grows over the window: stopped" if _grows(ev) else line)
    if d.outcome in (LookOutcome.PLAN, LookOutcome.BUDGET):
        why = _what_more(v, n, d.planned, d.needed, d.outcome)
        return Stop(f"{line}; {why}: stopped", _not_shown(ev, why))
    if d.outcome == LookOutcome.FUTILITY:
        chance = f"{100 * (d.chance or 0):.0f}%"
        return Stop(f"{line}; the chance that {d.planned} seeds show equivalence is {chance}, below parity.futility "
                    f"{100 * p.futility:.0f}%: stopped",
                    _not_shown(ev, f"{d.planned} seeds would show equivalence with a chance of {chance} "
                                   f"(parity.futility {100 * p.futility:.0f}%)"))
    return None


def _not_shown(ev: ParityEvidence, why: str) -> str:
    bounds = "" if ev.low is None else f", one-sided bounds [{ev.low:+.4f}, {ev.high:+.4f}]"
    resolve = "no difference" if ev.detectable is None else f"{ev.detectable:.4f} nats at best"
    return (f"not shown equivalent: final {ev.final_metric} {ev.mean_diff:+.4f} nats vs the baseline{bounds}, "
            f"T {ev.tolerance:.4f}; these runs resolve {resolve} (the smallest difference they detect); {why}")


def _what_more(v: _Verdict, n: int, planned: int, need: int, why: str) -> str:
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


# ------------------------------------------------------------------------------------------ steps


def _by_steps(v: _Verdict) -> Gathered:
    """Identical repeats: one candidate run at the profile's length, then longer pairs up to the length
    that resolves T, with one pair between when that length is 4x or more: an effect that fades with
    training still shows there, and a difference shown beyond noise at any longer look blocks approval
    at every later one (parity.py: the fade rule)."""
    p = v.settings.parity
    first, rest = p.alpha * p.first_look, p.alpha * (1.0 - p.first_look)
    name = "repeat-0" if v.seed(0) is None else f"seed-{v.seed(0)}"
    _say_steps_plan(v)
    got = v.gather([Wanted("candidate", 0, v.candidate, v.cand_steps, v.out_dir / "parity" / name)], 1)
    if isinstance(got, str):
        return Gathered(None, got, v.runs.launched, v.notes, v.runs.reused, 1, LooksStop.FAILED)
    m = measure(v.profile, list(got.values()), p, v.equal_tokens, v.profile.runs[:1])
    ev = judge(m, p, first)
    line = _look_line(1, "1x the steps", first, ev)
    factor, look, planned, plan = 1.0, 1, 1, 0.0
    while True:
        ended = _steps_ended(v, m, ev, line, factor, planned)
        if ended is not None:
            return ended
        need, what = _steps_need(v, m, factor, rest)
        # The plan never shrinks (as the seeds' plan): the first look's error sized it, and a middle look
        # that reads smaller by chance would otherwise end the looks short of it, at a last look too short
        # to show the difference within T.
        own = float(min(p.max_steps_factor, max(2 * factor, math.ceil(need))))
        target = max(plan, own)
        plan = target
        chance = _steps_chance(m, factor, rest / 2, p.max_steps_factor) if look < 3 and target > factor else None
        if chance is not None and chance < p.futility:
            pct, cap = f"{100 * chance:.0f}%", f"{p.max_steps_factor}x"
            _stopped(v, ev, Stop(f"{line}; the chance that runs {cap} as long tell (equivalent or different "
                                 f"beyond T) is {pct}, below parity.futility {100 * p.futility:.0f}%: stopped",
                                 _not_shown(ev, f"runs {cap} as long (guard.parity.max_steps_factor) would tell "
                                                f"with a chance of {pct} (parity.futility {100 * p.futility:.0f}%); "
                                                f"{what}")))
            return _steps_gathered(v, ev, planned, LooksStop.FUTILITY, factor)
        if look == 3 or target <= factor:
            v.say(line)
            ev.reasons.append(f"after {look} look(s): {what} (guard.parity.max_steps_factor {p.max_steps_factor})")
            return _steps_gathered(v, ev, planned, LooksStop.PLAN if look == 3 else LooksStop.BUDGET, factor)
        # From the profile's length, a pair between when the plan is 4x or more (geometric middle).
        nxt = float(math.ceil(math.sqrt(target))) if look == 1 and target >= 4 else target
        cost = v.cost(v.baseline, round(v.profile.steps * nxt)) + v.cost(v.candidate, round(v.cand_steps * nxt))
        planned = round(planned + 2 * nxt)
        if (over := _steps_over_budget(v, ev, line, nxt, cost, what)) is not None:
            _stopped(v, ev, over)
            return _steps_gathered(v, ev, planned, LooksStop.BUDGET, factor)
        kept = f" (kept: this look alone says {own:g}x)" if own < target else ""
        v.say(f"{line}; plan: {target:g}x the steps{kept}, the next pair at {nxt:g}x "
              f"({round(v.cand_steps * nxt)} steps, ~{fmt_duration(v.seconds(cost))})")
        look, factor, sub = look + 1, nxt, f"x{nxt:g}"
        longer = [Wanted("baseline", 0, v.baseline, round(v.profile.steps * nxt), v.out_dir / "baseline" / sub / name),
                  Wanted("candidate", 0, v.candidate, round(v.cand_steps * nxt), v.out_dir / "parity" / sub / name)]
        got = v.gather(longer, look)
        if isinstance(got, str):
            return Gathered(None, got, v.runs.launched, v.notes, v.runs.reused, planned, LooksStop.FAILED)
        m = measure(v.profile, [got["candidate", 0]], p, v.equal_tokens, [got["baseline", 0]])
        ev = judge(m, p, rest / 2, longer=factor)
        line = _look_line(look, f"{factor:g}x the steps", rest / 2, ev)


def _say_steps_plan(v: _Verdict) -> None:
    """Say before the candidate runs what the steps' looks may spend: only longer runs add evidence."""
    p = v.settings.parity
    v.say(f"parity plan: T {v.profile.loss_tolerance:.4f} nats; the baseline's repeats are identical (or differ "
          f"by float noise only), so only longer runs add evidence: one candidate run at {v.cand_steps} steps, "
          f"then, if it cannot tell, pairs up to the length that resolves T (at most {p.max_steps_factor}x); at most "
          f"{v.settings.max_parity_runs} run(s) of {v.profile.steps} steps (guard.max_parity_runs); "
          f"{_steps_forecast(v)}")


def _steps_forecast(v: _Verdict) -> str:
    """What the looks are expected to spend if the candidate trains on other batches than the baseline's: a
    pair's difference then has about sqrt(2) times one run's within-run error (the profile's reference), and
    the runs must grow until that resolves T (``factor_needed``)."""
    p = v.settings.parity
    se = math.sqrt(2.0) * v.profile.loss_reference
    need = factor_needed(se, v.profile.loss_tolerance, p.alpha * (1.0 - p.first_look) / 2, p.power)
    if need <= 1.0:
        return f"the first run is expected to decide (~{fmt_duration(v.seconds(1))})"
    last = float(min(p.max_steps_factor, max(2, math.ceil(need))))
    factors = [float(math.ceil(math.sqrt(last))), last] if last >= 4 else [last]
    runs = 1 + sum(2 * f for f in factors)
    beyond = (f"; about {need:.0f}x would be needed, beyond the cap: such a verdict most likely ends not shown "
              f"equivalent") if need > p.max_steps_factor else ""
    return (f"if its batches differ from the baseline's, expected: pairs at {', '.join(f'{f:g}x' for f in factors)} "
            f"({runs:g} runs of the profile's length, ~{fmt_duration(v.seconds(runs))}){beyond}")


def _steps_gathered(v: _Verdict, ev: ParityEvidence, planned: int, stop: LooksStop, factor: float) -> Gathered:
    """What the steps' looks gathered, ended by ``stop`` at runs ``factor`` times the profile's length."""
    return Gathered(ev, "", v.runs.launched, v.notes, v.runs.reused, planned, stop,
                    {"pairs": 1, "factor": factor, "at_once": v.at_once})


def _steps_ended(v: _Verdict, m: Measurements, ev: ParityEvidence, line: str, factor: float,
                 planned: int) -> Gathered | None:
    """The look decided, or the fade rule or the trend ends the verdict: longer runs cannot change it."""
    if ev.outcome != ParityOutcome.INCONCLUSIVE or m.problems:
        v.say(line)
        return _steps_gathered(v, ev, planned, LooksStop.DECIDED, factor)
    if any(x.fades for x in ev.measures) or _grows(ev):
        why = ("a gap shown growing over the window blocks approval" if _grows(ev) else
               f"a difference shown beyond noise at {factor:g}x blocks approval at any longer look")
        v.say(f"{line}; {why}: stopped")
        return _steps_gathered(v, ev, planned, LooksStop.TREND if _grows(ev) else LooksStop.DECIDED, factor)
    return None


def _steps_need(v: _Verdict, m: Measurements, factor: float, rest: float) -> tuple[float, str]:
    """How long the runs must be: as long as T needs at this look's error (it shrinks as 1 / sqrt(tokens));
    or, when the runs logged too few losses to have an error, long enough to have one."""
    p = v.settings.parity
    if m.samples:
        x = m.samples[0]
        se = paired([c - b for b, c in zip(x.baseline_finals, x.candidate_finals, strict=True)], x.ses, False).se
        need = factor * factor_needed(se, x.tolerance, rest / 2, p.power, m.two_sided)
        return need, f"runs of about {math.ceil(need * v.profile.steps)} steps would resolve T{_advice(v, m, need)}"
    need = factor * MIN_TAIL / max(1, m.tail_records)
    return need, f"runs of about {math.ceil(need * v.profile.steps)} steps would log enough losses to tell"


def _advice(v: _Verdict, m: Measurements, need: float) -> str:
    """What would shorten a proof that needs runs ``need`` times the profile's length, measured from these
    runs: where the loss line's noise differs between the two recipes beyond chance (parity.py:
    ``loss_line_note``: one micro-batch's loss), a line carrying the step's loss (the quieter side's noise on
    both) divides the steps needed by (b^2 + c^2) / (2 min^2); a seed knob the trainer reads lets repeats at
    the profile's length add evidence instead of longer runs."""
    if need * v.profile.steps <= v.profile.steps:
        return ""
    b, c = m.noise.get("baseline", 0.0), m.noise.get("candidate", 0.0)
    said = []
    if loss_line_note(b, c, m.tail_records):
        quiet = min(b, c)
        shorter = need * 2 * quiet**2 / (b**2 + c**2)
        said.append(f"a loss line that is the step's loss (its noise {quiet:.3g} nats a step, as the "
                    f"{'candidate' if c < b else 'baseline'}'s, not {max(b, c):.3g}) would resolve it in runs of "
                    f"about {math.ceil(shorter * v.profile.steps)} steps")
    said.append(f"a seed knob the trainer reads would let repeats of {v.profile.steps} steps add evidence instead "
                f"of longer runs")
    return "; to shorten the proof: " + "; ".join(said)


def _steps_chance(m: Measurements, factor: float, level: float, cap: float) -> float | None:
    """Predictive power of the longest pair the plan may run (``cap`` times the profile's length): the chance
    that it decides, either way, given this look (flat prior). The longer pair is new runs, so its mean
    difference is normal around this look's with variance se^2 + se_cap^2, se_cap = se sqrt(factor / cap) (the
    error shrinks as 1 / sqrt(tokens)); it shows equivalence within T less its critical value times se_cap,
    and a difference beyond T plus it. A pair likely to show a poison is never stopped for futility: only one
    that would most likely end "cannot resolve". The least of the measures' chances (each must decide); None
    where this look has no error to predict from."""
    chances = []
    for x in m.samples:
        est = paired([c - b for b, c in zip(x.baseline_finals, x.candidate_finals, strict=True)], x.ses, False)
        if not math.isfinite(est.se) or cap <= factor:
            return None
        se_cap = est.se * math.sqrt(factor / cap)
        z, spread, T = quantile(level, None), math.hypot(est.se, se_cap), x.tolerance
        margin = T - z * se_cap
        band = (-margin if m.two_sided else -math.inf, margin) if margin > 0 else (0.0, 0.0)
        decides = predictive_power(est.mean, spread, *band) + predictive_power(est.mean, spread, T + z * se_cap)
        if m.two_sided:
            decides += predictive_power(est.mean, spread, -math.inf, -T - z * se_cap)
        chances.append(decides)
    return min(chances) if chances else None


def _steps_over_budget(v: _Verdict, ev: ParityEvidence, line: str, nxt: float, cost: float,
                       what: str) -> Stop | None:
    """Why the looks end where the next pair would pass guard.max_parity_runs or guard.max_parity_s; None
    within both."""
    late = v.settings.max_parity_s is not None and \
        time.monotonic() - v.started + v.seconds(cost) > v.settings.max_parity_s
    if cost > v.settings.max_parity_runs - v.spent() + 1e-9 or late:
        cap = "guard.max_parity_s" if late else f"guard.max_parity_runs ({v.settings.max_parity_runs})"
        return Stop(f"{line}; runs {nxt:g}x as long would exceed {cap}: stopped",
                    _not_shown(ev, f"{cap} does not allow the pair of runs {nxt:g}x as long; {what}"))
    return None


def _grows(ev: ParityEvidence) -> bool:
    """The parity test held on the mean but the gap is shown to grow (guard/trend.py): not approved, and more
    of the same evidence cannot change that. Only where the level held: a look that cannot resolve T yet is
    no verdict on the gap's trend either, and the next look tests both again (one noisy pair's slope must
    not end a verdict before the longer pairs that resolve T have run)."""
    return (ev.outcome == ParityOutcome.INCONCLUSIVE and ev.trend is not None
            and ev.trend.outcome == TrendOutcome.GROWS
            and bool(ev.measures) and all(x.outcome == ParityOutcome.HOLDS for x in ev.measures))


def _look_line(look: int, what: str, level: float, ev: ParityEvidence) -> str:
    det = f"{ev.detectable:.4f}" if ev.detectable is not None else "unbounded"
    bounds = "" if ev.low is None else f" [{ev.low:+.4f}, {ev.high:+.4f}]"
    return (f"parity look {look} ({what}, one-sided level {level:.4g}): {ev.outcome}, difference "
            f"{ev.mean_diff:+.4f}{bounds}, detectable {det}, T {ev.tolerance:.4f}")
