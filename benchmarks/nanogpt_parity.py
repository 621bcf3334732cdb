"""End-of-run loss of the nanoGPT-style fixture: equivalent splits against poisoned ones.

Runs tests/fixtures/nanogpt_trainer.py (one thread) for each recipe and prints the training loss
averaged over the last half of the run with its standard error from the run itself (autocorrelation
included: core.stats.mean_with_error), its step-to-step noise, the median step time, and the
validation loss printed at the end. The figures in docs/guard.md ("Independent runs") come from it:

    OMP_NUM_THREADS=1 python benchmarks/nanogpt_parity.py --steps 250 400
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
RECIPES = [(2, 16, "none"), (4, 8, "none"), (8, 4, "none"), (32, 1, "none"),
           (32, 1, "drop"), (32, 1, "short"), (32, 1, "stale")]


def run(batch: int, accum: int, poison: str, steps: int, out: Path) -> str:
    argv = [sys.executable, str(TRAINER), f"--batch_size={batch}", f"--gradient_accumulation_steps={accum}",
            f"--poison={poison}", f"--max_iters={steps}", f"--eval_interval={steps}", "--eval_iters=20",
            f"--out_dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, nargs="+", default=[400])
    args = p.parse_args()
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
