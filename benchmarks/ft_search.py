"""The quality search's ablation (TREX): MCTS vs greedy best-first vs sequential vs random proposals.

    python benchmarks/ft_search.py examples/ft-arith.yaml examples/ft-module.yaml examples/ft-funcname.yaml \
        --budget 6 --seeds 0,1,2 --out runs/ft-search [--final]

Each arm is a real `recipetune finetune` campaign (the same engine, job and Researcher) at an equal
budget of experiments, over several search seeds:

    mcts        selection uct, analyst Researcher with its seeded explore rule (search.explore: random)
    greedy      selection greedy (best-first), analyst, seeded
    sequential  selection sequential (each experiment a child of the last), analyst, seeded
    random      selection uct, random proposals
    ARM-model   mcts, greedy or sequential with search.explore: model (the analyst's explore rule from
                TPE); mcts-model is what a finetune campaign does by default
    ARM-pruned  the arm with the median pruner over 3 validation checkpoints per experiment
    ARM-top-pruned  mcts, mcts-model or greedy with the percentile pruner keeping the top quarter

Experiments are deterministic at a fixed seed on one machine (same data order, same initialisation,
one thread; another machine's CPU may round otherwise: keep a cache on the machine that filled it),
so an experiment one arm ran is not run again for another: its folder is reused from a cache
(keyed by the experiment file, its overrides and the child's recipe and chain), and the time a
campaign would have taken counts the cached experiment's own time. A cached experiment ran to its
end with its validation checkpoints; a pruned arm replays them to its own pruner (``MemoExecutor``)
and counts the time to where it stopped. ``--final`` also runs the decision of the first seed's
MCTS campaign: its best node and the baseline on the test split over the file's ``search.seeds``;
``--decide`` runs that decision for every campaign of the files, arms and seeds given that has run
to its budget (arms that found the same best share its test runs). Writes ``summary-*.json`` and
prints one table per task; ``--table`` prints the markdown table of docs/finetune.md from the
campaign folders under ``--out`` (and ``--json FILE`` keeps its figures, trajectories included).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recipetune.core.process import STOP_FILE
from recipetune.engine.job import Finished, Outcome, Reporter, Row, Services
from recipetune.engine.loop import run_search
from recipetune.engine.store import CampaignStore, TrialRecord
from recipetune.execute.executor import LocalExecutor
from recipetune.finetune import job as ft
from recipetune.finetune import plan as ftp

# The plain arms ask for the analyst's seeded undirected rule (search.explore: random), as they did
# before the quality job's default became the model: the arms keep their meaning and their results.
ANALYST = ["search.proposer=analyst", "search.explore=random"]
ARMS = {
    "mcts": ["search.selection=uct", *ANALYST],
    "greedy": ["search.selection=greedy", *ANALYST],
    "sequential": ["search.selection=sequential", *ANALYST],
    "random": ["search.selection=uct", "search.proposer=random"],
    "mcts-max": ["search.selection=uct", *ANALYST, "search.backup=max"],
    # a third of the default exploration: between mcts-max and greedy (c = 0 is best-first on the best reward)
    "mcts-max-c0.25": ["search.selection=uct", *ANALYST, "search.backup=max", "search.exploration=0.25"],
}
# the analyst's undirected rule from TPE over the tree (search.explore: model, the default of a
# finetune campaign) instead of a seeded choice
ARMS |= {f"{arm}-model": [*(o for o in ARMS[arm] if o != "search.explore=random"), "search.explore=model"]
         for arm in ("mcts", "greedy", "sequential")}
PRUNED = ["search.pruning.pruner=median", "search.pruning.checkpoints=3"]
# Optuna's percentile pruner keeping the top quarter: a child runs on while it may reach the 75th
# percentile of the finished experiments at its checkpoint
TOP = ["search.pruning.pruner=percentile", "search.pruning.percentile=25", "search.pruning.checkpoints=3"]
ARMS |= {f"{arm}-top-pruned": [*ARMS[arm], *TOP] for arm in ("mcts", "mcts-model", "greedy")}
ARMS |= {f"{arm}-pruned": [*ARMS[arm], *PRUNED] for arm in list(ARMS) if not arm.endswith("-top-pruned")}


class MemoExecutor(LocalExecutor):
    """Runs a child experiment once; the same experiment again is its cached folder.

    A campaign with pruning replays a cached experiment's checkpoints to its pruner one at a time,
    as the child would have written them, and stops where the pruner says: it counts the time the
    child had run when it reached that checkpoint (``progress.jsonl``: ``time_s``). So a cached run
    must have reported its checkpoints; an experiment not yet cached so is run to its end with them
    (the training is the same with or without; tests/test_pruning.py), and a campaign without
    pruning counts that run's time less what its reports cost (``eval_s``)."""

    def __init__(self, cache: Path, settle_s: float = 2.0):
        self.cache, self.hits, self.misses, self.settle_s = cache, 0, 0, settle_s
        self.seconds = 0.0  # what the experiments took (cached ones: their first run's time)

    def call(self, fn, workload, *args, **kwargs) -> Future:  # type: ignore[no-untyped-def,override]
        if fn is not ft.run_child:
            return super().call(fn, workload, *args, **kwargs)
        file, overrides, child, out_dir, timeout_s, checkpoints = args[:6]
        examples = args[6] if len(args) > 6 else 64
        kept = [o for o in overrides if not o.startswith("search.")]
        key = hashlib.sha256(json.dumps([file, kept, child], sort_keys=True).encode()).hexdigest()[:16]
        cached, out = self.cache / key, Path(out_dir)
        lines = ft.progress_lines(cached) if (cached / "progress.jsonl").exists() else []
        if not (cached / "report.json").exists() or (checkpoints and len(lines) != checkpoints):
            self.misses += 1
            t0 = time.perf_counter()
            # to its end, reporting the checkpoints a pruned campaign replays (its own stop file unused)
            result = fn(file, overrides, child, str(cached), timeout_s, checkpoints or 3, examples)
            (cached / "wall_s.txt").write_text(f"{time.perf_counter() - t0:.2f}\n")
            if isinstance(result, ft.Failed):
                shutil.copytree(cached, out, dirs_exist_ok=True)
                shutil.rmtree(cached)  # (a failure is not kept: it may be the machine's)
                self.seconds += time.perf_counter() - t0
                return _done(result)
            lines = ft.progress_lines(cached)
        else:
            self.hits += 1
        wall = float((cached / "wall_s.txt").read_text())
        report = ft.ExperimentReport.model_validate_json((cached / "report.json").read_text())
        if not checkpoints:  # a campaign without pruning: the run without its reports
            shutil.copytree(cached, out, dirs_exist_ok=True)
            (out / "progress.jsonl").unlink(missing_ok=True)
            wall -= sum(float(x.get("eval_s", 0.0)) for x in lines)
            (out / "wall_s.txt").write_text(f"{wall:.2f}\n")
            self.seconds += wall
            return _done(report.model_copy(update={"run_dir": str(out)}))
        return _done(self.replay(cached, out, lines, wall, report))

    def replay(self, cached: Path, out: Path, lines: list[dict], wall: float,
               report: ft.ExperimentReport) -> ft.ExperimentReport | ft.Pruned:
        """The child as the campaign's watcher (engine/job.py: watch) sees it: each checkpoint in turn,
        and time for the pruner to answer before the next."""
        out.mkdir(parents=True, exist_ok=True)
        stop = out / STOP_FILE
        stop.unlink(missing_ok=True)
        progress = out / "progress.jsonl"
        progress.unlink(missing_ok=True)
        for line in lines:
            with progress.open("a") as f:
                f.write(json.dumps(line) + "\n")
            deadline = time.perf_counter() + self.settle_s
            while time.perf_counter() < deadline and not stop.exists():
                time.sleep(0.05)
            if stop.exists():
                at = json.loads(stop.read_text())
                spent = stopped_s(float(line.get("time_s", wall)), wall, report.timings_s.get("total", wall))
                (out / "wall_s.txt").write_text(f"{spent:.2f}\n")
                self.seconds += spent
                return ft.Pruned(at["checkpoint"], at["of"], at["value"], at["examples"])
        for name in ("report.json", "train_log.jsonl", "predictions.jsonl", "recipe.json", "data_version.json"):
            if (cached / name).exists():
                shutil.copy2(cached / name, out / name)
        (out / "wall_s.txt").write_text(f"{wall:.2f}\n")
        self.seconds += wall
        return report.model_copy(update={"run_dir": str(out)})


