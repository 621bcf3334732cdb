"""The set-aside rule (engine/effects.py), measured: docs/benchmarks.md, "Settings set aside as measured far slower".

    python benchmarks/set_aside.py campaign FOLDER      a tune campaign's search compute, the share of it on
                                                        trials measured below 0.5x, and what the rule says of
                                                        each trial given the trials before it
    python benchmarks/set_aside.py planted [--seeds N] [--tables ...] [--strategies ...]
                                                        replays on the reference table's space with a planted
                                                        far-slow value and a planted interaction, the rule
                                                        off (set_aside 0) and on (0.5)
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import optuna

from recipetune.bench.replay import replay
from recipetune.bench.table import Table
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.engine.effects import Effects
from recipetune.engine.record import Evidence
from recipetune.engine.tree import Tree

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Table.load(ROOT / "benchmarks" / "results" / "table-reference.json")


def campaign(folder: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder}/study.db")
    study = optuna.load_study(study_name=optuna.get_all_study_summaries(storage)[0].study_name, storage=storage)
    config = json.loads((folder / "campaign.json").read_text())
    knobs = config["search"]["knobs"]
    noise = json.loads((folder / "baseline_profile.json").read_text())["throughput_noise"]
    trials = [t for t in study.trials if t.user_attrs.get("ran") and t.datetime_complete is not None]
    base = Recipe({**trials[0].user_attrs["recipe"], **{k: config["baseline"][k] for k in knobs
                                                        if k in config["baseline"]}})
    tree, space = Tree(base, None, score=1.0), SearchSpace({k: tuple(v) for k, v in knobs.items()})
    total = slow_s = stopped_s = 0.0
    slow = stopped = 0
    for t in trials:
        a, recipe = t.user_attrs, Recipe(t.user_attrs["recipe"])
        seconds = (t.datetime_complete - t.datetime_start).total_seconds()
        ratio = a.get("evidence_ratio", a.get("speedup"))
        aside = Effects(tree, space, noise, 0.5).judge(recipe)
        total += seconds
        below = (ratio is not None and ratio < 0.5) or a.get("run_status") in ("timeout", "oom")
        slow, slow_s = slow + below, slow_s + below * seconds
        cut = a.get("status") == "pruned"  # stopped as it ran (the rule's Effects.stop, or a pruner)
        stopped, stopped_s = stopped + cut, stopped_s + cut * seconds
        shown = "-" if ratio is None else f"{ratio:.3f}x"
        print(f"trial {t.number:2d} {shown:>8} {seconds:6.1f} s  {recipe.describe_diff(base)}"
              + (f"  [stopped as it ran: {a.get('cause')}]" if cut else "")
              + (f"  [the rule, before it ran: {aside.line()}]" if aside else ""))
        if recipe not in tree:
            tree.add(recipe, tree.root, "passed", 0.5, score=ratio, trial=t.number,
                     evidence=Evidence(ratio) if ratio else None)
    print(f"search compute {total:.0f} s over {len(trials)} trials; measured below 0.5x: {slow} trials, "
          f"{slow_s:.0f} s ({100 * slow_s / max(total, 1e-9):.1f}%); stopped as they ran: {stopped} trials, "
          f"{stopped_s:.0f} s")


def common(v: dict) -> float:
    return ({1: 1.0, 4: 1.25, 16: 1.4}[v["micro_batch_size"]] * (1.05 if v["optimizer_impl"] == "foreach" else 1.0)
            * (0.9 if v["activation_checkpointing"] == "selective" else 1.0)
            * (0.97 if v["dataloader_workers"] == 1 else 1.0))


def far_slow(v: dict) -> float:  # math attention 25x slower everywhere (bf16 autocast on a CPU, as the issue saw it)
    return common(v) * (0.04 if v["attention"] == "math" else 1.0)


def interaction(v: dict) -> float:  # math attention 0.3x without activation checkpointing, 1.6x with it
    return common(v) * ((1.6 if v["activation_checkpointing"] == "selective" else 0.3)
                        if v["attention"] == "math" else 1.0)


TABLES = {"far-slow": far_slow, "interaction": interaction}
STRATEGIES = ("mcts-analyst", "tpe", "optuna-random", "grid")


def planted(seeds: int, budget: int, tables: list[str], strategies: list[str]) -> None:
    print("| table | strategy | rule | trials below 0.5x (median [min-max]) | their share of the search's "
          "compute (median) | trials to within 2% (median) |")
    print("|---|---|---|---|---|---|")
    for name in tables:
        table = REFERENCE.planted(TABLES[name])
        best = table.best().tokens_per_s() / table.baseline_entry().tokens_per_s()
        for strategy in strategies:
            for rule in (0.0, 0.5):
                slow, share, reach = [], [], []
                for seed in range(seeds):
                    trials = replay(table, strategy, budget, seed, set_aside=rule)
                    slow.append(sum(t.true < 0.5 for t in trials.trials))
                    spent = sum(t.cost_s for t in trials.trials)
                    share.append(sum(t.cost_s for t in trials.trials if t.true < 0.5) / max(spent, 1e-9))
                    reach.append(trials.to_reach(0.98 * best)[0])
                reached = sorted(r for r in reach if r is not None)
                shown = f"{statistics.median(reached):g} ({len(reached)}/{seeds} reached)" if reached else "never"
                print(f"| {name} | {strategy} | {'on' if rule else 'off'} | {statistics.median(slow):g} "
                      f"[{min(slow)}-{max(slow)}] | {100 * statistics.median(share):.0f}% | {shown} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("campaign")
    c.add_argument("folder", type=Path)
    p = sub.add_parser("planted")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--budget", type=int, default=20)
    p.add_argument("--tables", nargs="+", choices=list(TABLES), default=list(TABLES))
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES))
    args = parser.parse_args()
    if args.what == "campaign":
        campaign(args.folder)
    else:
        planted(args.seeds, args.budget, args.tables, args.strategies)


if __name__ == "__main__":
    main()
