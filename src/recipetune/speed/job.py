"""The speed job's campaign: profile the baseline, search faster recipes, and let the guard decide.

    plan()  check everything (space, proposer, folder, resume consistency); writes nothing
    run()   baseline profile -> the shared search (engine/loop.py: select, propose, static check,
            run, screen, backpropagate, store) until the budget is spent -> the decision
            (speed/decide.py: final verdict on the best few -> APPROVED or KEEP BASELINE,
            approved.yaml, launch command)

``SpeedJob`` is what the engine asks of this job: the guard's baseline profile is the root, the
guard's static check refuses a recipe before it runs, screening judges a run, and the reward is the
log speed-up (engine/tree.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.config import Campaign
from recipetune.core.errors import ConfigError
from recipetune.core.measure import RunResult
from recipetune.core.recipe import INVARIANT, SEMANTIC, KnobError, Recipe, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine import plan as planning
from recipetune.engine.loop import Landing, Outcome, Reporter, Row, Search, run_search
from recipetune.engine.plan import build_proposer, check_folder
from recipetune.engine.samplers import make_sampler
from recipetune.engine.store import CampaignStore
from recipetune.engine.tree import reward
from recipetune.execute.executor import Executor, make_executor
from recipetune.speed import decide as finalize
from recipetune.speed.semantic import BatchRule, batch_rule

__all__ = ["Guard", "Outcome", "Plan", "Reporter", "Row", "SpeedJob", "default_folder", "plan", "real_guard", "run"]

# -- the control system, as the search sees it ------------------------------------------------


@dataclass
class Guard:
    """The guard's four entry points (recipetune.guard); tests substitute fakes."""

    static_check: Callable[..., list[Any]]
    profile_baseline: Callable[..., Any]
    screen: Callable[..., Any]
    final_verdict: Callable[..., Any]
    load_profile: Callable[[str], Any]


def real_guard() -> Guard:
    from recipetune.guard.baseline import BaselineProfile, profile_baseline
    from recipetune.guard.screen import screen
    from recipetune.guard.static import static_check
    from recipetune.guard.verdict import final_verdict

    return Guard(static_check, profile_baseline, screen, final_verdict, BaselineProfile.model_validate_json)


# -- planning: every check before anything is written -----------------------------------------


@dataclass
class Plan(planning.Plan):
    campaign: Campaign
    batch: BatchRule | None = None  # the global batch may change, up to a measured CBS


def check_space(campaign: Campaign) -> SearchSpace:
    cfg, path = campaign.config.search, campaign.path
    if not cfg.knobs:
        raise ConfigError(path, "search.knobs", "no knobs to search; list knobs with the values to try")
    knobs = campaign.workload.knobs()
    try:
        space = SearchSpace.from_lists(knobs, cfg.knobs)
    except KnobError as e:
        raise ConfigError(path, f"search.knobs.{e.knob}", str(e)) from None
    for name in space.values:
        role = knobs[name].role
        if knobs[name].derive:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' is derived from '{knobs[name].derive}' and never searched; "
                              "search the knobs it is derived from")
        if role == INVARIANT:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' defines the experiment (an invariant knob) and cannot be searched")
        if role == SEMANTIC and name not in cfg.allow_semantic:
            raise ConfigError(path, f"search.knobs.{name}",
                              f"'{name}' may change what the model learns; list it in search.allow_semantic "
                              "to search it (the guard then judges it on loss)")
    return space


def campaign_meta(campaign: Campaign, space: SearchSpace, batch: BatchRule | None = None) -> dict[str, Any]:
    cfg = campaign.config.search
    return {
        "job": "speed", "file": str(campaign.path.resolve()), "workload": campaign.workload.kind,
        "baseline": dict(campaign.baseline), "baseline_id": campaign.baseline.id,
        "space": {n: list(v) for n, v in space.values.items()}, "allow_semantic": sorted(cfg.allow_semantic),
        "strategy": cfg.strategy, "steps_per_trial": cfg.steps_per_trial,
        "global_batch": batch.meta() if batch is not None else None,
    }