def stopped_s(at_s: float, wall_s: float, own_s: float) -> float:
    """What a child stopped at a checkpoint counts: its time to the checkpoint (``at_s``, its own
    clock) and its start (the process, the imports: its wall time less its own time ``own_s``)."""
    return at_s + max(0.0, wall_s - own_s)


def _done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


class Quiet(Reporter):
    def __init__(self, label: str):
        self.label = label

    def phase(self, text: str) -> None:
        print(f"  [{self.label}] {text}", flush=True)

    def row(self, row: Row) -> None:
        if row.status not in ("running",):
            print(f"  [{self.label}] {row.number} {row.change}: {row.status} {row.score} {row.cause[:80]}", flush=True)


class SearchOnly(ft.QualityJob):
    """The ablation compares what each search found on validation; the test split is for --final."""

    def decide(self, finished: Finished) -> Outcome:
        return Outcome("(search only)", [], finished.tree, runs=finished.runs)


def experiments(folder: Path) -> list[TrialRecord]:
    """The campaign's experiments that ran, in order (not one a stop interrupted)."""
    return [rec for rec in sorted(CampaignStore(folder).records(), key=lambda r: r.number)
            if rec.attrs.get("ran") and rec.attrs.get("status") != "interrupted"]


def experiment_s(rec: TrialRecord) -> float:
    """An experiment's own time (its ``wall_s.txt``: a cached experiment counts what it took when it
    ran, a stopped one what it ran)."""
    wall = Path(rec.attrs["run_dir"]) / "wall_s.txt" if rec.attrs.get("run_dir") else None
    return float(wall.read_text()) if wall is not None and wall.exists() else rec.attrs.get("time_s") or 0.0


