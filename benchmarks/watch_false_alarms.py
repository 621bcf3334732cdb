"""False alarms of `recipetune watch` over simulated long runs of an equivalent (docs/guard.md, "After approval").

Each simulated run is a loss curve ``2 + 3 / sqrt(step)`` with its seed's offset (sd ``offset``), batch
noise (sd ``noise`` per step), EMA-smoothed or not; it is watched against 3 baseline curves drawn the
same way (another seed each), with the design the command uses (guard/drift.py: plan, Monitor). The
noise settings: the fixture trainer's, and the reference trainer's nano runs as measured by
benchmarks/watch_reference.py (per-step noise 0.18 nats, seed offset about 0.02).

    python benchmarks/watch_false_alarms.py --runs 400
"""

from __future__ import annotations

import argparse

import numpy as np
from scipy.signal import lfilter

from recipetune.core.stats import proportion_ci
from recipetune.guard import drift

SETTINGS = [  # (name, offset sd, per-step noise sd, EMA)
    ("fixture, raw", 0.01, 0.03, 0.0),
    ("fixture, EMA 0.9", 0.01, 0.03, 0.9),
    ("nano as measured, raw", 0.02, 0.18, 0.0),
    ("nano as measured, EMA 0.98", 0.02, 0.18, 0.98),
]


def curve(rng: np.random.Generator, t: np.ndarray, offset: float, noise: float, ema: float) -> drift.Curve:
    raw = 2 + 3 / np.sqrt(t) + rng.normal(0, offset) + rng.normal(0, noise, len(t))
    loss = lfilter([1 - ema], [1, -ema], raw, zi=[ema * raw[0]])[0] if ema else raw
    return drift.Curve.of(t, loss, "simulated")


def rate(n: int, steps: int, offset: float, noise: float, ema: float, seed: int) -> tuple[int, list[int]]:
    rng = np.random.default_rng(seed)
    t = np.arange(1, steps + 1)
    alarms, blocks = 0, []
    for _ in range(n):
        base = [curve(rng, t, offset, noise, ema) for _ in range(3)]
        plan = drift.plan(base, t[:50], 50, None, 10)
        monitor = drift.Monitor(plan, offset)
        monitor.feed(curve(rng, t, offset, noise, ema))
        alarms += monitor.alarm is not None
        blocks.append(plan.noise.block_points)
    return alarms, blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args()
    print("| noise | runs | false alarms | rate [95% CI] | block length (median) |\n|---|---|---|---|---|")
    for i, (name, offset, noise, ema) in enumerate(SETTINGS):
        k, blocks = rate(args.runs, args.steps, offset, noise, ema, 2026 + i)
        r, lo, hi = proportion_ci(k, args.runs)
        print(f"| {name} | {args.runs} | {k} | {100 * r:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}] | "
              f"{int(np.median(blocks))} |", flush=True)


if __name__ == "__main__":
    main()
