"""The steps design's middle look read from the longer pair as it runs (guard/looks_steps.py), against the
same verdicts with the middle look a pair of its own.

Synthetic worlds (tests/test_guard_independent.py: ``ReplicaWorkload``, no training), made readable as they
go (``Live``): each read of a running run shows a further share of its steps, and a run whose stop file
appears ends there, unfinished. So the verdict sees the pair at its middle before it ends, whatever the
machine's load, and every stop it makes is seen in the runs.
"""

from __future__ import annotations

import math
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_guard_independent import BASE, CAND, LossWorkload, ReplicaWorkload, settings

from recipetune.core.measure import RunResult
from recipetune.core.process import STOP_FILE
from recipetune.guard.baseline import build_profile
from recipetune.guard.looks import gather

WORLDS = range(12)


@dataclass
class _Run:
    full: RunResult
    shown: int = 0


class Live:
    """A workload whose longer runs are read as they go: each ``records_so_far`` shows ``chunk`` more of the
    steps of every run going that is longer than the profile's; a run ends when all are shown, or, once its
    stop file appears, unfinished there. (A run at the profile's length, the first look's, ends at once.)"""

    live_records = True
    chunk = 1 / 64  # about what a real run passes between two of the guard's reads (some fifty before the middle)

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None) -> RunResult:
        full = super().run(recipe, steps, out_dir, timeout_s, progress)
        if steps <= 100:
            return full
        run = _Run(full)
        with self.cond:
            self.running[Path(out_dir).resolve()] = run
            while run.shown < len(full.steps):
                if (Path(out_dir) / STOP_FILE).exists():
                    self.stopped.append((int(recipe["batch_size"]), steps, full.steps[run.shown - 1].step))
                    return full.model_copy(update={"status": "pruned", "cause": "stopped",
                                                   "steps": full.steps[:run.shown]})
                self.cond.wait(timeout=0.01)  # the runner's poll of its stop file
        return full

    def records_so_far(self, recipe, steps, out_dir):
        with self.cond:
            for run in self.running.values():  # time passes for every run going, read or not
                run.shown = min(len(run.full.steps), run.shown + math.ceil(self.chunk * len(run.full.steps)))
            self.cond.notify_all()
            run = self.running.get(Path(out_dir).resolve())
            return ([], []) if run is None else (run.full.steps[:run.shown], [])


class LiveReplica(Live, ReplicaWorkload):
    def __init__(self, world: int, offset: float = 0.0):
        super().__init__(world, offset, jitter=0.0)
        self.cond, self.running, self.stopped = threading.Condition(), {}, []


class LiveLoss(Live, LossWorkload):
    def __init__(self, offset: float = 0.0, fade: float | None = None):
        super().__init__(offset, fade)
        self.cond, self.running, self.stopped = threading.Condition(), {}, []


def verdict(world: int, size: float, live: bool, cap: int = 16):
    """A steps verdict on 32 x 1 against a no-seed trainer's 3-repeat profile, the candidate ``size`` T worse
    (an offset that grows over each run: its tail mean over the run's last half is ``size`` T)."""
    cfg = settings(seeds=3, max_steps_factor=cap)
    wl = LiveReplica(world) if live else ReplicaWorkload(world, jitter=0.0)
    profile = build_profile(wl, BASE, [ReplicaWorkload.run(wl, BASE, 100, None) for _ in range(3)], [None] * 3,
                            100, cfg)
    wl.offset, wl.launched = size * profile.loss_tolerance / 0.75, []
    got = gather(wl, profile, BASE, CAND, 100, cfg, Path(tempfile.mkdtemp()), equal_tokens=False)
    return got, wl


def spent(wl) -> int:
    """Steps trained: every run launched, less the steps a stopped run did not train."""
    return sum(s for _, s in wl.launched) - sum(s - at for _, s, at in getattr(wl, "stopped", []))


