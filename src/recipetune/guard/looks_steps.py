"""The steps design (guard/looks.py's docstring: **steps**): a trainer whose repeats are identical (no seed
knob, a constant seed inside; also repeats that differ by float noise only) adds evidence only with longer
runs. One candidate run at the profile's length; if it cannot tell, pairs up to the length the plan says
resolves T (at most ``parity.max_steps_factor`` times), one at the geometric middle first when that length
is 4x or more, the rest of alpha split between them (core/sequential.py: ``SeparateLooks``, Bonferroni); a
look whose longest allowed pair would most likely not tell stops for futility, and a proof too long says
what would shorten it."""

from __future__ import annotations

import math
import time

from recipetune.core.fmt import fmt_duration
from recipetune.core.sequential import SeparateLooks, factor_needed, predictive_power
from recipetune.core.stats import paired, quantile
from recipetune.core.words import LooksStop, ParityOutcome
from recipetune.guard.look import Gathered, Looking, Stop, Wanted, grows, look_line, not_shown, stopped
from recipetune.guard.loss import MIN_TAIL
from recipetune.guard.parity import (
    Measurements,
    ParityEvidence,
    judge,
    loss_line_note,
    measure,
)


def by_steps(v: Looking) -> Gathered:
    """Identical repeats: one candidate run at the profile's length, then longer pairs up to the length
    that resolves T, with one pair between when that length is 4x or more: an effect that fades with
    training still shows there, and a difference shown beyond noise at any longer look blocks approval
    at every later one (parity.py: the fade rule)."""
    p = v.settings.parity
    split = _split(v)
    name = "repeat-0" if v.seed(0) is None else f"seed-{v.seed(0)}"
    _say_steps_plan(v)
    got = v.gather([Wanted("candidate", 0, v.candidate, v.cand_steps, v.out_dir / "parity" / name)], 1)
    if isinstance(got, str):
        return Gathered(None, got, v.runs.launched, v.notes, v.runs.reused, 1, LooksStop.FAILED)
    m = measure(v.profile, list(got.values()), p, v.equal_tokens, v.profile.runs[:1])
    ev = judge(m, p, split.at_first)
    line = look_line(1, "1x the steps", split.at_first, ev)
    factor, look, planned, plan = 1.0, 1, 1, 0.0
    while True:
        ended = _steps_ended(v, m, ev, line, factor, planned)
        if ended is not None:
            return ended
        need, what = _steps_need(v, m, factor, split.at_later)
        # The plan never shrinks (as the seeds' plan): the first look's error sized it, and a middle look
        # that reads smaller by chance would otherwise end the looks short of it, at a last look too short
        # to show the difference within T.
        own = float(min(p.max_steps_factor, max(2 * factor, math.ceil(need))))
        target = max(plan, own)
        plan = target
        futile = _steps_futile(v, m, ev, line, factor, what) if look < split.looks and target > factor else None
        if futile is not None:
            stopped(v, ev, futile)
            return _steps_gathered(v, ev, planned, LooksStop.FUTILITY, factor)
        if look == split.looks or target <= factor:
            v.say(line)
            ev.reasons.append(f"after {look} look(s): {what} (guard.parity.max_steps_factor {p.max_steps_factor})")
            return _steps_gathered(v, ev, planned, LooksStop.PLAN if look == split.looks else LooksStop.BUDGET, factor)
        # From the profile's length, a pair between when the plan is 4x or more (geometric middle).
        nxt = float(math.ceil(math.sqrt(target))) if look == 1 and target >= 4 else target
        cost = v.cost(v.baseline, round(v.profile.steps * nxt)) + v.cost(v.candidate, round(v.cand_steps * nxt))
        planned = round(planned + 2 * nxt)
        if (over := _steps_over_budget(v, ev, line, nxt, cost, what)) is not None:
            stopped(v, ev, over)
            return _steps_gathered(v, ev, planned, LooksStop.BUDGET, factor)
        v.say(_plan_line(v, line, target, own, nxt, cost))
        look, factor = look + 1, nxt
        got = v.gather(_longer_pair(v, nxt, name), look)
        if isinstance(got, str):
            return Gathered(None, got, v.runs.launched, v.notes, v.runs.reused, planned, LooksStop.FAILED)
        m = measure(v.profile, [got["candidate", 0]], p, v.equal_tokens, [got["baseline", 0]])
        ev = judge(m, p, split.at_later, longer=factor)
        line = look_line(look, f"{factor:g}x the steps", split.at_later, ev)