RESUME_KEYS = ("baseline_id", "space", "strategy", "steps_per_trial", "allow_semantic", "global_batch")


def plan(campaign: Campaign, folder: Path, resume: bool = False) -> Plan:
    """Check the campaign and its folder; raise ConfigError (exit 2) before anything is written."""
    cfg = campaign.config.search
    space = check_space(campaign)
    batch = batch_rule(campaign)
    proposer = build_proposer(cfg, campaign.path)
    meta = campaign_meta(campaign, space, batch)
    n_done = check_folder(folder, cfg, meta, resume, RESUME_KEYS, campaign.path)
    # A resumed campaign draws afresh: a sampler re-seeded identically would replay its first picks.
    parallel = campaign.config.execute.parallel
    sampler = make_sampler(cfg.strategy, space, campaign.baseline, cfg.seed + n_done, campaign.workload.relations(),
                           parallel)
    store = CampaignStore(folder, cfg.storage, sampler, campaign.config.execute.heartbeat_s)
    return Plan(campaign, folder, resume, space, proposer, meta, store, batch)


# -- the job ------------------------------------------------------------------------------------


def _speedup_text(screening: Any) -> str:
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
    columns = ("tok/s/dev", "speed-up", "loss check")

    def __init__(self, p: Plan, guard: Guard):
        self.p, self.guard = p, guard
        self.campaign, self.cfg = p.campaign, p.campaign.config.search
        self.workload = self.subject = p.campaign.workload
        self.baseline, self.space, self.batch = p.campaign.baseline, p.space, p.batch
        self.settings = p.campaign.config.guard
        self.heartbeat_s = p.campaign.config.execute.heartbeat_s
        self.profile: Any = None
        self.executor: Executor | None = None

    def relations(self) -> Relations:
        return self.workload.relations()

    def context_options(self) -> dict[str, Any]:
        return {}  # SearchContext's defaults are the speed job's

    def snapshot(self) -> dict[str, Any]:
        snapshot = self.campaign.config.model_dump(mode="json")
        if snapshot["search"]["llm"].get("api_key"):
            snapshot["search"]["llm"]["api_key"] = "(redacted)"  # the folder is shared; the key is not
        return snapshot

    def start(self, search: Search) -> tuple[Any, float | None]:
        store, reporter = search.store, search.reporter
        self.executor = search.executor
        saved = store.folder / "baseline_profile.json"
        if saved.exists():
            self.profile = self.guard.load_profile(saved.read_text())
            reporter.phase("baseline profile loaded from the previous session")
        else:
            # As long as the guard's parity runs, so its final verdicts reuse this profile; a trial's
            # shorter run is screened over the steps both have.
            steps = max(self.cfg.steps_per_trial, self.settings.parity.steps)
            reporter.phase(f"profiling the baseline ({steps} steps per run)")
            # On the executor: the baseline is measured on the same kind of placement as the trials.
            self.profile = search.executor.call(
                self.guard.profile_baseline, self.workload, self.baseline, steps, self.settings,
                store.folder / "baseline", progress=reporter.phase,
            ).result()
            store.write_json("baseline_profile.json", self.profile)
        reporter.phase(f"baseline {self.baseline.id}: {self.profile.tokens_per_s:,.0f} tokens/s per device, "
                       f"noise {100 * self.profile.throughput_noise:.1f}%")
        if self.batch is not None:
            b = self.batch
            reporter.phase(f"{b.knob} may change up to {b.bound} ({b.source}); {b.lr_knob} follows it "
                           f"({b.scaling}); loss is judged at equal tokens")
        return (self.profile.runs[0] if getattr(self.profile, "runs", None) else None), 1.0

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        """The learning rate follows an allowed change of the global batch; the note says what was set."""
        return self.batch.couple(recipe) if self.batch is not None else (recipe, "")

    def allowed(self, recipe: Recipe) -> list[str]:
        """Semantic knobs ``recipe`` may change: the campaign's, plus a learning rate coupled to the batch."""
        return self.batch.allow(recipe, self.cfg.allow_semantic) if self.batch is not None else self.cfg.allow_semantic

    def refuse(self, recipe: Recipe) -> tuple[str, list[Any]]:
        violations = [*(self.batch.violations(recipe) if self.batch is not None else []),
                      *self.guard.static_check(self.workload, self.baseline, recipe,
                                               allow_semantic=self.allowed(recipe))]
        if not violations:
            return "", []
        cause = "static check: " + "; ".join(f"{v.knob}: {v.message}" for v in violations)
        return cause, [vars(v) if hasattr(v, "__dict__") else str(v) for v in violations]

    def plan_run(self, recipe: Recipe) -> dict[str, Any]:
        steps = self.cfg.steps_per_trial
        if self.batch is not None:  # another batch trains the profile's tokens, to be judged at equal tokens
            steps = self.batch.trial_steps(recipe, steps, getattr(self.profile, "steps", steps))
        return {"steps": steps}

    def submit(self, executor: Executor, recipe: Recipe, run_dir: Path, plan: dict[str, Any],
               progress: Callable[[int, int], None]) -> Future:
        steps = plan["steps"]
        return executor.submit(self.workload, recipe, steps, run_dir, self.campaign.config.run.timeout_s,
                               progress=lambda done: progress(done, steps))

    def land(self, result: RunResult, recipe: Recipe, run_dir: Path) -> Landing:
        screening = None
        if result.ok:
            screening = self.guard.screen(self.profile, result, self.settings)
            status, cause = ("passed", "") if screening.passed else ("rejected", "; ".join(screening.reasons))
        else:
            status, cause = "failed", f"{result.status}: {result.cause}"
        speedup = screening.speedup if screening is not None else None
        value = reward(speedup, status == "passed", self.cfg.reward_span, self.cfg.failure_penalty)
        summary = result.summary() if result.steps else None
        figures = {
            "speedup": speedup, "run_status": result.status, "screening": screening, "loss": _speedup_text(screening),
            "tokens_per_s": summary.tokens_per_s_per_device if summary else None,
            "mfu": summary.mfu if summary else None,
            "step_time_s": summary.mean_step_time_s if summary else None,
            "peak_mem_bytes": summary.peak_mem_bytes if summary else None,
            "loss_last": summary.loss_last if summary else None,
        }
        return Landing(status, speedup, value, cause, figures, result)

    def load_result(self, run_dir: Path) -> RunResult | None:
        if (run_dir / "result.json").exists():
            with contextlib.suppress(ValueError, OSError):
                return RunResult.load(run_dir / "result.json")
        return None

    def row(self, key: str, number: int | None, recipe: Recipe, a: dict[str, Any]) -> Row:
        return Row(key, number, recipe.describe_diff(self.baseline), a.get("status", ""), a.get("tokens_per_s"),
                   a.get("speedup"), a.get("loss", ""), a.get("rationale", ""), a.get("proposer", ""),
                   a.get("cause", ""))

    def decide(self, search: Search) -> Outcome:
        assert search.tree is not None
        return finalize.decide(self.campaign, search.store, search.tree, self.profile, search.runs,
                               final_verdict=self.guard.final_verdict, executor=search.executor,
                               allowed=self.allowed, phase=search.reporter.phase)


def run(p: Plan, guard: Guard | None = None, executor: Executor | None = None,
        reporter: Reporter | None = None) -> Outcome:
    """Run (or resume) a planned campaign to its decision. Ctrl-C leaves it resumable."""
    job = SpeedJob(p, guard or real_guard())
    return run_search(job, p.store, p.meta, p.resume, p.proposer, executor or make_executor(p.campaign), reporter)


def default_folder(campaign_file: Path) -> Path:
    return Path("campaigns") / campaign_file.stem
