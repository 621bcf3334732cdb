"""The baseline profile: the initial recipe measured a few times, once per campaign.

Repeats with different seeds (where the workload has a ``seed`` knob) give the reference every
candidate is judged against: how much the loss measure M of equally good runs varies (the tolerance
T, guard/loss.py), and how much throughput moves when nothing changed (consecutive repeats are A/A
pairs). Stored as JSON so a resumed campaign does not measure it again.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from recipetune.core import clock, stats
from recipetune.core.files import write_atomic
from recipetune.core.measure import RunResult
from recipetune.core.recipe import Recipe
from recipetune.guard import loss
from recipetune.guard.config import GuardConfig
from recipetune.guard.runs import Runs
from recipetune.workloads.base import Workload

Progress = Callable[[str], None]


class GuardError(RuntimeError):
    """The guard cannot decide: a baseline run failed, so there is nothing to compare against."""


class BaselineProfile(BaseModel):
    recipe: dict[str, bool | int | float | str]
    roles: dict[str, str] = Field(default_factory=dict)  # knob -> role, to spot semantic edits later
    steps: int
    window: int
    seeds: list[int | None]  # None: the workload has no seed knob, the repeats are plain repeats
    runs: list[RunResult]  # one per seed, in that order; runs[0] has the baseline's own seed
    tokens_per_s: float  # median over the repeats, per device, warm-up excluded
    throughput_noise: float  # relative A/A spread of consecutive repeats
    aa_log_ratios: list[float]  # log(tokens/s of repeat i+1 / repeat i)
    loss_reference: float  # the baseline's seed-to-seed std of the training-loss measure M (nats)
    loss_reference_kind: str  # how it was measured (seeds, or within-run noise)
    loss_tolerance: float  # T on that measure at the profile's length (nats)
    final_losses: list[float]  # per seed: the training-loss measure M
    final_metric: str
    # "fixed": the workload replays its batches whatever the speed knobs (profiles stored before this
    # field existed were all judged so); "auto": the guard finds out per candidate
    data_order: str = "fixed"
    noise_note: str = ""  # an absurd A/A noise refused and measured again, or a busy machine
    timed_by: str = "trainer"  # whose clock the throughput figures are on: "trainer" or "guard" (core/clock.py)
    clock_note: str = ""  # why: the trainer's times agree with the guard's clock, or how they disagree

    def save(self, path: Path) -> None:
        write_atomic(path, self.model_dump_json(indent=2))


def seeds_for(workload: Workload, recipe: Recipe, n: int) -> list[int | None]:
    """The baseline's own seed first, then the next ones; plain repeats without a seed knob."""
    if "seed" not in workload.knobs():
        return [None] * n
    first = int(recipe.get("seed", workload.knobs()["seed"].default))
    return [first + k for k in range(n)]


def with_seed(recipe: Recipe, seed: int | None) -> Recipe:
    return recipe if seed is None else recipe.with_(seed=seed)


def run_checked(
    workload: Workload, recipe: Recipe, steps: int, out_dir: Path, settings: GuardConfig, what: str
) -> RunResult:
    result = workload.run(recipe, steps, out_dir, timeout_s=settings.timeout_s)
    if not result.ok:
        raise GuardError(f"{what} failed ({result.status}: {result.cause}); see {out_dir}")
    return result


def build_profile(
    workload: Workload, recipe: Recipe, runs: list[RunResult], seeds: list[int | None], steps: int,
    settings: GuardConfig,
) -> BaselineProfile:
    parity = settings.parity
    distinct = loss.independent_repeats(seeds, runs)
    choice = clock.choose(runs)  # the trainer's printed times, where they agree with the guard's clock
    throughputs = [choice.rate(r) for r in runs]
    aa = stats.aa_log_ratios(throughputs)
    tol, reference, kind = loss.tolerance(runs, parity, False, None, distinct)
    finals = [stats.mean_with_error([s.loss for s in loss.tail(r, loss.tokens(r)[-1], parity.tail)]).mean
              for r in runs]
    return BaselineProfile(
        recipe=dict(recipe),
        roles={name: knob.role for name, knob in workload.knobs().items()},
        steps=steps,
        window=parity.window,
        seeds=seeds,
        runs=runs,
        tokens_per_s=statistics.median(throughputs),
        throughput_noise=stats.noise_margin(aa, 0.0),
        aa_log_ratios=aa,
        loss_reference=reference,
        loss_reference_kind=kind,
        loss_tolerance=tol,
        final_losses=finals,
        final_metric=f"training loss (mean over the last {100 * parity.tail:.0f}% of the tokens)",
        data_order="fixed" if getattr(workload, "sample_order_fixed", False) else "auto",
        timed_by="guard" if choice.guard else "trainer",
        clock_note=choice.note,
    )


