"""The speed job with and without pruning, replayed through the real engine on the stored tables.

    python benchmarks/speed_pruning.py benchmarks/table-reference.json benchmarks/table-command-fake.json \
        --seeds 20 --budget 32 --strategies mcts-analyst,tpe,optuna-random [--out benchmarks/results/speed-pruning.json]

Each replay is `bench replay`'s (bench/replay.py: ``TableJob`` through ``run_search``), once with
``search.pruning.pruner=none`` and once with ``median`` at the same seed, so both draw the same
repeats for the same recipes. With pruning, a drawn run's throughput windows go to the pruner (a
table holds whole-run figures, so each window is the run's own rate, its bound two A/A spreads of
the baseline's repeats above), and a stopped run costs only what it ran. For each arm: the trials
and the trials' wall seconds until a recipe within 2% of the table's best had run (and was not
stopped), the share of replays that got there, and how many trials were stopped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from recipetune.bench.replay import Oracle, replay
from recipetune.bench.table import Table


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f}" if xs else "–"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="+", type=Path)
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--strategies", default="mcts-analyst,tpe,optuna-random")
    parser.add_argument("--pruner", default="median")
    parser.add_argument("--within", type=float, default=0.02, help="how close to the table's best counts")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    print("| table | strategy | pruning | reached | trials to reach (median) | wall s to reach (median) | "
          "wall s, all trials (mean) | stopped trials (mean) |")
    print("|---|---|---|---|---|---|---|---|")
    for path in args.tables:
        table = Table.load(path)
        with tempfile.TemporaryDirectory() as scratch:
            oracle = Oracle(table, random.Random(0), Path(scratch))
            target = (1 - args.within) * oracle.best_speedup()
            noise = oracle.noise
        for strategy in args.strategies.split(","):
            for pruner in ("none", args.pruner):
                trials, walls, totals, stopped = [], [], [], []
                for seed in range(args.seeds):
                    t = replay(table, strategy, args.budget, seed, pruner=pruner)
                    n, wall = t.to_reach(target)
                    if n is not None:
                        trials.append(n)
                        walls.append(wall)
                    totals.append(sum(x.cost_s for x in t.trials))
                    stopped.append(sum(x.status == "pruned" for x in t.trials))
                row = {"table": table.name, "strategy": strategy, "pruner": pruner, "target": target,
                       "noise": noise, "reached": len(trials), "seeds": args.seeds, "trials_to_reach": trials,
                       "wall_to_reach": walls, "wall_total": totals, "stopped": stopped}
                rows.append(row)
                print(f"| {table.name} | {strategy} | {pruner} | {len(trials)}/{args.seeds} | {med(trials)} | "
                      f"{med(walls)} | {statistics.fmean(totals):.0f} | {statistics.fmean(stopped):.1f} |",
                      flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
