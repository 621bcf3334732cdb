"""End-of-run loss of the nanoGPT-style fixture: equivalent splits against poisoned ones.

Runs tests/fixtures/nanogpt_trainer.py (one thread) for each recipe and prints the training loss
averaged over the last half of the run with its standard error from the run itself (autocorrelation
included: core.stats.mean_with_error), its step-to-step noise, the median step time, and the
validation loss printed at the end. The figures in docs/guard.md ("Independent runs") come from it:

    OMP_NUM_THREADS=1 python benchmarks/nanogpt_parity.py --steps 250 400

``--worlds N`` instead replays the first look of a verdict on the trainer as nanoGPT ships it (no seed
flag) in N worlds: world s is the whole experiment under the hidden seed s (baseline 2 x 16 and each
equivalent split start from the same initialisation, on their own batch streams). For each it prints
the first look's parity outcome at its level (``parity.first_look`` x alpha) and the trend test's,
and counts how often an equivalent's gap reads "grows" (docs/guard.md, "Float noise is not a seed"):

    python benchmarks/nanogpt_parity.py --worlds 30 --steps 100
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from recipetune.core.stats import mean_with_error, step_noise

TRAINER = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nanogpt_trainer.py"
SEEDED = TRAINER.parent / "nanogpt-seeded-campaign.yaml"  # the same trainer, its hidden seed flag exposed
RECIPES = [(2, 16, "none"), (4, 8, "none"), (8, 4, "none"), (32, 1, "none"),
           (32, 1, "drop"), (32, 1, "short"), (32, 1, "stale")]


def run(batch: int, accum: int, poison: str, steps: int, out: Path) -> str:
    argv = [sys.executable, str(TRAINER), f"--batch_size={batch}", f"--gradient_accumulation_steps={accum}",
            f"--poison={poison}", f"--max_iters={steps}", f"--eval_interval={steps}", "--eval_iters=20",
            f"--out_dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def worlds(n: int, steps: int) -> None:
    """The first look of a no-seed verdict in ``n`` worlds: parity and trend outcomes of each equivalent split."""
    from recipetune.config import load_campaign
    from recipetune.guard.baseline import build_profile
    from recipetune.guard.parity import compare

    c = load_campaign(SEEDED)
    cfg, wl = c.config.guard, c.workload
    splits = [(32, 1), (16, 2), (8, 4)]
    grows = {s: 0 for s in splits}
    print("| world | split | outcome | difference | detectable | T | trend slope per 1,000 steps [bounds] | trend |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for world in range(n):
            seed = 1337 + world
            base = wl.run(c.baseline.with_(seed=seed), steps, Path(tmp) / f"b{world}")
            profile = build_profile(wl, c.baseline, [base], [None], steps, cfg)  # a no-seed trainer's profile
            for b, a in splits:
                recipe = c.baseline.with_(seed=seed, batch_size=b, grad_accum=a)
                cand = wl.run(recipe, steps, Path(tmp) / f"c{world}-{b}")
                ev = compare(profile, [cand], cfg.parity, level=cfg.parity.alpha * cfg.parity.first_look)
                t = ev.trend
                grows[b, a] += t is not None and t.outcome == "grows"
                trend = f"{t.slope:+.2f} [{t.low:+.2f}, {t.high:+.2f}]" if t else "-"
                print(f"| {world} | {b} x {a} | {ev.outcome} | {ev.mean_diff:+.4f} | {ev.detectable:.4f} | "
                      f"{ev.tolerance:.4f} | {trend} | {t.outcome if t else '-'} |", flush=True)
    print("\n" + ", ".join(f"{b} x {a}: the gap 'grows' in {k} of {n}" for (b, a), k in grows.items()))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, nargs="+", default=[400])
    p.add_argument("--worlds", type=int, default=0, help="replay a no-seed verdict's first look in N worlds")
    args = p.parse_args()
    if args.worlds:
        worlds(args.worlds, args.steps[0])
        return
    print("| steps | recipe | tail mean | se | tau | step noise | median ms | val loss |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for steps in args.steps:
            for batch, accum, poison in RECIPES:
                out = run(batch, accum, poison, steps, Path(tmp))
                losses = [float(x) for x in re.findall(r"^iter \d+: loss ([\d.e+-]+|nan)", out, re.M)]
                times = [float(x) for x in re.findall(r"time ([\d.]+)ms", out)]
                val = re.findall(r"val loss ([\d.e+-]+|nan)", out)[-1]
                tail = losses[steps // 2:]
                e = mean_with_error(tail)
                name = f"{batch} x {accum}" + (f" {poison}" if poison != "none" else "")
                print(f"| {steps} | {name} | {e.mean:.4f} | {e.se:.4f} | {e.tau:.1f} | {step_noise(tail):.3f} | "
                      f"{statistics.median(times):.1f} | {float(val):.4f} |", flush=True)


if __name__ == "__main__":
    main()
