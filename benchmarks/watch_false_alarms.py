"""False alarms of `recipetune watch` over simulated long runs of an equivalent (docs/guard.md, "After approval").

Each simulated run is a loss curve ``2 + 3 / sqrt(step)`` with its seed's offset (sd ``offset``), batch
noise (sd ``noise`` per step), EMA-smoothed or not; it is watched against 3 baseline curves drawn the
same way (another seed each), with the design the command uses (guard/drift.py: plan; guard/monitor.py: Monitor; the
blocks tuned for a drift of 1 T per 100 steps, T the seed offset's sd): an alarm on either side, above
or below the baselines. The noise settings: the fixture trainer's, the
reference trainer's nano runs as measured by benchmarks/watch_reference.py (per-step noise 0.18 nats,
seed offset about 0.02), and their validation loss (a point every 20 steps, offset sd 0.017, point
noise 0.03 correlated over ~2.4 points, as the watch of real nano runs measured it).

    python benchmarks/watch_false_alarms.py --runs 400
    python benchmarks/watch_false_alarms.py --runs 1000 --settings 0 3 --seed 3026   # fresh draws of two settings
    python benchmarks/watch_false_alarms.py --runs 1000 --steps 2000 --settings 4 --both   # both losses judged
    python benchmarks/watch_false_alarms.py --runs 400 --steps 2000 --margin 1   # a profile with guard.parity.margin

Both losses judged (``--measure auto`` where the runs record a validation loss): each at alpha / 2, the
run's training and validation losses sharing the seed's offset (one model level), an alarm on either.

With ``--margin K`` the baselines are a campaign folder's profile instead, as ``recipetune watch`` reads
it without ``--baseline``: the 3 baseline curves are the profile's 3 seeds (guard/baseline.py:
build_profile measures its spread sigma_M on them), ``guard.parity.margin`` is K x the offset's sd (T),
and the run is judged by the command's own code (speed/watch_read.py: stored_baseline, speed/watch.py:
Session), the training loss only.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import yaml
from scipy.signal import lfilter

from recipetune.config import load_campaign
from recipetune.core.filenames import PROFILE
from recipetune.core.measure import RunResult, StepRecord
from recipetune.core.stats import proportion_ci
from recipetune.guard import drift
from recipetune.guard.baseline import build_profile
from recipetune.guard.monitor import Measure, Monitor, Monitors, direction
from recipetune.speed.watch import Session
from recipetune.speed.watch_read import Stream, stored_baseline

SETTINGS = [  # (name, offset sd, per-point noise sd, EMA over the logged points, steps between points)
    ("fixture, raw", 0.01, 0.03, 0.0, 1),
    ("fixture, EMA 0.9", 0.01, 0.03, 0.9, 1),
    ("nano as measured, raw", 0.02, 0.18, 0.0, 1),
    ("nano as measured, EMA 0.98", 0.02, 0.18, 0.98, 1),
    ("nano validation loss as measured (every 20 steps)", 0.017, 0.045, 0.4, 20),
]
BOTH = [  # both losses of one run judged, each at alpha / 2 (speed/watch.py, --measure auto): (name, training
    # loss's row of SETTINGS, validation loss's (offset sd, point noise sd, EMA, steps between points)); the
    # seed's offset is the model's level, one draw for both losses of a run (scaled to each one's sd)
    ("both losses, fixture trainer: training raw + validation every 10 steps (offset 0.01, point noise 0.01)",
     0, (0.01, 0.01, 0.0, 10)),
    ("both losses, nano as measured: training raw + validation every 20 steps", 2, SETTINGS[4][1:]),
]
WINDOW = 10  # the guard's window in steps: the shortest block (speed/watch.py: max(3, window / interval))
HORIZON = 100  # the guard's horizon: the blocks are tuned for a drift of 1 T per HORIZON steps (T: the offset sd)


def curve(rng: np.random.Generator, t: np.ndarray, offset: float, noise: float, ema: float,
          level: float | None = None) -> drift.Curve:
    """``level``: the seed's offset in sds (drawn here where not given)."""
    u = rng.standard_normal() if level is None else level
    raw = 2 + 3 / np.sqrt(t) + offset * u + rng.normal(0, noise, len(t))
    loss = lfilter([1 - ema], [1, -ema], raw, zi=[ema * raw[0]])[0] if ema else raw
    return drift.Curve.of(t, loss, "simulated")


