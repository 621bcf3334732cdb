"""The guard's own clock (core/clock.py): a trainer's printed step time is a claim, checked on every
metrics route against when its lines arrive, and a comparison is decided on the trainer's times only
where they agree with the guard's.

The rule meets the cases built to fool it: a timer that covers a tenth of the step (litgpt's "iter
time"), an edge lie of 4% that each run's own check lets through (only the comparison of the two
recipes' disagreements catches it), a log held until exit; beside the honest cases it must not change
(a small untimed overhead common to both recipes, a difference within noise, steps shorter than the
clock can see, runs stored before the clock existed).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from recipetune.core import clock
from recipetune.core.clock import Arrival, choose
from recipetune.core.measure import ClockReading, RunResult, StepRecord
from recipetune.workloads.command import CommandSpec, CommandWorkload

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TRAINER = FIXTURES / "clock_trainer.py"


def reading(q: float, error: float = 0.005, source: str = "lines") -> ClockReading:
    return ClockReading(source=source, steps=18, claimed_step_s=0.01, clock_step_s=0.01 * math.exp(q),
                        log_ratio=q, error=error, resolution_s=0.001)


def run(q: float | None, error: float = 0.005, source: str = "lines", step_s: float = 0.01) -> RunResult:
    """A run of 20 steps that printed ``step_s`` a step, the guard's clock saying ``exp(q)`` times that."""
    true = step_s * math.exp(q or 0.0)
    steps = [StepRecord(step=i, loss=1.0, tokens=100, step_time_s=step_s, clock_s=None if q is None else true)
             for i in range(1, 21)]
    return RunResult(recipe={}, recipe_id="r", status="ok", steps=steps, warmup_steps=2, wall_s=20 * true + 1.0,
                     clock=None if q is None else reading(q, error, source))


# --- the comparison rule, on readings -------------------------------------------------------------------------


def test_honest_trainers_keep_their_own_finer_times():
    # 2% of each step untimed (its logging), alike in both recipes: the ratio is right, the trainer's kept
    choice = choose([run(0.02)] * 3, [run(0.021)] * 3)
    assert not choice.guard and "agree" in choice.note


def test_a_timer_covering_a_tenth_of_the_step_is_refused():
    choice = choose([run(0.0)] * 3, [run(math.log(10))] * 3)
    assert choice.guard and not choice.whole_run
    assert "10.000x" in choice.note and "candidate" in choice.note
    # the figures follow: the candidate's printed 10x is 1x on the guard's clock
    cand, base = run(math.log(10), step_s=0.001), run(0.0)
    assert base.summary(False).tokens_per_s == pytest.approx(cand.summary(False).tokens_per_s / 10)
    assert choice.rate(cand) == pytest.approx(choice.rate(base))


def test_an_edge_lie_each_run_lets_through_is_caught_by_the_comparison():
    # 4% under the truth: within what one run's own check allows an honest loop (5%), so every run
    # "agrees"; the two recipes' disagreements differ by 8 standard errors: their ratio is 4% off
    base, cand = [run(0.0)] * 3, [run(0.04)] * 3
    assert all(r.clock.agrees() for r in base + cand)
    choice = choose(base, cand)
    assert choice.guard and "as far off as the baseline's" in choice.note
    # the equivalent it must not refuse: the same difference at the edge of noise (errors of 2%)
    assert not choose([run(0.0, 0.02)] * 3, [run(0.04, 0.02)] * 3).guard
    # nor a difference below what could move a ratio (half a percent)
    assert not choose([run(0.0, 0.0001)] * 3, [run(0.004, 0.0001)] * 3).guard


def test_buffered_lines_fall_back_to_the_whole_run_for_every_run():
    choice = choose([run(0.0)] * 2, [run(2.0, 0.0, "run")] * 2)
    assert choice.guard and choice.whole_run and "wall time" in choice.note
    base = run(0.0)
    assert base.summary(True, whole_run=True).mean_step_time_s == pytest.approx(base.wall_s / 20)


