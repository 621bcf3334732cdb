"""The guard's own clock: when each line of a run's metrics arrives, seen by a thread the guard owns.

A trainer's printed step time is a claim. litgpt's "iter time" covers one micro-batch and the optimizer
step, not the step; a trainer may start its timer late or leave its data loading out. The runner
therefore tails the files a run's metrics come through (stdout and stderr, or the JSONL stream the
trainer writes; children run unbuffered) and stamps each complete line with the moment it appeared.
The time between two step lines, divided by the steps between them, is the guard's time per step.

``LineClock`` polls with an interval it adapts to the lines' pace (a tenth of the last gap, 1 to 50 ms),
each poll an ``fstat`` of an open file: its thread's CPU time is recorded with every run
(``ClockReading.poll_cpu_s``). An arrival is known to within the time since the poll before it;
that resolution enters every figure's error, so steps shorter than the clock can see are "cannot
tell", never "disagree".

What it cannot see: a trainer whose output is buffered (its lines come in bursts, or all at exit).
Then the lines arrive faster than even the trainer says its steps ran; the clock says so and falls
back to the process's wall time over the run, start-up included (a figure that dilutes speed-ups,
never inflates them).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from recipetune.core.measure import (
    CLOCK_Z,
    MEDIAN_ERROR,
    THROUGHPUT_WINDOWS,
    ClockReading,
    RunResult,
    StepRecord,
    windows,
)
from recipetune.core.robust import mad_sigma

MIN_POLL_S = 0.001
MAX_POLL_S = 0.05
COMPARE_SLACK = 0.005  # two recipes' disagreements must differ by more than this to matter to a ratio


@dataclass(frozen=True)
class Arrival:
    t: float  # seconds since the run started, when a poll first saw the line
    uncertainty: float  # the line appeared at most this long before ``t`` (the time since the poll before)
    text: str


class LineClock:
    """Tails ``paths`` from a thread while a run goes (a context manager): ``arrivals`` once it ends.

    Files that do not exist yet are opened when they appear; a file rewritten from the start is read
    again from its start."""

    def __init__(self, paths: Sequence[Path], start: float | None = None):
        self.paths = list(paths)
        self.start = time.perf_counter() if start is None else start
        self.arrivals: list[Arrival] = []
        self.poll_cpu_s = 0.0
        self.resolution_s = 0.0
        self._fds: dict[int, int] = {}
        self._offsets = [0] * len(self.paths)
        self._partial = [b""] * len(self.paths)
        self._last_poll = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="recipetune-clock", daemon=True)

    def __enter__(self) -> LineClock:
        if self.paths:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.paths:
            return
        self._stop.set()
        self._thread.join()
        self._poll()  # the child has ended: its last lines
        for fd in self._fds.values():
            os.close(fd)

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        interval, last_line = MIN_POLL_S * 5, None
        while not self._stop.is_set():
            time.sleep(interval)  # cheaper than a timed wait on an event; the run's end waits one interval at most
            now = self._poll()
            if now is not None:
                gap = now - last_line if last_line is not None else MAX_POLL_S * 10
                last_line = now
                interval = min(MAX_POLL_S, max(MIN_POLL_S, gap / 10))
            elif last_line is None:
                interval = min(MAX_POLL_S, interval * 1.5)  # start-up: nothing to time yet
        self.poll_cpu_s = time.thread_time() - cpu0

    def _poll(self) -> float | None:
        """Read what each file gained; the time of this poll if a complete line arrived."""
        now = time.perf_counter()
        uncertainty, self._last_poll = now - self._last_poll, now
        seen = False
        for i, path in enumerate(self.paths):
            chunk = self._read(i, path)
            if not chunk:
                continue
            lines = (self._partial[i] + chunk).split(b"\n")
            self._partial[i] = lines.pop()  # a line still being written waits for the next poll
            for line in lines:
                self.arrivals.append(Arrival(now - self.start, uncertainty, line.decode(errors="replace")))
                seen = True
        if seen:
            self.resolution_s = max(self.resolution_s, uncertainty)
        return now if seen else None

    def _read(self, i: int, path: Path) -> bytes:
        fd = self._fds.get(i)
        if fd is None:
            try:
                fd = self._fds[i] = os.open(path, os.O_RDONLY)
            except OSError:
                return b""
        size = os.fstat(fd).st_size
        if size < self._offsets[i]:  # rewritten from the start
            self._offsets[i], self._partial[i] = 0, b""
        if size == self._offsets[i]:
            return b""
        chunk = os.pread(fd, size - self._offsets[i], self._offsets[i])
        self._offsets[i] += len(chunk)
        return chunk


Kind = Callable[[str], "tuple[str, int] | None"]  # a line -> ("step" | "val", step number), or None


def _classified(arrivals: Sequence[Arrival], kind: Kind) -> list[tuple[Arrival, str, int]]:
    """The step and validation lines among ``arrivals``: (arrival, "step" | "val", step number)."""
    return [(a, *hit) for a in arrivals if (hit := kind(a.text)) is not None]


def _first_steps(lines: list[tuple[Arrival, str, int]]) -> dict[int, Arrival]:
    """Each step's first line (several ranks may print one step)."""
    first: dict[int, Arrival] = {}
    for a, what, step in lines:
        if what == "step":
            first.setdefault(step, a)
    return first