def _plan_line(v: Looking, line: str, target: float, own: float, nxt: float, cost: float) -> str:
    """The look's line with the plan it leaves: the length T needs (kept where this look alone says less)
    and the next pair's length and expected time."""
    kept = f" (kept: this look alone says {own:g}x)" if own < target else ""
    return (f"{line}; plan: {target:g}x the steps{kept}, the next pair at {nxt:g}x "
            f"({round(v.cand_steps * nxt)} steps, ~{fmt_duration(v.seconds(cost))})")


def _longer_pair(v: Looking, factor: float, name: str) -> list[Wanted]:
    """The baseline and the candidate at ``factor`` times the profile's length, side by side."""
    sub = f"x{factor:g}"
    return [Wanted("baseline", 0, v.baseline, round(v.profile.steps * factor), v.out_dir / "baseline" / sub / name),
            Wanted("candidate", 0, v.candidate, round(v.cand_steps * factor), v.out_dir / "parity" / sub / name)]


def _split(v: Looking) -> SeparateLooks:
    """The steps' looks are separate pairs of runs: the first at the profile's length, at most two longer."""
    return SeparateLooks(v.settings.parity.alpha, v.settings.parity.first_look)


def _say_steps_plan(v: Looking) -> None:
    """Say before the candidate runs what the steps' looks may spend: only longer runs add evidence."""
    p = v.settings.parity
    v.say(f"parity plan: T {v.profile.loss_tolerance:.4f} nats; the baseline's repeats are identical (or differ "
          f"by float noise only), so only longer runs add evidence: one candidate run at {v.cand_steps} steps, "
          f"then, if it cannot tell, pairs up to the length that resolves T (at most {p.max_steps_factor}x); at most "
          f"{v.settings.max_parity_runs} run(s) of {v.profile.steps} steps (guard.max_parity_runs); "
          f"{_steps_forecast(v)}")


def _steps_forecast(v: Looking) -> str:
    """What the looks are expected to spend if the candidate trains on other batches than the baseline's: a
    pair's difference then has about sqrt(2) times one run's within-run error (the profile's reference), and
    the runs must grow until that resolves T (``factor_needed``)."""
    p = v.settings.parity
    se = math.sqrt(2.0) * v.profile.loss_reference
    need = factor_needed(se, v.profile.loss_tolerance, _split(v).at_later, p.power)
    if need <= 1.0:
        return f"the first run is expected to decide (~{fmt_duration(v.seconds(1))})"
    last = float(min(p.max_steps_factor, max(2, math.ceil(need))))
    factors = [float(math.ceil(math.sqrt(last))), last] if last >= 4 else [last]
    runs = 1 + sum(2 * f for f in factors)
    beyond = (f"; about {need:.0f}x would be needed, beyond the cap, unless the candidate's loss is quieter than "
              f"the baseline's (the first look tells)") if need > p.max_steps_factor else ""
    return (f"if its batches differ from the baseline's and its loss line is as noisy, expected: pairs at "
            f"{', '.join(f'{f:g}x' for f in factors)} ({runs:g} runs of the profile's length, "
            f"~{fmt_duration(v.seconds(runs))}){beyond}")


def _steps_gathered(v: Looking, ev: ParityEvidence, planned: int, stop: LooksStop, factor: float) -> Gathered:
    """What the steps' looks gathered, ended by ``stop`` at runs ``factor`` times the profile's length."""
    return Gathered(ev, "", v.runs.launched, v.notes, v.runs.reused, planned, stop,
                    {"pairs": 1, "factor": factor, "at_once": v.at_once})


def _steps_ended(v: Looking, m: Measurements, ev: ParityEvidence, line: str, factor: float,
                 planned: int) -> Gathered | None:
    """The look decided, or the fade rule or the trend ends the verdict: longer runs cannot change it."""
    if ev.outcome != ParityOutcome.INCONCLUSIVE or m.problems:
        v.say(line)
        if factor > 1 and (advice := _advice(v, m, factor)):  # decided, but on runs longer than the profile's
            v.say(f"the proof took runs {factor:g}x the profile's length{advice}")
        return _steps_gathered(v, ev, planned, LooksStop.DECIDED, factor)
    if any(x.fades for x in ev.measures) or grows(ev):
        why = ("a gap shown growing over the window blocks approval" if grows(ev) else
               f"a difference shown beyond noise at {factor:g}x blocks approval at any longer look")
        v.say(f"{line}; {why}: stopped")
        return _steps_gathered(v, ev, planned, LooksStop.TREND if grows(ev) else LooksStop.DECIDED, factor)
    return None