def test_an_equivalent_gets_the_same_verdict_and_never_trains_the_middle_pair():
    # The same worlds, the middle a pair of its own (as where runs cannot be read as they go) and read from the
    # pair at the plan's length as it runs: the same outcome in each; where the middle look keeps the plan, the
    # middle pair's runs are saved whole; where it grows the plan, the pair in flight stops just past its
    # middle and a longer pair replaces it, as the separate design would have run it.
    saved = 0
    for world in WORLDS:
        (old, wo), (new, wn) = verdict(world, 0.0, live=False), verdict(world, 0.0, live=True)
        assert new.evidence.outcome == old.evidence.outcome != "fails", (world, new.looks)
        assert any("read as the" in n for n in new.looks) and new.runs <= old.runs
        middle = 2 * wo.launched[1][1]  # the separate design's middle pair
        if not wn.stopped:
            assert spent(wn) == spent(wo) - middle and wn.launched[-1] == wo.launched[-1], (world, wn.launched)
            saved += 1
        else:  # stopped a few of the guard's reads past the middle, then the plan's longer pair: the separate
            # design's cost, and the steps run past the middle before the stop
            past = [at - middle // 2 for _, _, at in wn.stopped]
            assert all(-1 <= x <= 8 * Live.chunk * steps for x, (_, steps, _) in zip(past, wn.stopped, strict=True))
            assert wn.launched[-1] == wo.launched[-1] and spent(wn) == spent(wo) + sum(past), (world, wn.stopped)
    assert saved >= len(WORLDS) // 3


@pytest.mark.parametrize("size", [1.5, 3.0])
def test_a_poison_that_grows_with_the_schedule_is_never_approved_and_still_rejected(size):
    # The case built to fool a look cut from a longer run: the offset grows with the run's share of its
    # schedule, so the middle of a 13x pair reads it at a third of what a 4x run ends with. The middle look
    # may block approval or reject, never approve; futility does not give up on a pair in flight.
    separate = [verdict(w, size, live=False)[0].evidence.outcome for w in WORLDS]
    live = [verdict(w, size, live=True)[0].evidence.outcome for w in WORLDS]
    assert "holds" not in live
    assert live.count("fails") >= separate.count("fails") - 1, (separate, live)


class SteppedReplica(ReplicaWorkload):
    """ReplicaWorkload whose candidate is worse by a constant ``step_offset`` from its first step: a
    difference the middle look reads whole."""

    step_offset = 0.0

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None) -> RunResult:
        run = super().run(recipe, steps, out_dir, timeout_s, progress)
        if int(recipe["batch_size"]) != 2:
            for s in run.steps:
                s.loss += self.step_offset
        return run


class LiveStepped(Live, SteppedReplica):
    def __init__(self, world: int):
        super().__init__(world, 0.0, jitter=0.0)
        self.cond, self.running, self.stopped = threading.Condition(), {}, []


def test_a_middle_look_that_decides_stops_the_pair_where_it_is():
    # 3 T from the first step: shown beyond T at the middle; the pair is stopped there, not trained to its end
    cfg = settings(seeds=3)
    for world in WORLDS:
        wl = LiveStepped(world)
        profile = build_profile(wl, BASE, [ReplicaWorkload.run(wl, BASE, 100, None) for _ in range(3)], [None] * 3,
                                100, cfg)
        wl.step_offset, wl.launched = 3 * profile.loss_tolerance, []
        got = gather(wl, profile, BASE, CAND, 100, cfg, Path(tempfile.mkdtemp()), equal_tokens=False)
        assert got.evidence.outcome == "fails", got.looks
        if not any("read as the" in n and ": fails" in n for n in got.looks):
            continue  # decided at the first look, or by the pair's end
        assert got.stop == "decided" and len(wl.stopped) == 2, (got.looks, wl.stopped)
        assert all(at < steps for _, steps, at in wl.stopped)
        assert sum(n.startswith("stopped the ") for n in got.looks) == 2
        return
    pytest.fail("no world's middle look rejected")