def trajectory(ran: list[TrialRecord], baseline: float) -> tuple[list[float], list[float], int]:
    """Best validation metric after each experiment of ``ran`` (the baseline before any), the
    experiments' own time so far after each, and how many were stopped by the pruner."""
    best, out, spent, seconds, pruned = baseline, [], [], 0.0, 0
    for rec in ran:
        value = rec.attrs.get("value") if rec.attrs.get("status") == "passed" else None
        best = max(best, value) if value is not None else best
        pruned += rec.attrs.get("status") == "pruned"
        out.append(best)
        seconds += experiment_s(rec)
        spent.append(seconds)
    return out, spent, pruned


def first_checkpoint_s(run_dir: Path) -> float | None:
    """When an experiment reached its first checkpoint, counted as a stop there counts it
    (``stopped_s``, as ``MemoExecutor.replay`` counts it); None without checkpoints."""
    lines = ft.progress_lines(run_dir)
    wall = run_dir / "wall_s.txt"
    if not lines or not wall.exists():
        return None
    if (run_dir / "report.json").exists():  # ran to its end: its own time is its report's
        own = ft.ExperimentReport.model_validate_json((run_dir / "report.json").read_text()).timings_s["total"]
    else:  # stopped at its last line
        own = float(lines[-1]["time_s"])
    return stopped_s(float(lines[0]["time_s"]), float(wall.read_text()), own)


def least_compute_s(ran: list[TrialRecord]) -> float | None:
    """The compute a pruner that knew every experiment's end would have spent to reach the best,
    the last of ``ran``, in the same campaign: the best and its ancestors run to their end (a
    stopped node is never expanded), every other experiment stops at its first checkpoint. Not the
    baseline's time. The floor no rule reading these checkpoints can go under; None when an
    experiment reported none."""
    if not ran:
        return None
    path, parent = set(), {r.attrs.get("recipe_id"): r.attrs.get("parent") for r in ran}
    node = ran[-1].attrs.get("recipe_id")
    while node in parent:
        path.add(node)
        node = parent[node]
    spent = 0.0
    for rec in ran:
        if rec.attrs.get("recipe_id") in path:
            spent += experiment_s(rec)
        elif (first := first_checkpoint_s(Path(rec.attrs["run_dir"]))) is None:
            return None
        else:
            spent += first
    return spent


@dataclass
class Finish:
    """One campaign that ran to its budget, as the table reads it."""

    best: float
    reach: int  # experiments until the best was found; 0 when nothing beat the baseline
    to_reach_s: float
    total_s: float
    stopped: int
    decision: str
    test_gain: float | None  # the decision's gain on the test split (None: not decided)
    baseline: float = 0.0
    trajectory: list[float] = field(default_factory=list)  # the best so far after each experiment
    spent_s: list[float] = field(default_factory=list)  # the experiments' own seconds so far after each
    least_s: float | None = None  # to_reach_s for a pruner that knew each end (least_compute_s)