def trusted_aa(profile: BaselineProfile, settings: GuardConfig) -> tuple[list[float], str]:
    """The profile's A/A log ratios when their noise is plausible; a stored absurd noise (a profile
    that caught a neighbour's burst, possibly from an earlier session) is refused, never reused."""
    noise = stats.noise_margin(profile.aa_log_ratios, 0.0)
    if noise <= settings.speed.max_noise:
        return list(profile.aa_log_ratios), ""
    return [], (f"the stored baseline profile's A/A noise {100 * noise:.0f}% is above speed.max_noise "
                f"{100 * settings.speed.max_noise:.0f}% and is not reused: the verdict's own pairs give the noise")


def remeasure_throughput(
    workload: Workload, recipe: Recipe, profile: BaselineProfile, settings: GuardConfig, out_dir: Path,
    progress: Progress | None = None,
) -> BaselineProfile:
    """An absurd A/A noise is refused: the baseline's throughput is measured again (fresh runs of
    ``speed.steps`` steps); if the noise is still absurd the profile says the machine was busy."""
    before = profile.throughput_noise
    n = max(3, len(profile.runs))
    if progress:
        progress(f"A/A noise {100 * before:.0f}% is above speed.max_noise: measuring the baseline's throughput again")
    runs = [run_checked(workload, with_seed(recipe, profile.seeds[0]), settings.speed.steps, out_dir / f"again-{k}",
                        settings, "baseline throughput run") for k in range(n)]
    choice = clock.choose(runs)
    rates = [choice.rate(r) for r in runs]
    aa = stats.aa_log_ratios(rates)
    noise = stats.noise_margin(aa, 0.0)
    note = (f"A/A noise {100 * before:.0f}% over the profile runs refused (above speed.max_noise "
            f"{100 * settings.speed.max_noise:.0f}%); measured again over {n} runs: {100 * noise:.0f}%")
    if noise > settings.speed.max_noise:
        note += "; still absurd: the machine was busy, and the final verdict will rely on its own pairs"
    return profile.model_copy(update={"aa_log_ratios": aa, "throughput_noise": noise, "noise_note": note,
                                      "tokens_per_s": statistics.median(rates),
                                      "timed_by": "guard" if choice.guard else "trainer", "clock_note": choice.note})


def profile_baseline(
    workload: Workload,
    recipe: Recipe,
    steps: int,
    settings: GuardConfig,
    out_dir: Path,
    progress: Progress | None = None,
    runs: Runs | None = None,
) -> BaselineProfile:
    """Run the baseline once per seed (``settings.parity.seeds``), each in ``out_dir/seed-S``, one after
    another on this placement (their throughput is measured too). ``runs``: where runs are stored: one
    stored there earlier (by a verdict, or by this profile before a kill) is reused, and each run is
    kept there as soon as it finishes, so a profile killed after its first run resumes at the second.
    Without ``runs`` nothing is kept."""
    seeds = seeds_for(workload, recipe, settings.parity.seeds)
    results = []
    for k, seed in enumerate(seeds):
        folder = out_dir / (f"seed-{seed}" if seed is not None else f"repeat-{k}")
        repeat = k if seed is None else 0  # without a seed knob, repeat k of one recipe is its own run
        what = f"baseline run {k + 1}/{len(seeds)}" + (f" (seed {seed})" if seed is not None else "")
        if progress:
            progress(what)
        def make(s: int | None = seed, f: Path = folder) -> RunResult:
            return workload.run(with_seed(recipe, s), steps, f, timeout_s=settings.timeout_s)

        result, reused = (make(), False) if runs is None else runs.produce(with_seed(recipe, seed), steps, make, repeat)
        if not result.ok:
            raise GuardError(f"baseline run failed ({result.status}: {result.cause}); see {folder}")
        if reused and progress:
            progress(f"{what}: reused from {result.out_dir}")
        results.append(result)
    profile = build_profile(workload, recipe, results, seeds, steps, settings)
    if profile.throughput_noise > settings.speed.max_noise and settings.speed.noise_margin is None:
        profile = remeasure_throughput(workload, recipe, profile, settings, out_dir, progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    profile.save(out_dir / "profile.json")
    return profile
