"""Cheaper searches: trials stopped early by Optuna's pruners from what they report while they run,
and the campaign's stop rules (a plateau, a compute budget). The engine with a job whose trials
report a known curve, then the quality job's checkpoints in a real child experiment."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from ft_fixtures import experiment_file

from recipetune.core.process import STOP_FILE
from recipetune.core.recipe import Knob, KnobSet, Recipe, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine import loop, stopping, trials
from recipetune.engine.config import Pruning, TreeSearchConfig
from recipetune.engine.job import (
    Checked,
    Finished,
    Landing,
    Outcome,
    Progress,
    Reporter,
    Root,
    Row,
    Services,
    checkpoint_steps,
    watch,
)
from recipetune.engine.loop import run_search
from recipetune.engine.record import Figures, Trial
from recipetune.engine.samplers import make_pruner, make_sampler, pruning_bar
from recipetune.engine.store import CampaignStore
from recipetune.execute.executor import LocalExecutor
from recipetune.finetune import job as ft
from recipetune.finetune import plan as ftp
from recipetune.finetune.decide import metric_reward
from recipetune.finetune.experiment import load_experiment, train_and_validate

# -- a job whose trials report a known curve ---------------------------------------------------------

BASE = 0.50  # the baseline's metric at every checkpoint
CURVES = {  # knob q -> the validation metric at checkpoints 1, 2, 3, then the final value
    0: [BASE, BASE, BASE, BASE],  # the baseline
    1: [BASE, BASE, BASE, 0.56],  # at the baseline's level until it pulls ahead: must never be pruned
    2: [0.49, 0.48, 0.47, 0.47],  # one hundredth below at the first checkpoint, then falling
    3: [0.60, 0.62, 0.64, 0.625],  # better from the start (0.625 - 0.5 = 0.125, exactly)
    4: [0.49, 0.52, 0.55, 0.60],  # one hundredth below at checkpoint 1, then improving (patience decides)
}


class Subject:
    def __init__(self, curves: dict[int, list[float]]) -> None:
        self.curves = curves

    def knobs(self) -> KnobSet:
        return KnobSet([Knob("q", 0, choices=tuple(self.curves))])

    def relations(self) -> Relations:
        return Relations(self.knobs())


class CurveJob:
    """Reports curves[q] one checkpoint at a time and stops when told."""

    name = "curve"
    figures = Figures

    def __init__(self, noise: float | None = None, curves: dict[int, list[float]] = CURVES) -> None:
        self.noise = noise  # a report's plausible upper bound is value + noise (None: no bound given)
        self.curves = curves
        self.subject = Subject(curves)
        self.baseline = Recipe({"q": 0})
        self.space = SearchSpace({"q": tuple(curves)})
        self.briefing: dict[str, Any] = {}
        self.reported: dict[int, list[float]] = {}  # q -> what it got to report

    def start(self, services: Services) -> Root:
        return Root(None, BASE, curve=dict(enumerate(self.curves[0], 1)))

    def check(self, recipe: Recipe) -> Checked:
        return Checked(recipe)

    def submit(self, recipe: Recipe, run_dir: Path, plan: dict[str, Any], progress: Progress) -> Future:
        q, shown, curve = int(recipe["q"]), [], self.curves[int(recipe["q"])]
        future: Future = Future()
        pruned = None  # the report that stopped it
        for k, value in enumerate(curve, 1):
            shown.append(value)
            upper = None if self.noise is None else value + self.noise
            if k < len(curve) and progress.report(k, value, upper):  # the last value is the final one
                pruned = (k, value)
                break
        self.reported[q] = shown
        future.set_result((q, pruned))
        return future

    def land(self, result: tuple[int, tuple[int, float] | None], recipe: Recipe, run_dir: Path) -> Landing:
        q, pruned = result
        if pruned is not None:
            return Landing("pruned", None, metric_reward(pruned[1], BASE, True), f"pruned at {pruned[0]}")
        final = self.curves[q][-1]
        return Landing("passed", final, metric_reward(final, BASE, True))

    def load(self, run_dir: Path) -> None:
        return None

    def row(self, key: str, number: int | None, recipe: Recipe, trial: Trial[Figures]) -> Row:
        return Row(key, number, str(dict(recipe)), trial.status)

    def decide(self, finished: Finished) -> Outcome:
        best = finished.tree.best()
        return Outcome("APPROVED" if best else "KEEP BASELINE", [], finished.tree, best, runs=finished.runs)


class Phases(Reporter):
    def __init__(self) -> None:
        self.phases: list[str] = []
        self.campaigns: list[tuple[int, int, bool]] = []  # (done, total, ended): the live view's k/N

    def phase(self, text: str) -> None:
        self.phases.append(text)

    def campaign(self, done: int, total: int, elapsed_s: float, ended: bool = False) -> None:
        self.campaigns.append((done, total, ended))


class InOrder(optuna.samplers.BaseSampler):
    """Draws the given values of the one knob in their order: which trials finished before a trial
    reports is part of what a pruning test sets up."""

    def __init__(self, values: list[int]) -> None:
        self.values = list(values)

    def infer_relative_search_space(self, study: Any, trial: Any) -> dict:
        return {}

    def sample_relative(self, study: Any, trial: Any, space: Any) -> dict:
        return {}

    def sample_independent(self, study: Any, trial: Any, name: str, distribution: Any) -> Any:
        return self.values.pop(0)


def campaign(folder: Path, job: CurveJob, resume: bool = False, reporter: Reporter | None = None,
             order: list[int] | None = None, **search: Any) -> tuple[Outcome, CampaignStore]:
    cfg = TreeSearchConfig.model_validate({"strategy": "grid", "budget": {"trials": 4}, **search})
    sampler = InOrder(order) if order else make_sampler("grid", job.space, job.baseline, 0)
    store = CampaignStore(folder, None, sampler, 30, pruner=make_pruner(cfg.pruning))
    services = Services(store, LocalExecutor(), reporter or Reporter())
    return run_search(job, cfg, services, meta={"job": "curve"}, snapshot={}, resume=resume), store


def by_q(store: CampaignStore) -> dict[int, Any]:
    """The trials that ran, by q (the grid also asks for the baseline's point: a duplicate, never run)."""
    return {int(r.recipe["q"]): r for r in store.records() if r.attrs.get("ran")}


# -- the rule, at its edge -----------------------------------------------------------------------------


def test_the_median_pruner_stops_a_trial_just_below_the_baseline_and_keeps_one_at_its_level(tmp_path):
    job = CurveJob()
    outcome, store = campaign(tmp_path / "c", job, pruning={"pruner": "median", "startup_trials": 1})
    trials = by_q(store)
    assert trials[2].state == "PRUNED" and trials[2].status == "pruned" and job.reported[2] == [0.49]
    assert trials[1].status == "passed" and job.reported[1] == CURVES[1]  # equal is not worse
    assert trials[3].status == "passed" and trials[4].status == "pruned" and job.reported[4] == [0.49]
    node = outcome.tree.nodes[Recipe({"q": 2}).id]
    assert node.status == "pruned" and node.score is None and not node.expandable and node.visits == 1
    assert outcome.winner is not None and outcome.winner.recipe["q"] == 3  # no decision rests on a pruned run
    assert outcome.runs == 4  # a pruned trial ran: it spent its share of the budget


def test_noise_alone_never_stops_a_trial(tmp_path):
    # q=2 and q=4 report 0.49 against the baseline's 0.50 (q=2 then 0.48, 0.47), below the median of
    # the finished trials: with a noise of 0.1 they could still reach it, so they run on although the
    # median pruner says stop; with 0.005 they cannot, and stop
    job = CurveJob(noise=0.1)
    _, store = campaign(tmp_path / "a", job, pruning={"pruner": "median", "startup_trials": 1})
    assert {q: r.status for q, r in by_q(store).items()} == dict.fromkeys((1, 2, 3, 4), "passed")
    job = CurveJob(noise=0.005)
    _, store = campaign(tmp_path / "b", job, pruning={"pruner": "median", "startup_trials": 1})
    assert by_q(store)[2].status == by_q(store)[4].status == "pruned" and job.reported[2] == [0.49]


# Flat curves, run in the order 1, 2, 3, 4 after the baseline (0.50), each report known to +-0.02:
# when q=3 reports 0.65, the finished trials stand at 0.50, 0.70, 0.66 (median 0.66, 75th percentile
# 0.68); when q=4 reports 0.67 they stand as they did for q=3 if q=3 was stopped.
RANKS = {0: [BASE] * 4, 1: [0.70] * 4, 2: [0.66] * 4, 3: [0.65] * 4, 4: [0.67] * 4}


@pytest.mark.parametrize(("pruning", "noise", "stopped"), [
    # the median: q=3 is below it (0.65 < 0.66) but could reach it (0.67): runs on; nothing stops
    ({"pruner": "median"}, 0.02, set()),
    # the top quarter: its bar is the 75th percentile, 0.68. q=3 cannot reach it (0.67) and stops;
    # q=4 is below it too (0.67), yet could reach it (0.69): runs on. A bar at the median would stop neither
    ({"pruner": "percentile", "percentile": 25}, 0.02, {3}),
    ({"pruner": "percentile", "percentile": 25}, 0.005, {3, 4}),  # known to +-0.005, q=4 (0.675) cannot
    ({"pruner": "percentile", "percentile": 50}, 0.02, set()),  # percentile 50 is the median
    # successive halving keeps the top third of a rung: here the best finished trial, 0.70. Every trial
    # after q=1 is below it; known to +-0.02 none can reach it, known to +-0.035 q=4 (0.705) could
    ({"pruner": "successive_halving"}, 0.02, {2, 3, 4}),
    ({"pruner": "successive_halving"}, 0.035, {2, 3}),
])
def test_a_trial_is_stopped_only_below_the_bar_its_own_pruner_keeps(tmp_path, pruning, noise, stopped):
    job = CurveJob(noise=noise, curves=RANKS)
    _, store = campaign(tmp_path / "c", job, order=[1, 2, 3, 4], pruning=pruning)
    trials = by_q(store)
    assert {q for q, r in trials.items() if r.status == "pruned"} == stopped
    assert all(job.reported[q] == RANKS[q] for q in set(trials) - stopped)  # the others ran to their end
    assert all(job.reported[q] == RANKS[q][:1] for q in stopped)  # stopped at their first report


@pytest.mark.parametrize("pruning", [{"pruner": "median"}, {"pruner": "percentile", "percentile": 25},
                                     {"pruner": "percentile", "percentile": 80}])
def test_the_bar_is_where_optunas_own_pruner_draws_its_line(pruning):
    # finished trials' reports drawn at random; a new trial just under, at and just over the bar:
    # Optuna's pruner must say stop to the first only
    p = Pruning(**pruning, startup_trials=0)
    rng = random.Random(0)
    for _ in range(20):
        values = [round(rng.uniform(0, 1), 3) for _ in range(rng.randint(1, 9))]
        bar = pruning_bar(p, values)
        assert bar is not None
        for value, stops in ((bar - 1e-9, True), (bar, False), (bar + 1e-9, False)):
            study = optuna.create_study(direction="maximize", pruner=make_pruner(p))
            for v in values:
                study.add_trial(optuna.trial.create_trial(value=v, intermediate_values={1: v}))
            trial = study.ask()
            trial.report(value, 1)
            assert trial.should_prune() == stops, (values, value)
    assert pruning_bar(p, []) is None


def test_the_patient_pruner_keeps_a_trial_that_is_improving(tmp_path):
    # Optuna's PatientPruner: the median pruner's word counts only once a trial has not improved for
    # ``patience`` reports; a first report has no history to judge
    job = CurveJob()
    _, store = campaign(tmp_path / "c", job, pruning={"pruner": "patient", "patience": 1, "startup_trials": 1})
    trials = by_q(store)
    assert trials[4].status == "passed" and job.reported[4] == CURVES[4]  # below, then improving: kept
    assert trials[2].status == "pruned" and job.reported[2] == [0.49, 0.48, 0.47]  # below and falling


def test_without_a_pruner_every_trial_runs_to_its_end(tmp_path):
    job = CurveJob()
    _, store = campaign(tmp_path / "c", job)
    assert {q: r.status for q, r in by_q(store).items()} == dict.fromkeys((1, 2, 3, 4), "passed")
    assert not any(r.attrs.get("status") == "reference" for r in store.records())


def test_a_pruned_trial_is_kept_on_resume_and_never_run_again(tmp_path):
    job = CurveJob()
    pruning = {"pruner": "median", "startup_trials": 1}
    campaign(tmp_path / "c", job, pruning=pruning, budget={"trials": 4})
    assert job.reported[2] == [0.49]
    job.reported.clear()
    outcome, store = campaign(tmp_path / "c", job, resume=True, pruning=pruning, budget={"trials": 6})
    trials = by_q(store)
    assert trials[2].status == trials[4].status == "pruned" and job.reported == {}  # from the study: none ran again
    assert outcome.tree.nodes[Recipe({"q": 2}).id].status == "pruned" and outcome.runs == 4
    # the baseline's curve went into the study once, as the pruner's reference, not as a trial
    assert not any(t.user_attrs.get("status") == "reference" for t in store.study.get_trials())
    assert store.reference() == {1: BASE, 2: BASE, 3: BASE, 4: BASE}
    assert store.study.user_attrs["reference"]["curve"] == {"1": BASE, "2": BASE, "3": BASE, "4": BASE}


def test_a_study_that_kept_the_baseline_curve_as_a_trial_resumes_with_it_as_the_reference(tmp_path):
    # a campaign folder written before 2026-12-03 holds the baseline's curve as a finished trial with no
    # recipe: resumed, it is the pruner's reference (once: Optuna's median counts it among the finished
    # trials, the bar too), never a campaign trial, and the study gets no second copy in its attributes
    folder = tmp_path / "c"
    old = CampaignStore(folder, None)
    old.create({"job": "curve"})
    old.study.add_trial(optuna.trial.create_trial(
        value=BASE, intermediate_values=dict(enumerate(CURVES[0], 1)),
        user_attrs={"status": "reference", "ran": False}))
    old.storage.engine.dispose()
    job = CurveJob()
    outcome, store = campaign(folder, job, resume=True, pruning={"pruner": "median", "startup_trials": 1})
    trials = by_q(store)  # as in a fresh campaign (the median pruner's test above)
    assert trials[2].status == trials[4].status == "pruned" and job.reported[2] == job.reported[4] == [0.49]
    assert trials[1].status == trials[3].status == "passed" and outcome.runs == 4
    assert store.reference() == {1: BASE, 2: BASE, 3: BASE, 4: BASE} and "reference" not in store.study.user_attrs
    assert store.values_at(1).count(BASE) == 2  # the baseline's and q=1's, the reference read once
    assert all("recipe" in r.attrs for r in store.records())


# -- stop rules ------------------------------------------------------------------------------------------


def test_a_plateau_stops_the_campaign_and_a_gain_at_the_margin_does_not_count(tmp_path):
    # the grid runs q = 2 (0.47), 1 (0.56), 3 (0.625), 4 (0.60) after the baseline (0.5)
    reporter = Phases()
    outcome, _ = campaign(tmp_path / "a", CurveJob(), reporter=reporter, budget={"trials": 4, "plateau": 2,
                                                                                  "plateau_gain": 0.1})
    assert outcome.runs == 2  # 0.47 and 0.56: neither beats 0.5 by more than 0.1
    assert any(p.startswith("stopped: a plateau: 2 runs in a row without a gain beyond 0.1") for p in reporter.phases)
    # q=3 gains exactly 0.125: at a margin of 0.125 that is no gain, a hair under it is one
    at, _ = campaign(tmp_path / "b", CurveJob(), budget={"trials": 4, "plateau": 3, "plateau_gain": 0.125})
    under, _ = campaign(tmp_path / "c", CurveJob(), budget={"trials": 4, "plateau": 3, "plateau_gain": 0.12})
    assert at.runs == 3 and under.runs == 4


class TimedJob(CurveJob):
    """Each trial takes 10 s of the search's clock, inside ``submit``: as the local executor runs a
    trial, before submit returns."""

    def __init__(self, clock: list[float]) -> None:
        super().__init__()
        self.clock = clock

    def submit(self, recipe: Recipe, run_dir: Path, plan: dict[str, Any], progress: Progress) -> Future:
        self.clock[0] += 10.0
        return super().submit(recipe, run_dir, plan, progress)


@pytest.mark.parametrize(("trial_s", "runs"), [(25.0, 3), (20.0, 2), (20.5, 3)])
def test_a_compute_budget_counts_the_time_the_trials_ran(tmp_path, monkeypatch, trial_s, runs):
    # 10 s a trial: a budget of 25 s starts a third trial at 20 s and none at 30 s; at 20 s a budget
    # of 20 s is spent. (The clock once started after a local trial had run: every budget read 0 s.)
    clock = [0.0]
    fake = SimpleNamespace(monotonic=lambda: clock[0], time=time.time, monotonic_ns=time.monotonic_ns, sleep=time.sleep)
    for module in (loop, trials, stopping):  # the loop, a trial's landing, the budget: one clock
        monkeypatch.setattr(module, "time", fake)
    reporter = Phases()
    outcome, store = campaign(tmp_path / "c", TimedJob(clock), reporter=reporter,
                              budget={"trials": 4, "trial_s": trial_s})
    assert outcome.runs == runs and store.study.user_attrs["search_trial_s"] == 10.0 * runs
    assert f"stopped: the compute budget is spent: the trials ran {10 * runs} s of {trial_s:.0f} s" in reporter.phases
    assert reporter.campaigns[-1] == (runs, 4, True)  # the live view says it ended: no time to go


class NoRoomJob(CurveJob):
    """A job whose baseline leaves no gain to show (``Root.stop``); keeps what its decision was told."""

    def __init__(self, stop: str) -> None:
        super().__init__()
        self.stop, self.finished = stop, None

    def start(self, services: Services) -> Root:
        return dataclasses.replace(super().start(services), stop=self.stop)

    def decide(self, finished: Finished) -> Outcome:
        self.finished = finished
        return super().decide(finished)


def test_a_baseline_that_leaves_no_room_starts_no_trial_and_the_decision_is_told(tmp_path):
    reporter = Phases()
    job = NoRoomJob("the baseline is at the ceiling")
    outcome, store = campaign(tmp_path / "a", job, reporter=reporter)
    assert outcome.runs == 0 and by_q(store) == {} and job.reported == {}
    assert "stopped: the baseline is at the ceiling" in reporter.phases and reporter.campaigns[-1] == (0, 4, True)
    assert job.finished.stopped == "the baseline is at the ceiling"
    # the same job with room runs its budget, and its decision hears of no stop
    free = NoRoomJob("")
    outcome, _ = campaign(tmp_path / "b", free)
    assert outcome.runs == 4 and free.finished.stopped == ""


# -- the quality job's checkpoints -------------------------------------------------------------------------


def test_checkpoint_steps_are_evenly_spaced_inside_the_training():
    assert checkpoint_steps(12, 3) == {3: 1, 6: 2, 9: 3}
    assert checkpoint_steps(3, 3) == {1: 1, 2: 2}  # a short run holds fewer, never the last step
    assert checkpoint_steps(1, 3) == {} and checkpoint_steps(100, 0) == {}


def test_checkpoints_report_as_the_child_trains_and_change_nothing_it_learns(tiny_ft):
    tmp_path, files, model = tiny_ft
    file = experiment_file(tmp_path, files, model, recipe={"max_steps": 8, "batch_size": 4, "max_seq_len": 32,
                                                            "lr": 3e-3, "threads": 1})
    exp = load_experiment(file)
    plain, _ = train_and_validate(exp, tmp_path / "plain")
    watched, _ = train_and_validate(exp, tmp_path / "watched", checkpoints=3, checkpoint_examples=3)
    lines = ft.progress_lines(tmp_path / "watched")
    assert [(x["checkpoint"], x["step"], x["examples"]) for x in lines] == [(1, 2, 3), (2, 4, 3), (3, 6, 3)]
    # when each was reached and what it cost: what a stop there saves, what reporting adds
    assert [x["time_s"] for x in lines] == sorted(x["time_s"] for x in lines)
    assert all(0 <= x["eval_s"] <= x["time_s"] for x in lines)
    assert watched.loss.points == plain.loss.points and watched.value == plain.value  # the training is the same
    assert not (tmp_path / "plain" / "progress.jsonl").exists()
    # the live view's step count: the last write is the last step
    assert json.loads((tmp_path / "plain" / "steps.json").read_text()) == {"step": 8, "total": 8}


def test_a_pruned_child_is_stopped_by_its_runner_and_lands_as_pruned(tiny_ft):
    tmp_path, files, model = tiny_ft
    file = experiment_file(tmp_path, files, model, recipe={"max_steps": 400, "batch_size": 4, "max_seq_len": 32,
                                                            "lr": 1e-3, "threads": 1},
                           search={"knobs": {"lr": [1e-3, 3e-3]}, "pruning": {"pruner": "median"}})
    c = ftp.load_finetune_campaign(file)
    out = tmp_path / "child"
    told: list[tuple[int, float]] = []
    progress = Progress(lambda done, total: None, lambda step, value, upper: told.append((step, value)) or "stop")
    done = threading.Event()
    watch(lambda: ft.progress_lines(out), progress, out / STOP_FILE, done, every_s=0.05)
    result = ft.run_child(str(file), [], c.space.child_file(c.baseline), str(out), 300, checkpoints=3,
                          checkpoint_examples=4)
    done.set()
    assert isinstance(result, ft.Pruned) and result.checkpoint == told[0][0] == 1 and result.of == 3
    assert (out / STOP_FILE).exists() and not (out / "report.json").exists()  # stopped before its end
    job = ft.QualityJob(ftp.plan(c, tmp_path / "camp"))
    landing = job.land(result, c.baseline, out)
    assert landing.status == "pruned" and landing.score is None and landing.cause.startswith("pruned at checkpoint 1/3")


@pytest.mark.parametrize("pruner", ["median", "percentile", "patient", "successive_halving", "hyperband"])
def test_every_pruner_named_in_the_settings_is_optunas(pruner):
    assert isinstance(make_pruner(Pruning(pruner=pruner)), optuna.pruners.BasePruner)
    assert isinstance(make_pruner(Pruning()), optuna.pruners.NopPruner)


def test_the_hf_route_reports_its_checkpoints_too(tmp_path, monkeypatch):
    from ft_fixtures import reverse_task, tiny_llama

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    files = reverse_task(tmp_path)
    model = {"kind": "hf", "path": str(tiny_llama(tmp_path / "llama", files))}
    file = experiment_file(tmp_path, files, model, recipe={"max_steps": 6, "batch_size": 4, "max_seq_len": 32,
                                                            "lr": 1e-3, "threads": 1, "method": "lora", "lora_rank": 2})
    report, _ = train_and_validate(load_experiment(file), tmp_path / "out", checkpoints=2, checkpoint_examples=2)
    lines = ft.progress_lines(tmp_path / "out")
    assert report.status == "ok", report.cause
    assert [(x["checkpoint"], x["step"]) for x in lines] == [(1, 2), (2, 4)] and report.loss.steps == 6


# -- the speed job's throughput windows -------------------------------------------------------------------

FAKE = Path(__file__).resolve().parent / "fixtures" / "fake_trainer.py"


def delay_trials(tmp_path: Path, search: str) -> dict[tuple[float, str], Any]:
    """A speed campaign on the fake command trainer: the baseline, an equal recipe (tag b) and two 4x slower
    ones (delay 0.04), 40 steps each; ``search``: more lines of its search section. Its trials that ran,
    by (delay, tag)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_search_campaign import fake_guard

    from recipetune.config import load_campaign
    from recipetune.speed.job import run
    from recipetune.speed.plan import plan

    file = tmp_path / "c.yaml"
    file.write_text(f"""
workload:
  kind: command
  argv: ["{{python}}", "{FAKE}", "--micro-batch=4", "--iters={{steps}}", "--out={{out_dir}}",
         "--step-delay={{delay}}", "--tag={{tag}}"]
  metrics: {{jsonl: "{{out_dir}}/metrics.jsonl"}}
  knobs:
    delay: {{default: 0.01, choices: [0.01, 0.04]}}
    tag: {{default: a, choices: [a, b]}}
baseline: {{delay: 0.01, tag: a}}
run: {{steps: 40, timeout_s: 60}}
guard: {{parity: {{steps: 40}}}}
search:
  strategy: grid
  knobs: {{delay: [0.01, 0.04], tag: [a, b]}}
  steps_per_trial: 40
  budget: {{trials: 3}}
  {search}
""")
    p = plan(load_campaign(file), tmp_path / "camp")
    run(p, guard=fake_guard())
    return {(r.recipe["delay"], r.recipe["tag"]): r for r in p.store.records() if r.attrs.get("ran")}


def steps_run(record: Any) -> int:
    return len((Path(record.attrs["run_dir"]) / "metrics.jsonl").read_text().splitlines())


def test_a_trial_clearly_slower_than_the_baseline_is_stopped_and_an_equal_one_runs_on(tmp_path):
    # the pruner alone (the set-aside rule, which would stop these too, off)
    trials = delay_trials(tmp_path, "pruning: {pruner: median, startup_trials: 1, checkpoints: 3}\n  set_aside: 0")
    slow = [r for (delay, _), r in trials.items() if delay == 0.04]
    assert slow and all(r.status == "pruned" and r.state == "PRUNED" for r in slow)
    assert all(r.attrs["cause"].startswith("pruned at window 1/3:") and "(median pruner)" in r.attrs["cause"]
               for r in slow)
    assert trials[(0.01, "b")].status == "passed"  # the same speed as the baseline: never stopped
    assert all(steps_run(r) < 40 for r in slow)  # stopped before its end: the point of pruning


def speed_reports(steps: list) -> list[dict]:
    """The speed job's reports of a 40-step run (3 checkpoints) against a profile of 1000 tokens/s at
    2% A/A noise: only ``SpeedJob.windows`` is exercised, with its settings and the profile."""
    from types import SimpleNamespace

    from recipetune.speed.job import SpeedJob

    job = SpeedJob.__new__(SpeedJob)
    job.cfg = SimpleNamespace(pruning=SimpleNamespace(checkpoints=3))
    job.profile = SimpleNamespace(tokens_per_s=1000.0, throughput_noise=0.02)
    return job.windows(steps, 40)


@pytest.mark.parametrize(("slower", "stops"), [(1.0, False), (0.97, False), (0.95, True), (0.25, True)])
def test_a_speed_window_is_stoppable_only_beyond_two_aa_spreads(slower, stops, tmp_path):
    # The speed job's report: tokens/s so far over the profile's, and its plausible bound, value x
    # (1 + 2 x the A/A spread). Against a median of 1.0 (the baseline) at 2% noise, a trial 3% slower
    # (1.5 spreads) could still be as fast and runs on; 5% slower (2.5 spreads) can be stopped.
    from recipetune.core.measure import StepRecord

    steps = [StepRecord(step=i, loss=1.0, tokens=100, step_time_s=0.1 / slower) for i in range(1, 41)]
    reports = speed_reports(steps)
    assert [r["checkpoint"] for r in reports] == [1, 2, 3]
    assert all(r["value"] == pytest.approx(slower) for r in reports)
    assert all((r["upper"] < 1.0) == stops for r in reports)  # Search.prune: stopped only when upper < median


def test_a_pruned_childs_reward_is_its_gain_over_the_baseline_at_the_same_checkpoint(tiny_ft):
    # Early in training every run scores low. Baseline: 0.09 at checkpoint 1 of 3 (64 rows), 0.45 at
    # its end. A child stopped at checkpoint 1 at the baseline's own 0.09 has lost nothing so far; scored
    # against the final 0.45 it earned 0.10, the reward of a child that lost 80% of the baseline, and
    # UCT shunned its branch (stdlib-module, search seed 1). One two rows behind the baseline at that
    # checkpoint (2-3 times the 64-row noise would be 0.03-0.05 below) still earns less than 0.5.
    tmp_path, files, model = tiny_ft
    file = experiment_file(tmp_path, files, model, search={"knobs": {"lr": [1e-3, 3e-3]},
                                                           "pruning": {"pruner": "median"}})
    c = ftp.load_finetune_campaign(file)
    job = ft.QualityJob(ftp.plan(c, tmp_path / "camp"))
    job.root_value, job.root_curve = 0.45, {1: 6 / 64, 2: 19 / 64, 3: 28 / 64}
    level = job.land(ft.Pruned(1, 3, 6 / 64, 64), c.baseline, tmp_path)
    behind = job.land(ft.Pruned(1, 3, 4 / 64, 64), c.baseline, tmp_path)
    later = job.land(ft.Pruned(2, 3, 17 / 64, 64), c.baseline, tmp_path)
    assert level.status == behind.status == "pruned" and level.reward == 0.5
    assert metric_reward(6 / 64, 0.45, True) < 0.15  # what the final value as reference made of it
    assert behind.reward == metric_reward(4 / 64, 6 / 64, True) < 0.5
    assert later.reward == metric_reward(17 / 64, 19 / 64, True) and later.figures.baseline_at_prune == 19 / 64
    # a baseline that reported no checkpoints (pruning turned on for a resumed campaign): its final value
    job.root_curve = {}
    assert job.land(ft.Pruned(1, 3, 6 / 64, 64), c.baseline, tmp_path).reward == metric_reward(6 / 64, 0.45, True)


def _steps(speed: float, stalls: dict[int, float] | None = None, jitter: float = 0.01) -> list:
    """40 steps of 100 tokens at ``speed`` x 1000 tokens/s, each step's time jittered by ``jitter``
    (a fixed draw) and the steps in ``stalls`` made that many times slower: a neighbour's burst."""
    import numpy as np

    from recipetune.core.measure import StepRecord

    t = 0.1 / speed * (1 + jitter * np.random.default_rng(0).standard_normal(40))
    for step, factor in (stalls or {}).items():
        t[step - 1] *= factor
    return [StepRecord(step=i, loss=1.0, tokens=100, step_time_s=float(t[i - 1])) for i in range(1, 41)]


# Warm-up is steps 1-4, so the first report covers steps 5-13, the second 5-22, the third 5-31.
@pytest.mark.parametrize(("steps", "stopped"), [
    (_steps(1.0), [False, False, False]),
    (_steps(0.97), [False, False, False]),  # 1.5 spreads slower: it could still be as fast
    (_steps(0.95), [True, True, True]),  # 2.5 spreads slower: stoppable from its first report
    # the cases built to fool it: an equal recipe whose short first report caught a burst
    (_steps(1.0, {7: 2.0}), [False, False, False]),  # one stall: the median of its windows ignores it
    (_steps(1.0, {7: 3.0, 8: 3.0, 9: 3.0}), [False, False, False]),  # 3 steps at 3x: 0.80x, its bound 1.18x
    (_steps(1.0, {6: 2.0, 10: 2.0}), [False, False, False]),  # two stalls in two windows: 0.87x, bound 1.11x
    # ... beside the slower recipe that a stall must not hide: the spread is robust too
    (_steps(0.95, {7: 2.0}), [True, True, True]),
    (_steps(0.97, {7: 2.0}), [False, False, False]),
    # The limit: a slowdown over a whole report is what a slower recipe looks like there. The bound
    # cannot tell them apart; the next report can (`pruner: patient` waits for it).
    (_steps(1.0, dict.fromkeys(range(5, 14), 1.1)), [True, False, False]),
], ids=["equal", "3%-slower", "5%-slower", "equal-one-stall", "equal-burst", "equal-two-stalls",
        "5%-slower-one-stall", "3%-slower-one-stall", "equal-whole-report-slow"])
def test_a_speed_report_spoiled_by_stalls_does_not_stop_an_equal_recipe(steps, stopped):
    # At 2% A/A noise, against a median of 1.0 (the baseline's): a report's value is the median of
    # its windows' tokens/s over the profile's, its bound two spreads above (A/A and its own spread).
    reports = speed_reports(steps)
    assert [r["upper"] < 1.0 for r in reports] == stopped  # Search.prune: stopped only when upper < median