class Calm(LossWorkload):
    """LossWorkload whose runs longer than the profile's log a loss 4x calmer: a middle look resolves T."""

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None) -> RunResult:
        out = super().run(recipe, steps, out_dir, timeout_s, progress)
        if steps > 100:
            for s in out.steps:
                descent = 1.0 + 1.7 * math.exp(-s.step / 60) + (self.offset * s.step / steps if
                                                                 int(recipe["batch_size"]) != 2 else 0.0)
                s.loss = descent + (s.loss - descent) / 4
        return out


class LiveCalm(Live, Calm):
    def __init__(self, offset: float = 0.0):
        super().__init__(offset)
        self.cond, self.running, self.stopped = threading.Condition(), {}, []


@pytest.mark.parametrize("size", [0.0, 1.5, 3.0])
def test_a_middle_look_that_holds_or_blocks_lets_the_pair_run_on_and_its_end_decides(size):
    # The middle of a pair reads a poison that grows with the schedule's share at a fraction of its end (the
    # case built to fool a look cut from a longer run): the middle look may show it within T, or beyond noise
    # but not beyond T; the pair runs on and its end decides: an equivalent approved, each poison rejected,
    # as a middle pair of its own (which ends its schedule) rejects it
    from test_guard_independent import no_seed_profile

    cfg = settings(max_steps_factor=16)
    profile = no_seed_profile(100, cfg)
    wl = LiveCalm(offset=size * profile.loss_tolerance / 0.75)
    got = gather(wl, profile, BASE, CAND, 100, cfg, Path(tempfile.mkdtemp()), equal_tokens=False)
    middle = next(n for n in got.looks if "read as the" in n)
    assert "runs on" in middle and not wl.stopped, got.looks
    if size == 0:
        assert "approves nothing" in middle and got.evidence.outcome == "holds", got.looks
    else:
        assert "blocks approval" in middle and got.evidence.outcome == "fails", got.looks
    assert got.plan["factor"] > 4 and got.runs == 3


def test_a_fading_effect_blocked_at_the_middle_is_never_approved():
    # 2-3 T at the profile's length, fading: the middle look shows it beyond noise; the end of the pair could
    # find it inside T, and approve it, were the block not kept
    cfg = settings()
    from test_guard_independent import no_seed_profile

    profile = no_seed_profile(100, cfg)
    T = profile.loss_tolerance
    for size, fade in [(2.0, 300), (3.0, 250)]:
        wl = LiveLoss(offset=size * T / math.exp(-75 / fade), fade=fade)
        got = gather(wl, profile, BASE, CAND, 100, cfg, Path(tempfile.mkdtemp()), equal_tokens=False)
        assert got.evidence.outcome != "holds", got.looks
        assert any("blocks approval" in n for n in got.looks), got.looks


class BaselineDies(LiveReplica):
    """LiveReplica whose baseline dies at the start of any run longer than the profile's."""

    def run(self, recipe, steps, out_dir, timeout_s=None, progress=None) -> RunResult:
        if int(recipe["batch_size"]) == 2 and steps > 100:
            return RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="oom", cause="CUDA out of memory")
        return super().run(recipe, steps, out_dir, timeout_s, progress)


def test_a_baseline_run_that_fails_ends_the_verdict_and_stops_its_partner():
    from recipetune.guard.baseline import GuardError

    cfg = settings(seeds=3)
    wl = BaselineDies(0)
    profile = build_profile(wl, BASE, [ReplicaWorkload.run(wl, BASE, 100, None) for _ in range(3)], [None] * 3, 100,
                            cfg)
    wl.launched = []
    with pytest.raises(GuardError, match="baseline run failed"):
        gather(wl, profile, BASE, CAND, 100, cfg, Path(tempfile.mkdtemp()), equal_tokens=False)
    assert [(b, s) for b, s, _ in wl.stopped] == [(32, wl.launched[-1][1])]  # the candidate's run, not trained on