def finished_campaign(folder: Path) -> Finish | None:
    """The campaign in ``folder``, or None while it is still running."""
    from recipetune.finetune.results import ExperimentReport

    if not (folder / "baseline" / "report.json").exists():
        return None  # its baseline is still running
    meta = json.loads((folder / "campaign.json").read_text()) if (folder / "campaign.json").exists() else {}
    base = ExperimentReport.model_validate_json((folder / "baseline" / "report.json").read_text())
    ran = experiments(folder)
    traj, spent, pruned = trajectory(ran, base.value or 0.0)
    if len(traj) < int(meta.get("search", {}).get("budget", {}).get("trials") or len(traj)):
        return None
    root_s = base.timings_s.get("total", 0.0)
    best = max([base.value or 0.0, *traj])
    k = next((i + 1 for i, v in enumerate(traj) if v >= best > (base.value or 0.0)), 0)
    verdict = json.loads((folder / "verdict.json").read_text()) if (folder / "verdict.json").exists() else None
    return Finish(best, k, root_s + (spent[k - 1] if k else 0.0), root_s + (spent[-1] if spent else 0.0), pruned,
                  _decision(verdict), ((verdict or {}).get("verdict") or {}).get("gain"),
                  base.value or 0.0, traj, [round(s, 1) for s in spent],
                  root_s + least if k and (least := least_compute_s(ran[:k])) is not None else None)