def _steps_need(v: Looking, m: Measurements, factor: float, level: float) -> tuple[float, str]:
    """How long the runs must be: as long as T needs at this look's error (it shrinks as 1 / sqrt(tokens));
    or, when the runs logged too few losses to have an error, long enough to have one."""
    p = v.settings.parity
    if m.samples:
        x = m.samples[0]
        se = paired([c - b for b, c in zip(x.baseline_finals, x.candidate_finals, strict=True)], x.ses, False).se
        need = factor * factor_needed(se, x.tolerance, level, p.power, m.two_sided)
        return need, f"runs of about {math.ceil(need * v.profile.steps)} steps would resolve T{_advice(v, m, need)}"
    need = factor * MIN_TAIL / max(1, m.tail_records)
    return need, f"runs of about {math.ceil(need * v.profile.steps)} steps would log enough losses to tell"


def _advice(v: Looking, m: Measurements, need: float) -> str:
    """What would shorten a proof that needs runs ``need`` times the profile's length, measured from these
    runs. Where the loss line's noise differs between the two recipes beyond chance (parity.py:
    ``loss_line_note``: one micro-batch's loss), a line carrying the step's loss puts both sides at the
    quieter one's noise q. The steps needed go as the pair's variance over T^2: with T set in nats
    (``parity.margin``) they shrink by 2 q^2 / (b^2 + c^2); with T measured on the baseline's own within-run
    noise (the default) T shrinks with it, and they change by 2 b^2 / (b^2 + c^2), b the baseline's: shorter
    only where the baseline is the quieter side (nanoGPT's 2 x 16 against 32 x 1 gets longer: measured,
    docs/benchmarks.md). Said only where it shortens. A seed knob the trainer reads lets repeats at the
    profile's length add evidence instead of longer runs."""
    if need <= 1.0:
        return ""
    b, c = m.noise.get("baseline", 0.0), m.noise.get("candidate", 0.0)
    said = []
    if loss_line_note(b, c, m.tail_records):
        kept = min(b, c) if v.settings.parity.margin is not None else b
        shorter = need * 2 * kept**2 / (b**2 + c**2)
        if shorter < need:
            said.append(f"a loss line that is the step's loss (its noise {min(b, c):.3g} nats a step, as the "
                        f"{'candidate' if c < b else 'baseline'}'s, not {max(b, c):.3g}) would resolve it in runs "
                        f"of about {math.ceil(shorter * v.profile.steps)} steps")
    said.append(f"a seed knob the trainer reads would let repeats of {v.profile.steps} steps add evidence instead "
                f"of longer runs")
    return "; to shorten the proof: " + "; ".join(said)


def _steps_futile(v: Looking, m: Measurements, ev: ParityEvidence, line: str, factor: float,
                  what: str) -> Stop | None:
    """Why the looks end where the longest pair they may run would most likely not tell (``_steps_chance``
    below parity.futility); None where it likely would."""
    p = v.settings.parity
    chance = _steps_chance(m, factor, _split(v).at_later, p.max_steps_factor)
    if chance is None or chance >= p.futility:
        return None
    pct, cap, level = f"{100 * chance:.0f}%", f"{p.max_steps_factor}x", f"{100 * p.futility:.0f}%"
    return Stop(f"{line}; the chance that runs {cap} as long tell (equivalent or different beyond T) is {pct}, "
                f"below parity.futility {level}: stopped",
                not_shown(ev, f"runs {cap} as long (guard.parity.max_steps_factor) would tell with a chance of "
                              f"{pct} (parity.futility {level}); {what}"))


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


def _steps_over_budget(v: Looking, ev: ParityEvidence, line: str, nxt: float, cost: float,
                       what: str) -> Stop | None:
    """Why the looks end where the next pair would pass guard.max_parity_runs or guard.max_parity_s; None
    within both."""
    late = v.settings.max_parity_s is not None and \
        time.monotonic() - v.started + v.seconds(cost) > v.settings.max_parity_s
    if cost > v.settings.max_parity_runs - v.spent() + 1e-9 or late:
        cap = "guard.max_parity_s" if late else f"guard.max_parity_runs ({v.settings.max_parity_runs})"
        return Stop(f"{line}; runs {nxt:g}x as long would exceed {cap}: stopped",
                    not_shown(ev, f"{cap} does not allow the pair of runs {nxt:g}x as long; {what}"))
    return None