def test_steps_shorter_than_the_clock_can_see_are_not_refused():
    assert not choose([run(0.0, math.inf)] * 2, [run(1.5, math.inf)] * 2).guard


def test_runs_stored_before_the_clock_are_judged_on_the_trainers_times():
    choice = choose([run(None)] * 2, [run(None)] * 2)
    assert not choice.guard and "not every run" in choice.note
    assert run(None).summary().timed_by == "trainer"


def test_a_runs_own_figures_move_to_the_guards_clock_only_beyond_slack():
    assert run(0.03).summary().timed_by == "trainer"
    liar = run(math.log(4))
    assert liar.summary().timed_by == "guard"
    assert liar.summary().tokens_per_s == pytest.approx(liar.summary(False).tokens_per_s / 4)


# --- stamping and reading, on arrivals -------------------------------------------------------------------------


def kind(text: str) -> tuple[str, int] | None:
    head, _, n = text.partition(" ")
    return (head, int(n)) if head in ("step", "val") else None


def test_stamp_divides_a_gap_by_its_steps_and_skips_a_validation():
    steps = [StepRecord(step=s, loss=1.0, tokens=1, step_time_s=0.1) for s in (10, 20, 30, 40)]
    arrivals = [Arrival(1.0, 0.001, "step 10"), Arrival(2.0, 0.001, "step 20"), Arrival(2.5, 0.001, "val 20"),
                Arrival(4.0, 0.001, "step 30"), Arrival(5.0, 0.001, "step 40")]
    stamped = clock.stamp(steps, arrivals, kind)
    assert [s.clock_s for s in stamped] == [None, pytest.approx(0.1), None, pytest.approx(0.1)]


