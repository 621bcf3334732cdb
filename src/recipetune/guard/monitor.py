"""After approval: a run fed block by block through the watch's design (guard/drift.py's ``Plan``).

The sequential test of ``recipetune watch`` (docs/guard.md, "After approval: recipetune watch"): the
run's curve in as it grows, events out (each judged block, a warning, its all-clear, the alarm) and
the finding. A block counts beyond the boundary on either side; ``persist`` blocks in a row on one side
alarm (the chance the plan's boundary was set for), fewer are a warning that clears; a non-finite loss
alarms at once. No statistics are computed here: the plan holds them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from recipetune.core.words import Word
from recipetune.guard.drift import Curve, DriftInputError, Plan


class Outcome(Word):
    """What a watch decides (its finding's ``decision``)."""

    ALARM = "ALARM"  # the gap stayed beyond the boundary on one side for `persist` blocks, or a loss is not finite
    NO_ALARM = "NO ALARM"  # every judged block within the boundary, or back within it before `persist` blocks


class Side(Word):
    """Where a gap puts the run: the alarm's and each warning's ``direction``."""

    ABOVE = "above"  # the run's loss above the baseline's curve
    BELOW = "below"  # below it: repeated or leaked data, a loss over fewer tokens


class Measure(Word):
    """The loss a watch judges: its name in the metrics stream (the finding's ``measure``)."""

    LOSS = "loss"
    VAL_LOSS = "val_loss"

    @property
    def said(self) -> str:
        return "training loss" if self is Measure.LOSS else "validation loss"


def direction(gap: float) -> Side:
    """Where a gap puts the run: above or below the baseline's curve."""
    return Side.ABOVE if gap > 0 else Side.BELOW


class EventKind(Word):
    """What an ``Event`` reports."""

    BLOCK = "block"  # a block judged: its gap and bound
    WARNING = "warning"  # a block beyond the boundary that starts a streak short of ``persist``
    CLEARED = "cleared"  # a streak ended: back within the boundary, or beyond it on the other side
    ALARM = "alarm"  # ``persist`` blocks in a row beyond the boundary on one side, or a non-finite loss


@dataclass
class Event:
    kind: EventKind
    step: int  # the last step of the block that caused it
    gap: float  # that block's mean gap (nats): run - baseline
    bound: float  # the gap beyond which a block counts, on either side (h x sd), nats
    message: str = ""
    measure: Measure = Measure.LOSS  # the curve whose block caused it



@dataclass(eq=False)  # a monitor is one test, compared by identity (its plan holds arrays: no == on them)
class Monitor:
    """The sequential test, fed the run's curve as it grows: ``feed`` judges every block the run has
    finished since the last call and returns what happened. A block counts beyond the boundary on
    either side (``gap > bound`` above, ``gap < -bound`` below); a streak is on one side."""

    plan: Plan
    tolerance: float  # T, to state gaps in
    measure: Measure = Measure.LOSS  # the curve judged
    done: int = 0  # blocks judged
    streak: int = 0
    side: Side | None = None  # the streak's side (None: no streak)
    streak_start: int | None = None
    peak: float = 0.0  # the streak's largest gap from the baseline, signed
    alarm: Event | None = None
    warnings: list[dict] = field(default_factory=list)
    gaps: list[tuple[int, float, float]] = field(default_factory=list)  # (last step, gap, bound) per block

    @property
    def finished(self) -> bool:
        return self.alarm is not None or self.done >= len(self.plan.blocks)

    def diverged(self, curve: Curve, measure: Measure) -> list[Event]:
        """An alarm at once where ``curve`` (the judged one, or the training loss beside a judged
        validation loss) holds a non-finite value: no statistics needed."""
        bad = curve.steps[~np.isfinite(curve.loss)]
        if not len(bad) or self.alarm is not None:
            return []
        self.alarm = Event(EventKind.ALARM, int(bad[0]), math.inf, math.nan,
                           f"non-finite {measure.said} at step {int(bad[0])}", measure)
        return [self.alarm]

    def feed(self, run: Curve) -> list[Event]:
        events: list[Event] = []
        last = int(run.steps[-1]) if len(run.steps) else -1
        if diverged := self.diverged(run, self.measure):
            return diverged
        while not self.finished and last >= self.plan.blocks[self.done][-1]:
            events += self.judge_next(run)
        return events

    @property
    def next_end(self) -> int:
        """The last step of the next block to judge (the monitor is not finished)."""
        return int(self.plan.blocks[self.done][-1])

    def judge_next(self, run: Curve) -> list[Event]:
        """Judge the next block (the run has logged through its last step)."""
        events = self._judge(self.done, run)
        self.done += 1
        for e in events:
            e.measure = self.measure
        return events

    def _judge(self, k: int, run: Curve) -> list[Event]:
        steps, base = self.plan.blocks[k], self.plan.base[k]
        mine = run.at(steps)
        logged = ~np.isnan(mine)
        if logged.sum() * 2 < len(steps):
            raise DriftInputError(f"steps do not line up: the run logged {int(logged.sum())} of the baseline's "
                                  f"{len(steps)} steps {int(steps[0])}-{int(steps[-1])}")
        end, bound = int(steps[-1]), float(self.plan.bounds[k])
        gap = float(np.mean(mine[logged] - base[logged]))
        self.gaps.append((end, gap, bound))
        events = [Event(EventKind.BLOCK, end, gap, bound)]
        side = Side.ABOVE if gap > bound else Side.BELOW if gap < -bound else None
        if self.streak and side is not self.side:  # back within, or beyond on the other side: the streak ends
            events.append(self._clear(end, gap, bound))
        if side is not None:
            if self.streak == 0:
                self.side, self.streak_start, self.peak = side, int(steps[0]), gap
            self.streak += 1
            self.peak = gap if abs(gap) > abs(self.peak) else self.peak
            if self.streak >= self.plan.persist:
                self.alarm = Event(EventKind.ALARM, end, gap, bound,
                                   self._said(gap, bound, f"since step {self.streak_start}"))
                events.append(self.alarm)
            elif self.streak == 1:
                events.append(Event(EventKind.WARNING, end, gap, bound, self._said(gap, bound, "one block")))
        return events

    def _clear(self, end: int, gap: float, bound: float) -> Event:
        self.warnings.append({"from_step": self.streak_start, "to_step": end, "blocks": self.streak,
                              "direction": direction(self.peak), "peak_gap": self.peak, "cleared_at": end})
        event = Event(EventKind.CLEARED, end, gap, bound, f"the gap came back to {gap:+.4f} nats after {self.streak} "
                      f"block(s) {direction(self.peak)} the baseline's curve beyond the boundary")
        self.streak, self.side, self.streak_start = 0, None, None
        return event

    def _said(self, gap: float, bound: float, span: str) -> str:
        in_t = f" ({gap / self.tolerance:+.1f} T)" if self.tolerance > 0 else ""
        return (f"{self.measure.said} {direction(gap)} the baseline's: gap {gap:+.4f} "
                f"nats{in_t} beyond the boundary {math.copysign(bound, gap):+.4f} ({span})")

    @property
    def outcome(self) -> Outcome:
        return Outcome.ALARM if self.alarm is not None else Outcome.NO_ALARM

    def finding(self) -> dict:
        p = self.plan
        alarm = None
        if self.alarm is not None:
            a = self.alarm
            alarm = {"step": a.step, "crossed_at_step": self.streak_start if math.isfinite(a.gap) else a.step,
                     "direction": direction(a.gap) if math.isfinite(a.gap) else None,
                     "gap_nats": a.gap if math.isfinite(a.gap) else None,
                     "bound_nats": a.bound if math.isfinite(a.bound) else None,
                     "gap_in_T": a.gap / self.tolerance if self.tolerance > 0 and math.isfinite(a.gap) else None,
                     "message": a.message}
        n = p.noise
        open_warning = [{"from_step": self.streak_start, "to_step": None, "blocks": self.streak,
                         "direction": direction(self.peak), "peak_gap": self.peak, "cleared_at": None}]
        return {
            "alarm": alarm,
            "measure": self.measure,
            "warnings": self.warnings + (open_warning if self.streak and not alarm else []),
            "blocks_judged": self.done,
            "last_judged_step": self.gaps[-1][0] if self.gaps else None,
            "tolerance_T": self.tolerance,
            "design": p.describe(),
            "noise": {"offset_sd": n.offset, "offset_source": n.offset_source, "offset_dof": n.dof, "block_sd": n.block,
                      "tau_points": n.tau, "baseline_curves": max(p.m) if p.m else 0},
            "gaps": [{"step": s, "gap": g, "bound": b} for s, g, b in self.gaps],
        }


@dataclass
class Monitors:
    """Several loss measures of one run, each through its own monitor (its plan's ``alpha`` a share of
    the whole run's: with ``alpha / k`` each, an equivalent run alarms on any of the k with chance at
    most ``alpha``, whatever their correlation), judged block by block in step order across them (a
    tie: in the order given), so that the first alarm on any ends the watch at the same block in a
    finished run and in a followed one."""

    monitors: list[Monitor]

    def __iter__(self) -> Iterator[Monitor]:
        return iter(self.monitors)

    @property
    def alarmed(self) -> Monitor | None:
        return next((m for m in self.monitors if m.alarm is not None), None)

    @property
    def alarm(self) -> Event | None:
        m = self.alarmed
        return m.alarm if m is not None else None

    @property
    def decider(self) -> Monitor:
        """The monitor whose finding decides: the one that alarmed, else the first."""
        return self.alarmed or self.monitors[0]

    @property
    def finished(self) -> bool:
        return self.alarm is not None or all(m.finished for m in self.monitors)

    @property
    def last_step(self) -> int:
        """The last step any plan covers."""
        return max(int(m.plan.blocks[-1][-1]) for m in self.monitors)

    def feed(self, runs: dict[Measure, Curve], final: bool) -> list[Event]:
        """Judge every block the run has logged since the last call, in step order across the measures.
        A block waits for its own measure's point at its last step while an earlier-ending block of
        another measure waits (``final``: the stream is whole, nothing more will come: a measure that
        will not reach its next block is left there). A non-finite training loss alarms at once, judged
        or not (on the first monitor where the training loss is not one of them)."""
        for measure in dict.fromkeys([Measure.LOSS, *(m.measure for m in self.monitors)]):
            owner = next((m for m in self.monitors if m.measure is measure), self.monitors[0])
            if measure in runs and (diverged := owner.diverged(runs[measure], measure)):
                return diverged
        events: list[Event] = []
        left = [m for m in self.monitors if not m.finished]
        while left and self.alarm is None:
            first = min(left, key=lambda m: m.next_end)  # min keeps the order given on a tie
            run = runs[first.measure]
            if len(run.steps) and run.steps[-1] >= first.next_end:
                events += first.judge_next(run)
                if first.finished:
                    left.remove(first)
            elif final:
                left.remove(first)  # its curve ends before its next block: nothing more to judge there
            else:
                break  # wait for it: a later block of another measure is judged after it
        return events