def rate(n: int, steps: int, offset: float, noise: float, ema: float, every: int,
         seed: int) -> tuple[int, list[int], dict[str, int]]:
    rng = np.random.default_rng(seed)
    t = np.arange(every, steps + 1, every)
    alarms, blocks, sides = 0, [], {"above": 0, "below": 0}
    for _ in range(n):
        base = [curve(rng, t, offset, noise, ema) for _ in range(3)]
        plan = design(base, t, offset, every, drift.ALPHA)
        monitor = Monitor(plan, offset)
        monitor.feed(curve(rng, t, offset, noise, ema))
        if monitor.alarm is not None:
            alarms += 1
            sides[direction(monitor.alarm.gap)] += 1
        blocks.append(plan.noise.block_points)
    return alarms, blocks, sides


def design(base: list[drift.Curve], t: np.ndarray, offset: float, every: int, alpha: float) -> drift.Plan:
    return drift.plan(base, t[:50], 50, drift.Design(max(3, -(-WINDOW // every)), alpha, rate=offset / HORIZON))


def rate_profile(n: int, steps: int, offset: float, noise: float, ema: float, every: int, seed: int,
                 margin: float) -> tuple[int, list[int], dict[str, int], dict[str, int]]:
    """``rate`` against a campaign folder's profile of the 3 baseline seeds, with guard.parity.margin =
    ``margin`` x ``offset`` (T), as the command reads and judges it; also which law the offset's sd had."""
    rng = np.random.default_rng(seed)
    t = np.arange(every, steps + 1, every)
    alarms, blocks, sides, laws = 0, [], {"above": 0, "below": 0}, {"known": 0, "t": 0}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        file = folder / "campaign.yaml"
        file.write_text(yaml.safe_dump({
            "workload": {"kind": "command", "argv": ["true"], "knobs": {"seed": {"default": 0, "means": "seed"}},
                         "tokens_per_step": "64"},
            "guard": {"parity": {"steps": HORIZON, "seeds": 3, "window": WINDOW, "margin": margin * offset}}}))
        campaign = load_campaign(file)
        cfg, seeds = campaign.config.guard, [0, 1, 2]
        for _ in range(n):
            base = [curve(rng, t, offset, noise, ema) for _ in range(3)]
            runs = [_result(campaign.baseline.with_(seed=s), c) for s, c in zip(seeds, base, strict=True)]
            build_profile(campaign.workload, campaign.baseline, runs, seeds, int(t[-1]), cfg).save(folder / PROFILE)
            session = Session(campaign, folder / "run", [], stored_baseline(campaign, folder), 50, drift.ALPHA,
                              drift.PERSIST)
            run = curve(rng, t, offset, noise, ema)
            monitor = session._monitor(Measure.LOSS, Stream(run, drift.Curve.of([], [], ""), 64), drift.ALPHA)
            monitor.feed(run)
            if monitor.alarm is not None:
                alarms += 1
                sides[direction(monitor.alarm.gap)] += 1
            blocks.append(monitor.plan.noise.block_points)
            laws["known" if monitor.plan.noise.dof is None else "t"] += 1
    return alarms, blocks, sides, laws


def _result(recipe, c: drift.Curve) -> RunResult:
    steps = [StepRecord(step=int(s), loss=float(x), tokens=64, step_time_s=0.01) for s, x in zip(c.steps, c.loss,
                                                                                                   strict=True)]
    return RunResult(recipe=dict(recipe), recipe_id=recipe.id, status="ok", steps=steps, warmup_steps=2)


def rate_both(n: int, steps: int, train: tuple, val: tuple, seed: int) -> tuple[int, dict[str, int]]:
    """Runs that alarm on either loss (each at alpha / 2), and on which: 'loss', 'val_loss', 'both'."""
    rng = np.random.default_rng(seed)
    (off_t, noise_t, ema_t, every_t), (off_v, noise_v, ema_v, every_v) = train, val
    t, tv = np.arange(every_t, steps + 1, every_t), np.arange(every_v, steps + 1, every_v)
    alarms, which = 0, {"loss": 0, "val_loss": 0, "both": 0}
    for _ in range(n):
        levels = rng.standard_normal(4)  # 3 baselines and the run: one model level per run, both losses
        runs = [(curve(rng, t, off_t, noise_t, ema_t, u), curve(rng, tv, off_v, noise_v, ema_v, u)) for u in levels]
        base, run = runs[:3], runs[3]
        monitors = Monitors([Monitor(design([b[0] for b in base], t, off_t, every_t, drift.ALPHA / 2), off_t,
                                     Measure.LOSS),
                             Monitor(design([b[1] for b in base], tv, off_v, every_v, drift.ALPHA / 2), off_v,
                                     Measure.VAL_LOSS)])
        for m, c in zip(monitors, run, strict=True):  # each to its end: whether either alarms over the whole run
            m.feed(c)
        hit = [m.measure for m in monitors if m.alarm is not None]
        if hit:
            alarms += 1
            which["both" if len(hit) == 2 else hit[0]] += 1
    return alarms, which


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--settings", type=int, nargs="*", help="which rows of SETTINGS (default: all)")
    ap.add_argument("--seed", type=int, default=2026, help="setting i draws from seed + i")
    ap.add_argument("--both", type=int, nargs="*", help="which rows of BOTH (default: all; none with --settings)")
    ap.add_argument("--margin", type=float, help="against a campaign folder's profile with guard.parity.margin = "
                    "MARGIN x the offset's sd (the training loss; no BOTH rows)")
    args = ap.parse_args()
    if args.margin is not None:
        print("| noise | runs | false alarms (above / below) | rate [95% CI] | block length in points (median) | "
              "the offset's sd: known / t |\n|---|---|---|---|---|---|")
        for i, (name, offset, noise, ema, every) in enumerate(SETTINGS):
            if args.settings and i not in args.settings:
                continue
            k, blocks, sides, laws = rate_profile(args.runs, args.steps, offset, noise, ema, every, args.seed + i,
                                                  args.margin)
            r, lo, hi = proportion_ci(k, args.runs)
            print(f"| {name} | {args.runs} | {k} ({sides['above']} / {sides['below']}) | {100 * r:.1f}% "
                  f"[{100 * lo:.1f}, {100 * hi:.1f}] | {int(np.median(blocks))} | {laws['known']} / {laws['t']} |",
                  flush=True)
        return
    print("| noise | runs | false alarms (above / below) | rate [95% CI] | block length in points (median) |\n"
          "|---|---|---|---|---|")
    for i, (name, offset, noise, ema, every) in enumerate(SETTINGS):
        if args.settings and i not in args.settings:
            continue
        k, blocks, sides = rate(args.runs, args.steps, offset, noise, ema, every, args.seed + i)
        r, lo, hi = proportion_ci(k, args.runs)
        print(f"| {name} | {args.runs} | {k} ({sides['above']} / {sides['below']}) | {100 * r:.1f}% "
              f"[{100 * lo:.1f}, {100 * hi:.1f}] | {int(np.median(blocks))} |", flush=True)

    if args.settings is not None and args.both is None:
        return
    print("\n| both losses, each at alpha / 2 | runs | false alarms (training / validation / both) | rate [95% CI] |\n"
          "|---|---|---|---|")
    for i, (name, row, val) in enumerate(BOTH):
        if args.both and i not in args.both:
            continue
        k, which = rate_both(args.runs, args.steps, SETTINGS[row][1:], val, args.seed + 100 + i)
        r, lo, hi = proportion_ci(k, args.runs)
        print(f"| {name} | {args.runs} | {k} ({which['loss']} / {which['val_loss']} / {which['both']}) | "
              f"{100 * r:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] |", flush=True)


if __name__ == "__main__":
    main()
