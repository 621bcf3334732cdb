"""The baseline profile: the initial recipe measured a few times, once per campaign.

Repeats with different seeds (where the workload has a ``seed`` knob) give the reference every
candidate is judged against: how far loss curves of equally good runs lie apart, how much the
final loss varies, and how much throughput moves when nothing changed (consecutive repeats are
A/A pairs). Stored as JSON so a resumed campaign does not measure it again.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from recipetune.guard import stats
from recipetune.guard.config import GuardConfig, ParitySettings
from recipetune.measure import RunResult
from recipetune.recipe import Recipe
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
    loss_reference: float  # spread of smoothed loss curves between seeds (nats)
    loss_reference_kind: str  # "seeds" or "batch noise" (one run, or no seed knob)
    loss_tolerance: float  # band for the same-seed paired smoothed-loss comparison (nats)
    final_losses: list[float]  # per seed: validation loss at the end, else smoothed training loss
    final_metric: str
    loss_margin: float  # non-inferiority margin on the final loss (nats)
    # "fixed": the workload replays its batches whatever the speed knobs (profiles stored before this
    # field existed were all judged so); "auto": the guard finds out per candidate
    data_order: str = "fixed"
    noise_note: str = ""  # an absurd A/A noise refused and measured again, or a busy machine

    def save(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2))

    @classmethod
    def load(cls, path: Path) -> BaselineProfile:
        return cls.model_validate_json(path.read_text())

    def curves(self, n: int | None = None) -> list[list[float]]:
        return [r.losses()[:n] for r in self.runs]

    def reference(self, n: int | None, window: int) -> tuple[float, str]:
        """The loss reference spread over the first ``n`` records (all when None)."""
        return loss_reference(self.curves(n), window, distinct_seeds=len(set(self.seeds)) > 1)


def seeds_for(workload: Workload, recipe: Recipe, n: int) -> list[int | None]:
    """The baseline's own seed first, then the next ones; plain repeats without a seed knob."""
    if "seed" not in workload.knobs():
        return [None] * n
    first = int(recipe.get("seed", workload.knobs()["seed"].default))
    return [first + k for k in range(n)]


def with_seed(recipe: Recipe, seed: int | None) -> Recipe:
    return recipe if seed is None else recipe.with_(seed=seed)


def final_loss(run: RunResult, window: int) -> tuple[float, str]:
    """The validation loss at the end of the run, else the smoothed training loss at its end."""
    if run.evals and run.steps and run.evals[-1].step == run.steps[-1].step:
        return run.evals[-1].val_loss, "validation loss"
    return float(stats.smooth(run.losses(), window)[-1]), f"training loss (last {window} steps)"


def loss_reference(curves: list[list[float]], window: int, distinct_seeds: bool) -> tuple[float, str]:
    if distinct_seeds and len(curves) > 1:
        return stats.seed_spread(curves, window), "seeds"
    return statistics.median(stats.batch_noise_spread(c, window) for c in curves), "batch noise"


def loss_margin(parity: ParitySettings, finals: list[float], reference: float, distinct_seeds: bool) -> float:
    """The stated non-inferiority margin, or the baseline's own seed-to-seed std of the final loss."""
    if parity.margin is not None:
        return parity.margin
    spread = stats.sample_std(finals) if distinct_seeds and len(finals) > 1 else reference
    return max(parity.floor, spread)


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
    parity, window = settings.parity, settings.parity.window
    distinct = len(set(seeds)) > 1
    throughputs = [r.summary().tokens_per_s_per_device for r in runs]
    aa = [float(x) for x in stats.log_ratios(throughputs[1:], throughputs[:-1])] if len(runs) > 1 else []
    reference, kind = loss_reference([r.losses() for r in runs], window, distinct)
    finals = [final_loss(r, window) for r in runs]
    return BaselineProfile(
        recipe=dict(recipe),
        roles={name: knob.role for name, knob in workload.knobs().items()},
        steps=steps,
        window=window,
        seeds=seeds,
        runs=runs,
        tokens_per_s=statistics.median(throughputs),
        throughput_noise=stats.noise_margin(aa, 0.0),
        aa_log_ratios=aa,
        loss_reference=reference,
        loss_reference_kind=kind,
        loss_tolerance=stats.tolerance(reference, parity.tolerance, parity.floor),
        final_losses=[f for f, _ in finals],
        final_metric=finals[0][1],
        loss_margin=loss_margin(parity, [f for f, _ in finals], reference, distinct),
        data_order="fixed" if getattr(workload, "sample_order_fixed", False) else "auto",
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
    rates = [r.summary().tokens_per_s_per_device for r in runs]
    aa = [float(x) for x in stats.log_ratios(rates[1:], rates[:-1])]
    noise = stats.noise_margin(aa, 0.0)
    note = (f"A/A noise {100 * before:.0f}% over the profile runs refused (above speed.max_noise "
            f"{100 * settings.speed.max_noise:.0f}%); measured again over {n} runs: {100 * noise:.0f}%")
    if noise > settings.speed.max_noise:
        note += "; still absurd: the machine was busy, and the final verdict will rely on its own pairs"
    return profile.model_copy(update={"aa_log_ratios": aa, "throughput_noise": noise,
                                      "tokens_per_s": statistics.median(rates), "noise_note": note})


def profile_baseline(
    workload: Workload,
    recipe: Recipe,
    steps: int,
    settings: GuardConfig,
    out_dir: Path,
    progress: Progress | None = None,
) -> BaselineProfile:
    """Run the baseline once per seed (``settings.parity.seeds``), each in ``out_dir/seed-S``."""
    seeds = seeds_for(workload, recipe, settings.parity.seeds)
    runs = []
    for k, seed in enumerate(seeds):
        if progress:
            progress(f"baseline run {k + 1}/{len(seeds)}" + (f" (seed {seed})" if seed is not None else ""))
        folder = out_dir / (f"seed-{seed}" if seed is not None else f"repeat-{k}")
        runs.append(run_checked(workload, with_seed(recipe, seed), steps, folder, settings, "baseline run"))
    profile = build_profile(workload, recipe, runs, seeds, steps, settings)
    if profile.throughput_noise > settings.speed.max_noise and settings.speed.noise_margin is None:
        profile = remeasure_throughput(workload, recipe, profile, settings, out_dir, progress)
    out_dir.mkdir(parents=True, exist_ok=True)
    profile.save(out_dir / "profile.json")
    return profile
