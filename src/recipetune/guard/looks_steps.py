"""The steps design (guard/looks.py's docstring: **steps**): a trainer whose repeats are identical (no seed
knob, a constant seed inside; also repeats that differ by float noise only) adds evidence only with longer
runs. One candidate run at the profile's length; if it cannot tell, pairs up to the length the plan says
resolves T (at most ``parity.max_steps_factor`` times), with a look at the geometric middle when that
length is 4x or more: read from the pair as it runs where its records can be read (guard/pair.py), else a
pair of its own first; the rest of alpha split between the looks (core/sequential.py: ``SeparateLooks``,
Bonferroni). A look whose longest allowed pair would most likely not tell stops for futility, and a proof
too long says what would shorten it."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from recipetune.core.fmt import fmt_duration
from recipetune.core.measure import RunResult
from recipetune.core.sequential import SeparateLooks, factor_needed, predictive_power
from recipetune.core.stats import paired, quantile
from recipetune.core.words import LooksStop, ParityOutcome
from recipetune.guard.look import Gathered, Looking, Stop, Wanted, grows, look_line, not_shown, stopped
from recipetune.guard.loss import MIN_TAIL
from recipetune.guard.pair import Pair, follow, halt, halted, read_at
from recipetune.guard.parity import (
    Measurements,
    ParityEvidence,
    judge,
    loss_line_note,
    measure,
)


def by_steps(v: Looking) -> Gathered:
    """Identical repeats: one candidate run at the profile's length, then a longer pair at the length that
    resolves T, with a look at its geometric middle when that length is 4x or more: an effect that fades
    with training still shows there, and a difference shown beyond noise at any longer look blocks approval
    at every later one (parity.py: the fade rule). Where the trainer's records can be read as it runs
    (``Workload.live_records``), the middle look is read from the pair at the plan's length as it passes
    that step, and a middle look that decides stops the pair there; else the middle is a pair of its own."""
    return _Steps(v).run()


@dataclass
class _Steps:
    """One steps verdict's looks: where they are, what the last one showed, the plan, the pair in flight."""

    v: Looking
    look: int = 1
    factor: float = 1.0  # the last look's runs, in profile lengths
    planned: int = 1  # runs of the profile's length the plan has launched
    plan: float = 0.0  # the length T needs (it never shrinks)
    m: Measurements | None = None
    ev: ParityEvidence | None = None
    line: str = ""
    running: Pair | None = None  # the longer pair in flight, read at its middle so far
    blocked: Gathered | None = None  # a middle look that blocked approval while its pair runs on

    def run(self) -> Gathered:
        v, p, split = self.v, self.v.settings.parity, _split(self.v)
        _say_steps_plan(v)
        got = v.gather([Wanted("candidate", 0, v.candidate, v.cand_steps, v.out_dir / "parity" / _name(v))], 1)
        if isinstance(got, str):
            return self._failed(got)
        self._judge(list(got.values()), v.profile.runs[:1], split.at_first, "1x the steps")
        while True:
            m, ev = self.m, self.ev
            assert m is not None and ev is not None
            if self.blocked is not None:  # the pair's end tells a difference beyond T from one within it
                v.say(self.line)
                return self._gathered(LooksStop.DECIDED) if ev.outcome == ParityOutcome.FAILS else self.blocked
            if self.running is not None and (ev.outcome == ParityOutcome.HOLDS and not m.problems or _blocks(m, ev)):
                if (failed := self._run_on()) is not None:
                    return failed
                continue
            if (ended := _steps_ended(v, m, ev, self.line, self.factor, self.planned)) is not None:
                return halted(v, self.running, ended, "the middle look decided")
            need, what = _steps_need(v, m, self.factor, split.at_later)
            # The plan never shrinks (as the seeds' plan): the first look's error sized it, and a middle look
            # that reads smaller by chance would otherwise end the looks short of it, at a last look too short
            # to show the difference within T.
            own = float(min(p.max_steps_factor, max(2 * self.factor, math.ceil(need))))
            self.plan = target = max(self.plan, own)
            # Futility before a pair is started; a pair in flight runs on (its middle reads an effect that grows
            # with the schedule's share smaller than its end would).
            if self.running is None and self.look < split.looks and target > self.factor and \
                    (futile := _steps_futile(v, m, ev, self.line, self.factor, what)) is not None:
                stopped(v, ev, futile)
                return self._gathered(LooksStop.FUTILITY)
            if self.look == split.looks or target <= self.factor:
                v.say(self.line)
                ev.reasons.append(f"after {self.look} look(s): {what} (guard.parity.max_steps_factor "
                                  f"{p.max_steps_factor})")
                return self._gathered(LooksStop.PLAN if self.look == split.looks else LooksStop.BUDGET)
            if self.running is not None and target <= self.running.factor:  # its end is the next look
                v.say(f"{self.line}; plan: {target:g}x the steps{_kept(own, target)}, the "
                      f"{self.running.factor:g}x pair runs on")
                failed = self._end()
            else:
                failed = self._launch(target, own, what)
            if failed is not None:
                return failed

    def _judge(self, candidates: list[RunResult], baselines: list[RunResult], level: float, what: str) -> None:
        p = self.v.settings.parity
        self.m = measure(self.v.profile, candidates, p, self.v.equal_tokens, baselines)
        self.ev = judge(self.m, p, level, longer=self.factor)
        self.line = look_line(self.look, what, level, self.ev)

    def _gathered(self, stop: LooksStop) -> Gathered:
        assert self.ev is not None
        return _steps_gathered(self.v, self.ev, self.planned, stop, self.factor)

    def _failed(self, cause: str) -> Gathered:
        v = self.v
        return Gathered(None, cause, v.runs.launched, v.notes, v.runs.reused, self.planned, LooksStop.FAILED)

    def _run_on(self) -> Gathered | None:
        """A middle look read from the pair in flight that held, or that blocked approval: the pair runs on,
        and its end is the next look. A look cut from a longer run is read at the middle of that run's
        schedule, not at the end of one (a learning rate that decays to the run's last step), and reads an
        effect that grows with the schedule's share smaller than a run of its length would: it may block
        approval or reject, but only an end approves, and a blocked verdict learns from the end whether
        the difference is beyond T (REJECTED) or not (KEEP BASELINE), as a middle pair of its own would
        have shown."""
        assert self.ev is not None and self.running is not None
        if self.ev.outcome == ParityOutcome.HOLDS:
            self.v.say(f"{self.line}; a look cut from a running pair approves nothing: the "
                       f"{self.running.factor:g}x pair runs on")
        else:
            self.v.say(f"{self.line}; {_block_why(self.ev, self.factor)}; the {self.running.factor:g}x pair runs "
                       f"on: its end tells whether the difference is beyond T")
            self.blocked = self._gathered(LooksStop.TREND if grows(self.ev) else LooksStop.DECIDED)
        return self._end()

    def _end(self) -> Gathered | None:
        """The look at the end of the pair in flight; a failed candidate run ends the verdict."""
        pair, self.running = self.running, None
        assert pair is not None
        v = self.v
        if v.workload.live_records:
            follow(v, pair, self.look + 1)
        got = v.gather(pair.wanted, self.look + 1, pair.futures)
        if isinstance(got, str):
            return self._failed(got)
        self.look, self.factor = self.look + 1, pair.factor
        self._judge([got["candidate", 0]], [got["baseline", 0]], _split(v).at_later, f"{pair.factor:g}x the steps")
        return None

    def _launch(self, target: float, own: float, what: str) -> Gathered | None:
        """Start the next pair: at the plan's length, read at its geometric middle as it runs when the plan is
        4x or more from the profile's length; where a run cannot be read until it ends, the middle is a pair
        of its own first. A pair in flight that the plan outgrew is stopped, unless the longer pair would not
        fit the budget: then it runs on."""
        v = self.v
        mid, live = _middle(v, target) if self.look == 1 else (None, False)
        length = target if live or mid is None else mid
        cost = v.cost(v.baseline, round(v.profile.steps * length)) + v.cost(v.candidate, round(v.cand_steps * length))
        back = 0.0 if self.running is None else \
            sum(w.steps - self.running.cut(w) for w in self.running.wanted) / v.profile.steps
        assert self.ev is not None
        over = _steps_over_budget(v, self.ev, self.line, length, cost - back, what)
        if over is not None and self.running is not None:
            v.say(f"{over.line.removesuffix(': stopped')}: the {self.running.factor:g}x pair runs on")
            return self._end()
        self.planned = round(self.planned + 2 * length)
        if over is not None:
            stopped(v, self.ev, over)
            return self._gathered(LooksStop.BUDGET)
        v.say(_plan_line(v, self.line, target, own, length, mid if live else None, cost))
        if self.running is not None:
            halt(v, self.running, f"the plan grew to {target:g}x the steps")
            self.running = None
        wanted = _longer_pair(v, length, _name(v))
        pair = Pair(wanted, v.start(wanted), length, mid if live else None)
        if pair.mid is None:
            self.running = pair
            return self._end()
        got = read_at(v, pair, self.look + 1)
        if isinstance(got, str):
            return halted(v, pair, self._failed(got), "a candidate run failed")
        self.look, self.factor, self.running = self.look + 1, pair.mid, pair
        self._judge([got["candidate", 0]], [got["baseline", 0]], _split(v).at_later,
                    f"{pair.mid:g}x the steps, read as the {length:g}x pair runs")
        return None


