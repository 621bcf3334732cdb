"""The speed job with and without pruning, replayed through the real engine on the stored tables.

    python benchmarks/speed_pruning.py \
        benchmarks/results/table-reference.json benchmarks/results/table-command-fake.json \
        --seeds 20 --budget 32 --strategies mcts-analyst,tpe,optuna-random [--out benchmarks/results/speed-pruning.json]

Each replay is `bench replay`'s (bench/replay.py: ``TableJob`` through ``run_search``), once with
``search.pruning.pruner=none`` and once with ``median`` at the same seed, so both draw the same
repeats for the same recipes. With pruning, a drawn run's throughput windows go to the pruner (a
table holds whole-run figures, so each window is the run's own rate, its bound two A/A spreads of
the baseline's repeats above), and a stopped run costs only what it ran. For each arm: the trials
and the trials' wall seconds until a recipe within 2% of the table's best had run (and was not
stopped), the share of replays that got there, and how many trials were stopped.

    python benchmarks/speed_pruning.py --live examples/tiny-campaign.yaml --budget 12 --out runs/speed-pruning

runs one live `recipetune tune` campaign without and one with pruning (same file, same search seed)
and prints the same figures from their studies: a trial's time is its study trial's duration; the
best is the recipe with the highest mean screening over the two campaigns, and a campaign reaches it
when it runs (and does not stop) a recipe within 2% of that.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from recipetune.bench.replay import Oracle, replay
from recipetune.bench.table import Table


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f}" if xs else "–"


def live(file: Path, budget: int, pruner: str, within: float, out: Path, seed: int) -> None:
    """Two real campaigns of ``file``, without and with ``pruner``; their trials from the studies."""
    import optuna

    from recipetune.engine.store import CampaignStore

    runs = {}
    for arm in ("none", pruner):
        folder = out / arm
        timed = folder / "bench-wall.json"  # the campaign's wall time, kept for a rerun over finished folders
        if not (folder / "verdict.json").exists():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "recipetune", "tune", str(file), "--budget", str(budget),
                            "--pruner", arm, f"search.seed={seed}", "--out", str(folder),
                            *(["--resume"] if folder.exists() else [])], check=False)
            timed.write_text(json.dumps({"wall_s": time.perf_counter() - t0}))
        wall = json.loads(timed.read_text())["wall_s"] if timed.exists() else float("nan")
        store = CampaignStore(folder)
        trials = [t for t in store.study.get_trials(deepcopy=False) if t.user_attrs.get("status") != "reference"
                  and t.user_attrs.get("ran")]
        runs[arm] = (sorted(trials, key=lambda t: t.number), wall,
                     json.loads((folder / "verdict.json").read_text()).get("decision", "?")
                     if (folder / "verdict.json").exists() else "none")
    # A recipe's figure is the mean of its screenings over both campaigns: one screening is a single
    # noisy run (the same recipe read 2.28x in one campaign and 2.05x in the other), and the question
    # is which recipe a campaign found, not how lucky its one draw of it was.
    screened: dict[str, list[float]] = {}
    for trials, _, _ in runs.values():
        for t in trials:
            if t.user_attrs.get("status") == "passed" and t.user_attrs.get("speedup"):
                screened.setdefault(t.user_attrs["recipe_id"], []).append(float(t.user_attrs["speedup"]))
    figure = {rid: statistics.fmean(xs) for rid, xs in screened.items()}
    best = max(figure.values())
    good = {rid for rid, x in figure.items() if x >= (1 - within) * best}
    print(f"best recipe of the two campaigns: {', '.join(sorted(good))} (mean screening {best:.3f}x); within "
          f"{100 * within:.0f}%: >= {(1 - within) * best:.3f}x")
    print("| pruning | trials run | stopped | trials to reach | trial s to reach | trial s, all | "
          "campaign wall s | decision |")
    print("|---|---|---|---|---|---|---|---|")
    for arm, (trials, wall, decision) in runs.items():
        spent, reach = 0.0, None
        for i, t in enumerate(trials, 1):
            spent += t.duration.total_seconds() if t.duration else 0.0
            if reach is None and t.user_attrs.get("status") == "passed" and t.user_attrs.get("recipe_id") in good:
                reach = (i, spent)
        stopped = sum(t.state == optuna.trial.TrialState.PRUNED for t in trials)
        total = sum(t.duration.total_seconds() for t in trials if t.duration)
        print(f"| {arm} | {len(trials)} | {stopped} | {reach[0] if reach else '–'} | "
              f"{f'{reach[1]:.0f}' if reach else '–'} | {total:.0f} | {wall:.0f} | {decision} |")
    for arm, (trials, _, _) in runs.items():
        print(f"== {arm}")
        for t in trials:
            iv = t.intermediate_values
            print(t.number, t.state.name, t.user_attrs.get("recipe_id"), t.user_attrs.get("speedup"),
                  min(iv.values()) if iv and t.state == optuna.trial.TrialState.PRUNED else None,
                  f"{t.duration.total_seconds():.1f}" if t.duration else None, t.user_attrs.get("edits"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="*", type=Path)
    parser.add_argument("--live", type=Path, default=None, help="a campaign file: two live campaigns instead")
    parser.add_argument("--seed", type=int, default=0, help="--live: the search seed of both")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--strategies", default="mcts-analyst,tpe,optuna-random")
    parser.add_argument("--pruner", default="median")
    parser.add_argument("--within", type=float, default=0.02, help="how close to the table's best counts")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if args.live is not None:
        live(args.live, args.budget, args.pruner, args.within, args.out or Path("runs/speed-pruning"), args.seed)
        return
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
