"""The speed job: faster tokens/s per device at an unchanged loss, the guard as the control system.

    plan()   speed/plan.py: every check before anything is written
    run()    baseline profile -> the engine's loop (engine/loop.py: ask, static check, run, screen,
             backpropagate, store) until the budget is spent -> the decision (speed/decide.py:
             final verdict on the best few -> APPROVED or KEEP BASELINE, approved.yaml, launch command)

``SpeedJob`` is what the engine asks of this job: the guard's baseline profile is the root, the
guard's static check refuses a recipe before it runs, screening judges a run, and the reward is the
log speed-up (``reward``). The guard is reached through ``Guard`` (speed/control.py), a typed boundary:
its answers are the guard's own models (tests substitute fakes that return the same shapes).
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipetune.core.filenames import BASELINE, PROFILE, RESULT, RUNS_FOLDER
from recipetune.core.measure import RunResult, StepRecord, default_warmup_steps, robust_rate
from recipetune.core.process import STOP_FILE
from recipetune.core.recipe import Recipe
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
from recipetune.engine.record import Evidence, Figures, Trial, failure_evidence
from recipetune.engine.status import Status
from recipetune.execute.executor import Executor
from recipetune.execute.factory import make_executor
from recipetune.speed import decide
from recipetune.speed.control import Guard, real_guard
from recipetune.speed.facts import BRIEFING
from recipetune.speed.plan import Plan
from recipetune.workloads.base import tokens_per_step

if TYPE_CHECKING:
    from recipetune.guard.baseline import BaselineProfile
    from recipetune.guard.screen import Screening

# -- what a trial stores ---------------------------------------------------------------------------


class SpeedFigures(Figures):
    """The speed job's figures of one trial (engine/record.py), as the study stores them."""

    LEGACY_SCORE = "speedup"  # campaigns written before the engine's ``score`` key: a passed trial's speed-up

    speedup: float | None = None  # screened tokens/s per device over the baseline's
    screening: dict[str, Any] | None = None  # guard/screen.py: Screening
    loss: str = ""  # the screening's one-line loss verdict
    tokens_per_s: float | None = None  # per device
    mfu: float | None = None
    step_time_s: float | None = None
    peak_mem_bytes: int | None = None
    loss_last: float | None = None
    pruned_at: int | None = None  # the throughput window a pruner stopped it at
    speedup_at_prune: float | None = None
    compile_s: float | None = None  # torch.compile's seconds in the trial, apart from its steady tokens/s
    charged_speedup: float | None = None  # the speed-up over search.production_steps, compile paid once


# -- the reward ---------------------------------------------------------------------------------


def reward(speedup: float | None, passed: bool, span: float = 4.0, penalty: float = 0.0) -> float:
    """The speed job's reward of one trial, in [0, 1] (engine/tree.py). A candidate that passes
    screening earns ``0.5 + 0.5 * log(speedup) / log(span)`` clipped to [0, 1]: 1.0x earns 0.5,
    ``span``x earns 1, 1/``span``x earns 0. Speed-ups compose multiplicatively along a path, so the
    logarithm makes equal ratios worth equal rewards. A rejected or failed trial earns ``penalty``."""
    if not passed or speedup is None or not speedup > 0:
        return penalty
    return min(1.0, max(0.0, 0.5 + 0.5 * math.log(speedup) / math.log(span)))


def charge_compile(speedup: float | None, tokens_per_s: float, tokens_per_step: int, compile_s: float,
                   production_steps: int) -> float | None:
    """The speed-up over a production run of ``production_steps`` steps that pays the trial's compile seconds once.

    Steady throughput leaves compilation out (the warm-up steps), so a 30-step trial does not make compiling
    look slow; but a recipe is launched for its planned length, and ``compile_s`` seconds spread over it cost
    ``compile_s * tokens_per_s / (production_steps * tokens_per_step)`` of its time. The baseline is charged
    nothing (its profile has no compile seconds), which only ever lowers a compiled candidate's rank.
    0 steps, or nothing compiled: the steady speed-up unchanged.
    """
    if speedup is None or production_steps <= 0 or compile_s <= 0 or tokens_per_step <= 0:
        return speedup
    return speedup / (1 + compile_s * tokens_per_s / (production_steps * tokens_per_step))


