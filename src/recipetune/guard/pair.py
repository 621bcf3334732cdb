"""A longer pair of the steps design (guard/looks_steps.py), read as it runs: its runs started at the
plan's length, read at the middle look's step while they train (the workload's ``records_so_far``: a
metrics stream or log this machine can read, also on a shared runs folder), followed to their end, and
stopped through their stop files (guard/runs.py: ``Runs.stop``) when a look no longer needs them."""

from __future__ import annotations

from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass

from recipetune.core.measure import RunResult, StepRecord
from recipetune.guard.baseline import GuardError
from recipetune.guard.look import Gathered, Looking, Wanted


@dataclass(frozen=True)
class Pair:
    """A longer pair started: its runs, their futures, and its length in profile lengths."""

    wanted: list[Wanted]
    futures: dict[tuple[str, int], Future[RunResult]]
    factor: float
    mid: float | None  # where it is read as it runs (None: only at its end)

    def cut(self, w: Wanted) -> int:
        """``w``'s step at the middle look."""
        return round(w.steps * self.mid / self.factor) if self.mid is not None else 0


def read_at(v: Looking, pair: Pair, look: int) -> dict[tuple[str, int], RunResult] | str:
    """The pair's runs cut at ``mid`` times the profile's length: read as they run, where the trainer's
    records can be read while it trains (the workload's ``records_so_far``), else from the ended runs.
    The cut runs are a prefix of the pair's, so this look and the pair's end are not independent; the
    split of alpha between them is Bonferroni's, which holds whatever their dependence."""
    cut = {(w.side, w.k): pair.cut(w) for w in pair.wanted}
    v.say(f"parity look {look}: at step {cut['candidate', 0]} of the {pair.factor:g}x pair as it runs", note=False)
    while True:
        got: dict[tuple[str, int], RunResult] = {}
        for w in pair.wanted:
            key, future = (w.side, w.k), pair.futures[w.side, w.k]
            if future.done():
                try:
                    failed = v.failed(w, future.result())
                except GuardError:  # the baseline's run failed: the verdict ends, and its partner with it
                    halt(v, pair, "the baseline's run failed")
                    raise
                if failed is not None:
                    return failed
                got[key] = prefix(future.result(), cut[key])
                continue
            steps, evals = v.workload.records_so_far(w.recipe, w.steps, w.out)
            if steps and steps[-1].step >= last_step(steps, cut[key]):  # the middle is written: the prefix is whole
                live = RunResult(recipe=dict(w.recipe), recipe_id=w.recipe.id, status="ok", steps=steps, evals=evals,
                                 out_dir=str(w.out))
                got[key] = prefix(live, cut[key])
        if len(got) == len(pair.wanted):
            return got
        wait([f for f in pair.futures.values() if not f.done()], timeout=poll_s(v, pair), return_when=FIRST_COMPLETED)


def poll_s(v: Looking, pair: Pair) -> float:
    """How often a pair read as it runs is read: some fifty times before its middle."""
    return max(0.01, v.run_s * (pair.mid or pair.factor) / 50)


def follow(v: Looking, pair: Pair, look: int) -> None:
    """Wait for a pair read as it runs to end, saying how far its candidate run is."""
    w = next(w for w in pair.wanted if w.side == "candidate")
    while not all(f.done() for f in pair.futures.values()):
        steps = v.workload.records_so_far(w.recipe, w.steps, w.out)[0]
        if steps:
            v.say(f"parity look {look}: the {pair.factor:g}x pair at step {steps[-1].step} of {w.steps}", note=False)
        wait([f for f in pair.futures.values() if not f.done()], timeout=poll_s(v, pair), return_when=FIRST_COMPLETED)


def last_step(steps: list[StepRecord], cut: int) -> int:
    """The number of a run's ``cut``-th step: ``cut`` where it counts its steps from 1, ``cut - 1`` from 0
    (its first record says which)."""
    return cut - 1 if steps and steps[0].step == 0 else cut


def prefix(run: RunResult, cut: int) -> RunResult:
    """``run`` as far as its ``cut``-th step: what a run of that length would have logged, on the longer
    run's schedule."""
    last = last_step(run.steps, cut)
    return run.model_copy(update={"steps": [s for s in run.steps if s.step <= last],
                                  "evals": [e for e in run.evals if e.step <= last]})


def halt(v: Looking, pair: Pair, why: str) -> None:
    """Stop the pair's runs still going (their evidence is no longer needed), and wait for them to end, so
    that their time is counted and their devices are free for what comes next."""
    going = [w for w in pair.wanted if not pair.futures[w.side, w.k].done()]
    for w in going:
        read = v.workload.records_so_far(w.recipe, w.steps, w.out)[0]
        reached = max([s.step for s in read] + [pair.cut(w)])
        if v.runs.stop(w.out, why, reached):
            v.say(f"stopped the {w.side}'s {pair.factor:g}x run at about step {reached} of {w.steps}: {why}")
    wait([pair.futures[w.side, w.k] for w in going])


def halted(v: Looking, pair: Pair | None, gathered: Gathered, why: str) -> Gathered:
    """``gathered``, after stopping the pair in flight (if any): the verdict needs no more of it."""
    if pair is not None:
        halt(v, pair, why)
    return gathered