def stamp(steps: list[StepRecord], arrivals: Sequence[Arrival], kind: Kind) -> list[StepRecord]:
    """``steps`` with ``clock_s``: the guard's time per step over the gap that ended with the step's line,
    where the gap holds no validation line (a validation's work is not a step's) and follows a step line.
    Lines that one poll saw together (a trainer that writes its lines in bursts, e.g. once per loss sync)
    share their gap: each of their steps gets the gap over all of them, never a zero."""
    lines = _classified(arrivals, kind)
    first = _first_steps(lines)
    vals = [a.t for a, what, _ in lines if what == "val"]
    # runs of consecutive steps whose lines arrived in one poll: (index of the run's last step) for each step
    ends = list(range(len(steps)))
    for i in range(len(steps) - 2, -1, -1):
        here, nxt = first.get(steps[i].step), first.get(steps[i + 1].step)
        if here is not None and nxt is not None and nxt.t == here.t:
            ends[i] = ends[i + 1]
    out, prev = [], None
    for i, s in enumerate(steps):
        here = first.get(s.step)
        clock = None
        if here is not None and prev is not None and s.step > prev[0]:
            t0, last = prev[1].t, steps[ends[i]].step
            if here.t > t0 and not any(t0 < v <= here.t for v in vals):
                clock = (here.t - t0) / (last - prev[0])
        out.append(s.model_copy(update={"clock_s": clock}) if clock is not None else s)
        if here is None:
            prev = None
        elif ends[i] == i:  # the last of its poll's lines: the next gap starts here
            prev = (s.step, here)
    return out