def table(out: Path, arms: list[str]) -> dict[str, dict[str, dict[str, Finish]]]:
    """The ablation as markdown, from the campaign folders under ``out``: per arm, over the search
    seeds that ran to their budget (a campaign still running is left out). "Best arm": at how many
    of its seeds this arm's best was the highest of every arm that finished that seed (ties count).
    Returns what it read, task -> arm -> seed -> campaign (``--json`` keeps it)."""
    every: dict[str, dict[str, dict[str, Finish]]] = {}
    for task_dir in sorted(p for p in out.iterdir() if p.is_dir() and p.name not in ("cache", "final")):
        runs: dict[str, dict[str, Finish]] = {}
        for arm in arms:
            for folder in sorted(p for p in task_dir.glob(f"{arm}-*") if p.name.removeprefix(f"{arm}-").isdigit()):
                if (done := finished_campaign(folder)) is not None:
                    runs.setdefault(arm, {})[folder.name.removeprefix(f"{arm}-")] = done
        every[task_dir.name] = runs
        seeds = {seed for done in runs.values() for seed in done}
        top = {seed: max(done[seed].best for done in runs.values() if seed in done) for seed in seeds}
        print(f"\n{task_dir.name}\n")
        print("| arm | seeds | best validation, mean ± sd | per seed | best arm | experiments to reach it | "
              "compute to reach it (s) | the least any pruner could (s) | compute per campaign (s, mean) | "
              "stopped early | test gain, mean | test-split decision |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for arm in arms:
            done = runs.get(arm, {})
            if not done:
                continue
            rows = list(done.values())
            bests = [r.best for r in rows]
            sd = statistics.stdev(bests) if len(bests) > 1 else 0.0
            wins = sum(1 for seed, r in done.items() if r.best >= top[seed] - 1e-9)
            print(f"| {arm} | {', '.join(done)} | {statistics.fmean(bests):.4f} ± {sd:.4f} | "
                  f"{', '.join(f'{b:.4f}' for b in bests)} | {wins} of {len(done)} | "
                  f"{', '.join(str(r.reach) for r in rows)} | {', '.join(f'{r.to_reach_s:.0f}' for r in rows)} | "
                  f"{', '.join('–' if r.least_s is None else f'{r.least_s:.0f}' for r in rows)} | "
                  f"{statistics.fmean(r.total_s for r in rows):.0f} | {', '.join(str(r.stopped) for r in rows)} | "
                  f"{_mean([r.test_gain for r in rows])} | {'; '.join(r.decision for r in rows)} |")
    return every


def _mean(gains: list[float | None]) -> str:
    """``+0.133 (3)``: the mean over the decided seeds and how many they are; ``–`` when none is."""
    known = [g for g in gains if g is not None]
    return f"{statistics.fmean(known):+.3f} ({len(known)})" if known else "–"


def _decision(verdict: dict | None) -> str:
    """``APPROVED +0.51 [+0.04, +0.98]`` from a campaign's verdict.json; ``–`` when not decided."""
    if verdict is None:
        return "–"
    v = verdict.get("verdict") or {}
    if v.get("gain") is None:
        return verdict["decision"]
    return f"{verdict['decision']} {v['gain']:+.3f} [{v['ci_low']:+.3f}, {v['ci_high']:+.3f}]"


def campaign(file: Path, arm: str, seed: int, budget: int, out: Path, memo: MemoExecutor, final: bool) -> dict:
    folder = out / file.stem / f"{arm}-{seed}"
    overrides = [*ARMS[arm], f"search.seed={seed}", f"search.budget.trials={budget}"]
    c = ftp.load_finetune_campaign(file, overrides)
    p = ftp.plan(c, folder, resume=folder.exists())
    job = ft.QualityJob(p) if final else SearchOnly(p)
    before = memo.seconds
    t0 = time.perf_counter()
    services = Services(p.store, memo, Quiet(f"{file.stem} {arm} {seed}"))
    outcome = run_search(job, c.cfg, services, meta=p.meta, snapshot=p.snapshot, resume=p.resume, proposer=p.proposer)
    root = outcome.tree.root.score or 0.0
    traj, spent, _ = trajectory(experiments(folder), root)
    seconds = spent[-1] if spent else 0.0
    best = outcome.tree.best()
    row: dict[str, Any] = {
        "task": file.stem, "arm": arm, "seed": seed, "baseline": root, "best": max([root, *traj]),
        "trajectory": traj, "best_change": c.space.describe(best.recipe, c.baseline) if best else "",
        "experiments_s": round(seconds, 1), "run_here_s": round(memo.seconds - before, 1),
        "driver_s": round(time.perf_counter() - t0, 1),
        "decision": outcome.decision,
    }
    if final and outcome.verdict is not None:
        row["final"] = outcome.verdict.model_dump(mode="json")
    elif final:
        row["final"] = {"decision": outcome.decision, "reasons": outcome.reasons}
    return row


def decide(file: Path, arm: str, seed: int, budget: int, out: Path, memo: MemoExecutor) -> None:
    """The campaign's own decision (finetune/decide.py: its best node against the baseline on the
    test split over the file's seeds), once it has run to its budget. The test evaluations of a
    recipe are kept in ``out/final/<task>/<recipe id>`` and reused by the arms whose best it is too:
    the same experiment at the same seeds gives the same figures."""
    folder = out / file.stem / f"{arm}-{seed}"
    if (folder / "verdict.json").exists() or not folder.exists():
        return
    ran = len(experiments(folder))
    if ran < budget:
        print(f"  [{file.stem} {arm} {seed}] {ran} of {budget} experiments: not decided yet")
        return
    shared = out / "final" / file.stem
    shared.mkdir(parents=True, exist_ok=True)
    for done in shared.iterdir():
        if not (folder / "final" / done.name).exists():
            shutil.copytree(done, folder / "final" / done.name)
    row = campaign(file, arm, seed, budget, out, memo, final=True)
    for mine in (folder / "final").iterdir() if (folder / "final").exists() else []:
        if (mine / "final.json").exists() and not (shared / mine.name).exists():
            shutil.copytree(mine, shared / mine.name)
    print(f"  [{file.stem} {arm} {seed}] {row['decision']}: {'; '.join(row['final'].get('reasons', []))}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--budget", type=int, default=6)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=Path("runs/ft-search"))
    parser.add_argument("--final", action="store_true", help="the test-split decision of the first MCTS campaign")
    parser.add_argument("--table", action="store_true", help="only print the markdown table of the campaigns in --out")
    parser.add_argument("--json", type=Path, help="with --table: also write every campaign's figures here")
    parser.add_argument("--decide", action="store_true",
                        help="the test-split decision of each campaign of these files, arms and seeds that ran "
                             "to its budget (a recipe's test evaluation is shared by the arms that found it)")
    args = parser.parse_args()
    if args.table:
        every = table(args.out, args.arms.split(","))
        if args.json:
            args.json.write_text(json.dumps({task: {arm: {seed: asdict(f) for seed, f in done.items()}
                                                    for arm, done in runs.items()} for task, runs in every.items()},
                                            indent=1) + "\n")
        return
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    memo = MemoExecutor(args.out / "cache")
    if args.decide:
        for file in args.files:
            for seed in seeds:
                for arm in arms:
                    decide(file, arm, seed, args.budget, args.out, memo)
        return
    rows = []
    # every task at a seed before the next seed: a sitting that stops early has compared the arms
    for seed in seeds:
        for file in args.files:
            for arm in arms:
                rows.append(campaign(file, arm, seed, args.budget, args.out, memo,
                                     final=args.final and arm == "mcts" and seed == seeds[0]))
                (args.out / f"summary-{'-'.join(f.stem for f in args.files)}.json").write_text(
                    json.dumps(rows, indent=2))
    for file in args.files:
        print(f"\n{file.stem}: best validation metric after {args.budget} experiments (mean over seeds {seeds})")
        for arm in arms:
            mine = [r for r in rows if r["task"] == file.stem and r["arm"] == arm]
            bests = [r["best"] for r in mine]
            wall = statistics.fmean(r["experiments_s"] for r in mine)
            print(f"  {arm:<11} {statistics.fmean(bests):.4f} (per seed {', '.join(f'{b:.4f}' for b in bests)}); "
                  f"baseline {mine[0]['baseline']:.4f}; experiments {wall:.0f}s")
    print(f"\nexperiments run {memo.misses}, reused {memo.hits}")


if __name__ == "__main__":
    main()
