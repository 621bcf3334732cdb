"""The tuner's own cost: everything in a campaign that is not training.

Runs a (small) `recipetune tune` campaign and splits its wall time into
  - training: the trainer's step times, warm-up steps included (what a user pays for anyway);
  - trainer own cost: each run's subprocess wall time minus its step times (interpreter start,
    imports, data loading, model build, final validation, exit);
  - driver own cost: the campaign's wall time minus its runs' wall times (the driver's imports,
    proposals, the guard's statistics, the study's bookkeeping, reports).
It also times the fixed pieces of a fresh trainer process on this machine (interpreter, `import
torch`, the `torch._dynamo` import that the first optimizer step triggers) and a bare
`recipetune run --steps 1`.

    python benchmarks/overhead.py examples/tiny-campaign.yaml --out /tmp/overhead search.budget.trials=4

Load from other processes inflates every figure; run it on a quiet machine and compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(argv: list[str], repeats: int = 3) -> float:
    """Median wall seconds of a command."""
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def fixed_costs(campaign: Path, overrides: list[str]) -> dict[str, float]:
    py = sys.executable
    out = {
        "python_s": timed([py, "-c", "pass"]),
        "import_torch_s": timed([py, "-c", "import torch"]),
        "import_torch_and_dynamo_s": timed([py, "-c", "import torch, torch._dynamo"]),
        "import_trainer_s": timed([py, "-c", "import recipetune.trainer.__main__"]),
    }
    scratch = Path(f"/tmp/recipetune-overhead-run-{time.time_ns()}")
    exe = str(Path(py).with_name("recipetune"))
    run = [exe, "run", str(campaign), *overrides, "--steps", "1", "--out", str(scratch)]
    out["recipetune_run_1_step_s"] = timed(run, 1)
    shutil.rmtree(scratch, ignore_errors=True)
    return out


def split(folder: Path, campaign_wall_s: float) -> dict[str, float]:
    """The campaign's wall time split into training, trainer own cost and driver own cost."""
    runs = train = evals = 0.0
    n = 0
    for path in folder.rglob("result.json"):
        result = json.loads(path.read_text())
        runs += result["wall_s"]
        train += sum(s["step_time_s"] for s in result["steps"])
        metrics = path.with_name("metrics.jsonl")
        if metrics.exists():  # the validations the recipe asks for (eval_batches), timed by the trainer
            records = (json.loads(line) for line in metrics.read_text().splitlines() if line.strip())
            evals += sum(r.get("val_time_s", 0.0) for r in records if r.get("kind") == "val")
        n += 1
    own_trainer, own_driver = runs - train, campaign_wall_s - runs
    return {"campaign_wall_s": campaign_wall_s, "runs": n, "training_s": train, "trainer_own_s": own_trainer,
            "driver_own_s": own_driver, "own_share": (own_trainer + own_driver) / campaign_wall_s,
            "trainer_own_per_run_s": own_trainer / max(n, 1),
            # validation is model work the recipe asks for, not start-up or bookkeeping: shown apart
            "evaluation_s": evals,
            "own_share_evaluation_as_work": (own_trainer - evals + own_driver) / campaign_wall_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("campaign", type=Path)
    p.add_argument("overrides", nargs="*", help="key=value, as for recipetune tune")
    p.add_argument("--out", type=Path, required=True, help="campaign folder (must not exist)")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args()
    exe = str(Path(sys.executable).with_name("recipetune"))
    conditions = {"started_utc": time.strftime("%H:%M:%S", time.gmtime()), "load_avg_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    subprocess.run([exe, "tune", str(args.campaign), *args.overrides, "--out", str(args.out)], check=True,
                   stdout=subprocess.DEVNULL)
    figures = split(args.out, time.perf_counter() - t0)
    conditions.update(ended_utc=time.strftime("%H:%M:%S", time.gmtime()), load_avg_end=os.getloadavg()[0])
    baseline_overrides = [o for o in args.overrides if "." not in o.split("=", 1)[0]]  # knobs, not settings
    figures.update(fixed_costs(args.campaign, baseline_overrides))
    figures.update(conditions)
    for k, v in figures.items():
        print(f"{k:28s} {v:10.3f}" if isinstance(v, float) else f"{k:28s} {v:>10}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
