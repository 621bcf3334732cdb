"""The small fine-tuning benchmark's baselines: validation and test metric over seeds, with wall time.

    python benchmarks/ft_baselines.py examples/ft-arith.yaml examples/ft-module.yaml examples/ft-funcname.yaml \
        --seeds 0,1,2 --out runs/ft-baselines

Each experiment file is run through ``final_evaluation`` (the one entry point that opens the test
split): one training per seed, each scored on validation and test. Prints one line per task and
writes ``summary.json`` in ``--out``. Extra ``key=value`` arguments (after ``--set``) override every file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from recipetune.finetune.experiment import load_experiment
from recipetune.finetune.final import final_evaluation


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiments", type=Path, nargs="+")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--out", type=Path, default=Path("runs/ft-baselines"))
    parser.add_argument("--set", nargs="*", default=[], help="key=value overrides for every file")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    summary = []
    for path in args.experiments:
        exp = load_experiment(path, args.set)
        t0 = time.perf_counter()
        result = final_evaluation(exp, seeds, args.out / path.stem, log=lambda text: print("  " + text, flush=True))
        wall = time.perf_counter() - t0
        train_s = [json.loads((Path(r) / "report.json").read_text())["timings_s"]["total"] for r in result.runs]
        extra = {}
        for name in result.test_metrics[0]:
            vals = [m[name] for m in result.test_metrics]
            extra[name] = (statistics.fmean(vals), statistics.stdev(vals) if len(vals) > 1 else 0.0)
        row = {
            "task": exp.spec.task.name, "route": exp.spec.model.kind, "metric": result.metric, "seeds": seeds,
            "validation_mean": statistics.fmean(result.validation_values),
            "validation_std": statistics.stdev(result.validation_values) if len(seeds) > 1 else 0.0,
            "test_mean": result.mean, "test_std": result.std, "test_metrics": extra,
            "validation_values": result.validation_values, "test_values": result.values,
            "wall_s": wall, "experiment_s": train_s, "file": str(path), "overrides": args.set,
        }
        summary.append(row)
        print(f"{row['task']:>14} {row['route']:>9} {row['metric']:>11}: validation {row['validation_mean']:.3f} "
              f"± {row['validation_std']:.3f}, test {row['test_mean']:.3f} ± {row['test_std']:.3f} "
              f"({', '.join(f'{k} {m:.3f} ± {s:.3f}' for k, (m, s) in extra.items())}); wall {wall:.0f}s "
              f"(per experiment {', '.join(f'{s:.0f}' for s in train_s)}s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