# -- the job ------------------------------------------------------------------------------------


def _loss_text(screening: Screening | None) -> str:
    if screening is None:
        return ""
    if screening.passed:
        if screening.loss_gap is not None and screening.loss_tolerance is not None:
            return f"ok (loss {screening.loss_gap:+.3f} vs T {screening.loss_tolerance:.3f})"
        return "ok"
    return "; ".join(screening.reasons) or "rejected"


class SpeedJob:
    """Faster tokens/s per device at an unchanged loss; the guard is the control system."""

    name = "speed"
    figures = SpeedFigures

    def __init__(self, p: Plan, guard: Guard):
        self.guard = guard
        self.campaign, self.cfg = p.campaign, p.campaign.config.search
        self.workload = self.subject = p.campaign.workload
        self.baseline, self.space, self.batch = p.campaign.baseline, p.space, p.batch
        self.settings = p.campaign.config.guard
        self.briefing = BRIEFING
        self.profile: BaselineProfile | None = None
        self.services: Services | None = None

    def start(self, services: Services) -> Root:
        self.services = services
        store, reporter = services.store, services.reporter
        saved = store.folder / PROFILE
        if saved.exists():
            self.profile = self.guard.load_profile(saved.read_text())
            reporter.phase("baseline profile loaded from the previous session")
        else:
            # As long as the guard's parity runs, so its final verdicts reuse this profile; a trial's
            # shorter run is screened over the steps both have.
            steps = max(self.cfg.steps_per_trial, self.settings.parity.steps)
            reporter.phase(f"profiling the baseline ({steps} steps per run)")
            # On the executor: the baseline is measured on the same kind of placement as the trials.
            self.profile = services.executor.call(
                self.guard.profile_baseline, self.workload, self.baseline, steps, self.settings,
                store.folder / BASELINE, progress=reporter.phase,
                runs_folder=store.folder / RUNS_FOLDER,  # each run kept as it ends: a kill loses one
            ).result()
            store.write_json(PROFILE, self.profile)
        profile = self.profile
        reporter.phase(f"baseline {self.baseline.id}: {profile.tokens_per_s:,.0f} tokens/s per device, "
                       f"noise {100 * profile.throughput_noise:.1f}%")
        if self.batch is not None:
            b = self.batch
            reporter.phase(f"{b.knob} may change up to {b.bound} ({b.source}); {b.lr_knob} follows it "
                           f"({b.scaling}); loss is judged at equal tokens")
        # The noise of a speed-up: the A/A throughput noise of the profile (the gain a plateau must beat);
        # the curve: the baseline's own windows, what the pruner compares a trial's with.
        first = profile.runs[0] if profile.runs else None
        curve = {int(w["checkpoint"]): float(w["value"]) for w in self.windows(first.steps, len(first.steps))} \
            if first is not None and self.cfg.pruning.on else {}
        return Root(first, 1.0, noise=profile.throughput_noise, curve=curve, speed_reports=True)

    def windows(self, steps: list[StepRecord], expected: int, n_devices: int = 1) -> list[dict[str, Any]]:
        """The speed-up reports of a run so far: after the warm-up, at k/(N+1) of its measured steps
        (N = search.pruning.checkpoints), its tokens/s per device over the measured steps up to there,
        against the baseline profile's, with the most it could plausibly be (``upper``).

        The figure is the run's own (core/measure.py: robust_rate, the median of contiguous windows),
        so one stall moves it little. The bound is two spreads above it; a spread joins the profile's
        A/A noise (one whole run against the next) with the report's own error (``Rate.error``, from
        its windows' robust spread). A short report spoiled by stalls has a wide bound, so a
        neighbour's burst does not stop a recipe that is as fast."""
        assert self.profile is not None
        n, warm = self.cfg.pruning.checkpoints, default_warmup_steps(expected)
        measured = [s for s in steps if s.step > warm]
        out = []
        for k, at in sorted((k, step) for step, k in checkpoint_steps(expected - warm, n).items()):
            if len(measured) < at:
                break
            rate = robust_rate(measured[:at])
            value = rate.tokens_per_s / n_devices / self.profile.tokens_per_s
            upper = value * (1 + 2 * math.hypot(self.profile.throughput_noise, rate.error))
            out.append({"checkpoint": k, "of": n, "value": value, "upper": upper})
        return out

    def allowed(self, recipe: Recipe) -> list[str]:
        """Semantic knobs ``recipe`` may change: the campaign's, plus a learning rate coupled to the batch."""
        return self.batch.allow(recipe, self.cfg.allow_semantic) if self.batch is not None else self.cfg.allow_semantic

    def check(self, recipe: Recipe) -> Checked:
        # The learning rate follows an allowed change of the global batch; the note says what was set.
        recipe, note = self.batch.couple(recipe) if self.batch is not None else (recipe, "")
        violations = [*(self.batch.violations(recipe) if self.batch is not None else []),
                      *self.guard.static_check(self.workload, self.baseline, recipe,
                                               allow_semantic=self.allowed(recipe))]
        if violations:
            refusal = "static check: " + "; ".join(f"{v.knob}: {v.message}" for v in violations)
            return Checked(recipe, note, refusal, [vars(v) for v in violations])
        return Checked(recipe, note, plan={"steps": self.trial_steps(recipe)})

    def trial_steps(self, recipe: Recipe) -> int:
        steps = self.cfg.steps_per_trial
        if self.batch is not None:  # another batch trains the profile's tokens, to be judged at equal tokens
            steps = self.batch.trial_steps(recipe, steps, self.profile.steps if self.profile else steps)
        return steps

    def submit(self, recipe: Recipe, run_dir: Path, plan: dict[str, Any], progress: Progress) -> Future:
        assert self.services is not None
        steps = plan["steps"]
        done = threading.Event()
        if self.cfg.speed_reports:  # its throughput windows go to the pruner and the set-aside rule as it runs
            n_devices = self.workload.n_devices(recipe)
            watch(lambda: self.windows(self.workload.steps_so_far(recipe, steps, run_dir), steps, n_devices),
                  progress, run_dir / STOP_FILE, done)
        future = self.services.executor.submit(self.workload, recipe, steps, run_dir,
                                               self.campaign.config.run.timeout_s,
                                               progress=lambda n: progress.step(n, steps))
        future.add_done_callback(lambda _: done.set())
        return future

    def land(self, result: RunResult, recipe: Recipe, run_dir: Path) -> Landing:
        if result.status == "pruned":  # what it showed is its reward; it is no candidate for the verdict
            at = json.loads((run_dir / STOP_FILE).read_text())
            why = at.get("why") or f"{self.cfg.pruning.pruner} pruner"
            cause = (f"pruned at window {at['checkpoint']}/{at['of']}: {at['value']:.2f}x the baseline's "
                     f"tokens/s ({why})")
            value = reward(at["value"], True, self.cfg.reward_span, self.cfg.failure_penalty)
            figures = SpeedFigures(run_status="pruned", pruned_at=at["checkpoint"], speedup_at_prune=at["value"])
            return Landing(Status.PRUNED, None, value, cause, figures, result, Evidence(at["value"]))
        screening = None
        if result.ok:
            assert self.profile is not None and self.services is not None
            screening = self.guard.screen(self.profile, result, self.settings)
            status, cause = (Status.PASSED, "") if screening.passed else (Status.REJECTED, "; ".join(screening.reasons))
            if screening.passed:  # the final verdict's first candidate run, where it has the same steps: not run twice
                self.guard.keep_run(self.workload, recipe, self.trial_steps(recipe), result,
                                    self.services.store.folder / RUNS_FOLDER)
        else:
            status, cause = Status.FAILED, f"{result.status}: {result.cause}"
        summary = result.summary() if result.steps else None
        speedup = screening.speedup if screening is not None else None
        if summary is not None:  # ranked (score, reward) over the production run, compile paid once
            speedup = charge_compile(speedup, summary.tokens_per_s, result.steps[0].tokens, summary.compile_s,
                                     self.cfg.production_steps)
        value = reward(speedup, status == Status.PASSED, self.cfg.reward_span, self.cfg.failure_penalty)
        compiled = {"compile_s": summary.compile_s, "charged_speedup": speedup} if summary and summary.compile_s else {}
        figures = SpeedFigures(
            speedup=screening.speedup if screening is not None else None, run_status=result.status, **compiled,
            screening=screening.model_dump(mode="json") if screening is not None else None,
            loss=_loss_text(screening), tokens_per_s=summary.tokens_per_s_per_device if summary else None,
            mfu=summary.mfu if summary else None, step_time_s=summary.mean_step_time_s if summary else None,
            peak_mem_bytes=summary.peak_mem_bytes if summary else None,
            loss_last=summary.loss_last if summary else None,
        )
        measured = Evidence(screening.speedup) if screening is not None and screening.speedup else \
            failure_evidence(result.status, self.bound(result, recipe))
        return Landing(status, speedup, value, cause, figures, result, measured)

    def bound(self, result: RunResult, recipe: Recipe) -> float | None:
        """The most a run that timed out can be worth over the baseline's tokens/s per device: the
        trial's tokens could not be trained in ``run.timeout_s``; or, where its steps before the kill
        measured more, that (a slow start is not the steady speed)."""
        assert self.profile is not None
        if self.profile.tokens_per_s <= 0 or not self.profile.runs or not self.profile.runs[0].steps:
            return None
        # the trial's own tokens: its steps (another batch may train the profile's tokens in fewer) of its
        # own size, as it logged them or as the workload says; the baseline's where neither can tell
        per_step = (result.steps[0].tokens if result.steps else None) or tokens_per_step(self.workload, recipe) \
            or self.profile.runs[0].steps[0].tokens
        tokens = self.trial_steps(recipe) * per_step
        devices = max(self.workload.n_devices(recipe), 1)
        bound = tokens / self.campaign.config.run.timeout_s / devices / self.profile.tokens_per_s
        if result.measured():
            bound = max(bound, result.summary().tokens_per_s_per_device / self.profile.tokens_per_s)
        return bound

    def load(self, run_dir: Path) -> RunResult | None:
        if (run_dir / RESULT).exists():
            with contextlib.suppress(ValueError, OSError):
                return RunResult.load(run_dir / RESULT)
        return None

    def row(self, key: str, number: int | None, recipe: Recipe, t: Trial[SpeedFigures]) -> Row:
        f = t.figures
        return Row(key, number, recipe.describe_diff(self.baseline), t.status, f.tokens_per_s, f.speedup, f.loss,
                   t.rationale, t.proposer, t.cause)

    def decide(self, finished: Finished) -> Outcome:
        assert self.services is not None and self.profile is not None
        return decide.decide(self.campaign, self.services, finished, self.profile, self.guard, self.allowed)


def run(p: Plan, guard: Guard | None = None, executor: Executor | None = None,
        reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a planned campaign to its decision. Ctrl-C leaves it resumable."""
    job = SpeedJob(p, guard or real_guard())
    c = p.campaign
    executor = executor or make_executor(c.config.execute, c.workload.n_devices(c.baseline), c.path)
    services = Services(p.store, executor, reporter or Reporter())
    return run_search(job, p.campaign.config.search, services, meta=p.meta, snapshot=p.snapshot,
                      resume=p.resume, proposer=p.proposer)