def test_lines_written_in_bursts_share_their_gap():
    # a trainer that writes its lines once per loss sync (every 4 steps of 12 ms): one poll sees four lines;
    # each of their steps gets a quarter of the gap (never a zero that would make a window's time nothing)
    steps = [StepRecord(step=s, loss=1.0, tokens=1, step_time_s=0.012) for s in range(1, 13)]
    arrivals = [Arrival(0.05 + 0.048 * ((s - 1) // 4), 0.002, f"step {s}") for s in range(1, 13)]
    stamped = clock.stamp(steps, arrivals, kind)
    assert [s.clock_s for s in stamped[:4]] == [None] * 4
    assert [s.clock_s for s in stamped[4:]] == [pytest.approx(0.012)] * 8
    r = clock.read(stamped[2:], arrivals, 0.3, 12, 0.0, kind)
    assert r is not None and r.source == "lines" and r.agrees()
    honest = RunResult(recipe={}, recipe_id="r", status="ok", steps=stamped, warmup_steps=2, wall_s=0.3, clock=r)
    assert honest.summary(True).tokens_per_s == pytest.approx(1 / 0.012)
    # a run none of whose measured steps the clock could time is read on its wall time, never as 0 tokens/s
    short = honest.model_copy(update={"steps": stamped[:4]})
    assert short.summary(True).tokens_per_s == pytest.approx(4 / 0.3)


def test_read_sees_a_uniform_lie_and_a_log_held_to_the_end():
    steps = [StepRecord(step=s, loss=1.0, tokens=1, step_time_s=0.025) for s in range(1, 31)]
    paced = [Arrival(0.1 * s, 0.002, f"step {s}") for s in range(1, 31)]
    stamped = clock.stamp(steps, paced, kind)
    r = clock.read(stamped[3:], paced, 3.5, 30, 0.0, kind)
    assert r is not None and r.source == "lines" and r.log_ratio == pytest.approx(math.log(4), abs=0.01)
    assert not r.agrees()
    at_exit = [Arrival(3.5, 0.05, f"step {s}") for s in range(1, 31)]
    stamped = clock.stamp(steps, at_exit, kind)
    r = clock.read(stamped[3:], at_exit, 3.5, 30, 0.0, kind)
    assert r is not None and r.source == "run" and "buffered" in r.describe()


# --- every metrics route, on a real child ---------------------------------------------------------------------


def workload(route: str) -> CommandWorkload:
    fields: dict = {
        "argv": ["{python}", str(TRAINER), "--steps={steps}", "--out={out_dir}", f"--route={route}",
                 "--claim={claim}"],
        "knobs": {"claim": {"default": "honest", "choices": ["honest", "last", "buffered"]}},
    }
    if route == "jsonl":
        fields["metrics"] = {"jsonl": "{out_dir}/metrics.jsonl"}
    else:
        fields |= {"metrics": {"regex_preset": "nanogpt"}, "tokens_per_step": "512"}
    return CommandWorkload(CommandSpec.model_validate(fields), FIXTURES)


@pytest.mark.parametrize("route", ["stdout", "stderr", "jsonl"])
def test_every_route_is_timed_and_a_lie_is_seen(tmp_path, route):
    w = workload(route)
    results = {claim: w.run(w.resolve({"claim": claim}), 30, tmp_path / claim, timeout_s=120)
               for claim in ("honest", "last", "buffered")}
    for claim, r in results.items():
        assert r.ok, (claim, r.cause)
        assert r.clock is not None and r.clock.poll_cpu_s >= 0
    honest, last, buffered = results["honest"].clock, results["last"].clock, results["buffered"].clock
    assert honest.source == "lines" and honest.steps >= 20
    assert last.source == "lines" and last.log_ratio > math.log(3) and not last.agrees()
    assert buffered.source == "run"
    assert not choose([results["honest"]], [results["last"]]).note.startswith("the trainer's")
    # the honest run is the equivalent case: its own figures stay the trainer's
    assert results["honest"].summary().timed_by == "trainer", honest.describe()


# --- what a logged loss means: a noise that changes with a speed knob ------------------------------------------


def test_a_loss_line_whose_noise_changes_with_the_split_is_named():
    from recipetune.guard.parity import loss_line_note

    # nanoGPT: the last micro-batch's loss times the accumulation, 0.35 nats a step at 2 x 16, 0.088 at 32 x 1
    assert "not the step's loss" in loss_line_note(0.35, 0.088, 30)
    # the equivalent it must not flag: the same noise up to chance
    assert loss_line_note(0.20, 0.21, 400) == ""
    # the edge: 1.6x apart is beyond chance over 400 losses, not over 10
    assert loss_line_note(0.16, 0.10, 400) and not loss_line_note(0.16, 0.10, 10)
    # a change too small to mean another figure is no news, however many losses
    assert loss_line_note(0.13, 0.10, 100_000) == ""


def test_the_loss_line_note_counts_every_logged_loss_of_the_tail():
    # a verdict's measurements pass the note the tail's real count of losses (it was capped at 10, so a 2x
    # change over hundreds of losses went unnamed on nanoGPT's own runs): a 2x noise change over a 200-loss
    # tail is named; beside it, the same runs with 1.2x (no news) are not
    import numpy as np
    from test_guard_independent import BASE, CAND, no_seed_profile, settings

    from recipetune.guard.parity import measure

    def run(recipe, noise: float, order: int) -> RunResult:
        x = 2.0 + np.random.default_rng(order).normal(0, noise, 400)
        steps = [StepRecord(step=i, loss=float(v), tokens=1024, step_time_s=0.01) for i, v in enumerate(x)]
        return RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps, warmup_steps=2)

    cfg = settings()
    profile = no_seed_profile(400, cfg)
    base = run(BASE, 0.2, 1)
    m = measure(profile, [run(CAND, 0.1, 2)], cfg.parity, False, [base])
    assert m.tail_records >= 150 and any("not the step's loss" in n for n in m.notes)
    m = measure(profile, [run(CAND, 0.2 / 1.2, 2)], cfg.parity, False, [base])
    assert not any("not the step's loss" in n for n in m.notes)