def _middle(v: Looking, length: float) -> tuple[float | None, bool]:
    """Where a pair ``length`` times the profile's is looked at before its end (the geometric middle, when it
    is 4x or more), and whether that look is read from the pair as it runs (the trainer's records can be
    read while it trains) rather than trained as a pair of its own."""
    mid = float(math.ceil(math.sqrt(length))) if length >= 4 else None
    return mid, mid is not None and v.workload.live_records


def _name(v: Looking) -> str:
    return "repeat-0" if v.seed(0) is None else f"seed-{v.seed(0)}"


def _kept(own: float, target: float) -> str:
    return f" (kept: this look alone says {own:g}x)" if own < target else ""


def _plan_line(v: Looking, line: str, target: float, own: float, length: float, mid: float | None,
               cost: float) -> str:
    """The look's line with the plan it leaves: the length T needs (kept where this look alone says less),
    the next pair's length and expected time, and where it is read as it runs."""
    read = f", read at {mid:g}x as it runs" if mid is not None else ""
    return (f"{line}; plan: {target:g}x the steps{_kept(own, target)}, the next pair at {length:g}x "
            f"({round(v.cand_steps * length)} steps, ~{fmt_duration(v.seconds(cost))}){read}")


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
    middle, live = _middle(v, last)
    factors = [middle, last] if middle is not None and not live else [last]
    runs = 1 + sum(2 * f for f in factors)
    read = f", read at {middle:g}x as it runs" if live else ""
    beyond = (f"; about {need:.0f}x would be needed, beyond the cap, unless the candidate's loss is quieter than "
              f"the baseline's (the first look tells)") if need > p.max_steps_factor else ""
    pairs = f"{'a pair' if live else 'pairs'} at {', '.join(f'{f:g}x' for f in factors)}{read}"
    return (f"if its batches differ from the baseline's and its loss line is as noisy, expected: {pairs} "
            f"({runs:g} runs of the profile's length, ~{fmt_duration(v.seconds(runs))}){beyond}")


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
    if _blocks(m, ev):
        v.say(f"{line}; {_block_why(ev, factor)}: stopped")
        return _steps_gathered(v, ev, planned, LooksStop.TREND if grows(ev) else LooksStop.DECIDED, factor)
    return None


def _blocks(m: Measurements, ev: ParityEvidence) -> bool:
    """An undecided look that blocks approval at every later one: a difference shown beyond noise on runs
    longer than the profile's (the fade rule), or a gap shown growing."""
    return ev.outcome == ParityOutcome.INCONCLUSIVE and not m.problems and \
        (any(x.fades for x in ev.measures) or grows(ev))


def _block_why(ev: ParityEvidence, factor: float) -> str:
    return ("a gap shown growing over the window blocks approval" if grows(ev) else
            f"a difference shown beyond noise at {factor:g}x blocks approval at any longer look")


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