def read(measured: list[StepRecord], arrivals: Sequence[Arrival], wall_s: float, steps_done: int,
         poll_cpu_s: float, kind: Kind) -> ClockReading | None:
    """The guard's clock against the trainer's over a run's measured steps (``measured``, already
    stamped). None when no step line was seen at all (nothing to time)."""
    timed = [s for s in measured if s.clock_s is not None]
    claimed = sum(s.step_time_s for s in measured)
    lines = _classified(arrivals, kind)
    resolution = max((a.uncertainty for a, _, _ in lines), default=0.0)
    if not measured or claimed <= 0 or not any(what == "step" for _, what, _ in lines):
        return None  # no step line came through the timed files (a CSV route): nothing this clock can vouch for
    span = sum(s.clock_s for s in timed)  # type: ignore[misc]
    claimed_timed = sum(s.step_time_s for s in timed)
    bunched = not timed or span + 2 * resolution < 0.5 * claimed_timed
    if bunched:
        # Lines came faster than even the trainer says its steps ran: its output is buffered. The
        # process's wall time over the run is all this clock can vouch for.
        per_step = wall_s / max(steps_done, 1)
        q = math.log(per_step / (claimed / len(measured)))
        return ClockReading(source="run", steps=steps_done, claimed_step_s=claimed / len(measured),
                            clock_step_s=per_step, log_ratio=q, error=0.0, resolution_s=resolution,
                            poll_cpu_s=poll_cpu_s)
    # Each end of a window is known to within its line's uncertainty (uniform: sigma = u / sqrt(12)).
    arrived = {step: a.uncertainty for step, a in _first_steps(lines).items()}
    k = min(THROUGHPUT_WINDOWS, max(1, len(timed) // 2))
    ratios, errors = [], []
    for w in windows(timed, k):
        guard, trainer = sum(s.clock_s for s in w), sum(s.step_time_s for s in w)  # type: ignore[misc]
        before = max((n for n in arrived if n < w[0].step), default=None)  # the line the window's time starts at
        ends = max(arrived.get(n, resolution) for n in [*(s.step for s in w), before] if n is not None)
        if guard <= 0 or trainer <= 0:
            continue  # a window inside the clock's resolution: it says nothing either way
        ratios.append(math.log(guard / trainer))
        errors.append(math.sqrt(2 / 12) * ends / guard)
    if not ratios:
        q, error = 0.0, math.inf
    else:
        q = statistics.median(ratios)
        scatter = mad_sigma(ratios, q) if len(ratios) > 1 else 0.0
        error = MEDIAN_ERROR * math.hypot(scatter, statistics.median(errors)) / math.sqrt(len(ratios))
    return ClockReading(source="lines", steps=len(timed), claimed_step_s=claimed_timed / len(timed),
                        clock_step_s=span / len(timed), log_ratio=q, error=error, resolution_s=resolution,
                        poll_cpu_s=poll_cpu_s)


@dataclass(frozen=True)
class ClockChoice:
    """Whose clock a comparison of throughputs is decided on, and why (said in the verdict)."""

    guard: bool  # the guard's clock for every run of the comparison; else the trainer's printed times
    whole_run: bool  # on the guard's clock: each run's wall time per step (some run's lines were buffered)
    note: str

    def rate(self, run: RunResult) -> float:
        """``run``'s tokens/s per device on this clock."""
        return run.summary(guard_clock=self.guard, whole_run=self.whole_run).tokens_per_s_per_device


def _spread(readings: list[ClockReading]) -> float:
    """The variance of a group's mean disagreement: its runs' scatter, at least their own errors."""
    errors = statistics.fmean(c.error**2 for c in readings)
    scatter = statistics.variance([c.log_ratio for c in readings]) if len(readings) > 1 else 0.0
    return max(errors, scatter) / len(readings)


def choose(baseline: Sequence[RunResult], candidate: Sequence[RunResult] = ()) -> ClockChoice:
    """The trainer's clock (finer: it times each step from inside) when every run's printed times agree
    with the guard's clock and the two recipes' disagreements do not differ beyond noise (a timer that
    misses the same part of both recipes' steps leaves their ratio right); else the guard's clock, for
    every run alike."""
    runs = [*baseline, *candidate]
    if not runs or any(r.clock is None for r in runs):
        return ClockChoice(False, False, "the trainer's step times (not every run was timed by the guard's clock)")
    base = [r.clock for r in baseline if r.clock is not None]
    cand = [r.clock for r in candidate if r.clock is not None]
    whole = any(c.source == "run" for c in base + cand)
    off = [(what, c) for what, group in (("baseline", base), ("candidate", cand)) for c in group if not c.agrees()]
    gap = se = 0.0
    if base and cand:
        gap = statistics.fmean(c.log_ratio for c in cand) - statistics.fmean(c.log_ratio for c in base)
        se = math.sqrt(_spread(base) + _spread(cand))
    differ = math.isfinite(se) and abs(gap) > max(CLOCK_Z * se, COMPARE_SLACK)
    if not off and not differ:
        return ClockChoice(False, False, "the trainer's step times: they agree with the guard's clock "
                                         f"({_ratios(base, cand)})")
    why = []
    if off:
        what, c = off[0]
        why.append(f"{len(off)} run(s) disagree with it beyond noise, e.g. a {what} run: {c.describe()}")
    if differ:
        why.append(f"against the guard's clock, the candidate's printed times are {math.exp(gap):.3f}x as far "
                   f"off as the baseline's (+- {100 * se:.1f}%): their ratio is not the recipes' speed ratio")
    return ClockChoice(True, whole, "the guard's clock" + (" (each run's wall time per step, start-up included)"
                                                           if whole else "") + ": " + "; ".join(why))


def _ratios(base: list[ClockReading], cand: list[ClockReading]) -> str:
    parts = [f"{what} guard/trainer {math.exp(statistics.fmean(c.log_ratio for c in group)):.3f}x"
             for what, group in (("baseline", base), ("candidate", cand)) if group]
    return ", ".join(parts)


def jsonl_kind(line: str) -> tuple[str, int] | None:
    """What a line of a JSONL metrics stream is: a step's record, a validation's, or neither."""
    import json

    try:
        obj = json.loads(line)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("step"), int | float):
        return None
    if "val_loss" in obj:
        return "val", int(obj["step"])
    return ("step", int(obj["step"])) if "loss" in obj else None
