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
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.signal import lfilter

from recipetune.core.stats import proportion_ci
from recipetune.guard import drift
from recipetune.guard.monitor import Monitor, direction

SETTINGS = [  # (name, offset sd, per-point noise sd, EMA over the logged points, steps between points)
    ("fixture, raw", 0.01, 0.03, 0.0, 1),
    ("fixture, EMA 0.9", 0.01, 0.03, 0.9, 1),
    ("nano as measured, raw", 0.02, 0.18, 0.0, 1),
    ("nano as measured, EMA 0.98", 0.02, 0.18, 0.98, 1),
    ("nano validation loss as measured (every 20 steps)", 0.017, 0.045, 0.4, 20),
]
WINDOW = 10  # the guard's window in steps: the shortest block (speed/watch.py: max(3, window / interval))
HORIZON = 100  # the guard's horizon: the blocks are tuned for a drift of 1 T per HORIZON steps (T: the offset sd)


def curve(rng: np.random.Generator, t: np.ndarray, offset: float, noise: float, ema: float) -> drift.Curve:
    raw = 2 + 3 / np.sqrt(t) + rng.normal(0, offset) + rng.normal(0, noise, len(t))
    loss = lfilter([1 - ema], [1, -ema], raw, zi=[ema * raw[0]])[0] if ema else raw
    return drift.Curve.of(t, loss, "simulated")


def rate(n: int, steps: int, offset: float, noise: float, ema: float, every: int,
         seed: int) -> tuple[int, list[int], dict[str, int]]:
    rng = np.random.default_rng(seed)
    t = np.arange(every, steps + 1, every)
    alarms, blocks, sides = 0, [], {"above": 0, "below": 0}
    for _ in range(n):
        base = [curve(rng, t, offset, noise, ema) for _ in range(3)]
        plan = drift.plan(base, t[:50], 50, None, max(3, -(-WINDOW // every)), rate=offset / HORIZON)
        monitor = Monitor(plan, offset)
        monitor.feed(curve(rng, t, offset, noise, ema))
        if monitor.alarm is not None:
            alarms += 1
            sides[direction(monitor.alarm.gap)] += 1
        blocks.append(plan.noise.block_points)
    return alarms, blocks, sides


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--settings", type=int, nargs="*", help="which rows of SETTINGS (default: all)")
    ap.add_argument("--seed", type=int, default=2026, help="setting i draws from seed + i")
    args = ap.parse_args()
    print("| noise | runs | false alarms (above / below) | rate [95% CI] | block length in points (median) |\n"
          "|---|---|---|---|---|")
    for i, (name, offset, noise, ema, every) in enumerate(SETTINGS):
        if args.settings and i not in args.settings:
            continue
        k, blocks, sides = rate(args.runs, args.steps, offset, noise, ema, every, args.seed + i)
        r, lo, hi = proportion_ci(k, args.runs)
        print(f"| {name} | {args.runs} | {k} ({sides['above']} / {sides['below']}) | {100 * r:.1f}% "
              f"[{100 * lo:.1f}, {100 * hi:.1f}] | {int(np.median(blocks))} |", flush=True)


if __name__ == "__main__":
    main()
