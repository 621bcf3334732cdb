"""The quality job's decision (core/sequential.py: GainDesign, finetune/looks.py) measured on simulated
decisions at the noise the FT-Bench tasks show, and replayed on their stored per-seed test evaluations.

    python benchmarks/ft_decision.py --reps 2000 --json benchmarks/results/ft-decision.json
    python benchmarks/ft_decision.py --reps 0 --extra chat-recall=runs/ft-decision/chat-recall   # replays only

The noise: benchmarks/results/ft-bench-seeds.json, each task's per-seed test metric of its baseline and
its best node (docs/finetune.md). A simulated decision draws each seed's paired gain (candidate -
baseline) from a case below and runs the design's looks as ``recipetune finetune`` does (the first look at
3 seeds, at most ``search.max_test_seeds``, the campaign defaults); a replay feeds the stored seeds in
their order and stops where the design asks for a seed no campaign stored (``--extra TASK=FOLDER`` adds
seeds run since: FOLDER/baseline*/final.json and FOLDER/candidate*/final.json, benchmarks/ft_decision_run.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import numpy as np

from recipetune.core.sequential import GainDesign
from recipetune.finetune.plan import FinetuneSearchConfig

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "benchmarks" / "results" / "ft-bench-seeds.json"
Draw = Callable[[np.random.Generator, int], np.ndarray]  # (rng, k) -> k paired gains


def design(min_gain: float = 0.0, cap: int | None = None) -> GainDesign:
    """The campaign defaults' design (finetune/looks.py: design_of), with a threshold and a cap."""
    cfg = FinetuneSearchConfig()
    return GainDesign((1.0 - cfg.confidence) / 2.0, cfg.power, cfg.futility, min_gain, cap or cfg.max_test_seeds,
                      cfg.spending, cfg.first_look)


def decision(draw: Draw, rng: np.random.Generator, min_gain: float = 0.0, first: int = 3) -> tuple[str, int]:
    """One simulated decision: (outcome, seeds)."""
    d, gains = design(min_gain), np.empty(0)

    def more(n: int) -> list[float]:
        nonlocal gains
        gains = np.concatenate([gains, draw(rng, n - len(gains))])
        return list(gains)

    look = d.run(more, first)
    assert look is not None
    return look.outcome, look.n


def rates(draw: Draw, reps: int, min_gain: float = 0.0, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    runs = [decision(draw, rng, min_gain) for _ in range(reps)]
    seeds = [n for _, n in runs]
    out = {k: sum(o == k for o, _ in runs) / reps for k in ("shown", "futility", "budget", "plan")}
    return {**out, "seeds": float(np.mean(seeds)), "seeds_p95": float(np.percentile(seeds, 95)),
            "runs": 2 * float(np.mean(seeds)), "reps": reps}


def normal(mean: float, sd: float) -> Draw:
    return lambda rng, k: rng.normal(mean, sd, k)


def stored() -> dict[str, dict]:
    return json.loads(STORED.read_text())["tasks"]


def noise(task: dict) -> tuple[float, float, float]:
    """(mean paired gain, sd of a seed's gain, sd of the baseline's per-seed metric)."""
    gains = [c - b for b, c in zip(task["baseline"], task["candidate"], strict=True)]
    return statistics.fmean(gains), statistics.stdev(gains), statistics.stdev(task["baseline"])


def cases() -> list[tuple[str, Draw, float, str]]:
    """(name, draw, min_gain, what the design must do) at the FT-Bench tasks' noise."""
    t = stored()
    _, sd_arg, _ = noise(t["argcount"])
    _, _, sd_recall = noise(t["chat-recall"])
    _, _, sd_exc = noise(t["exception"])
    stated = design().resolves(sd_arg, design().cap)

    def spread3(rng: np.random.Generator, k: int) -> np.ndarray:  # exception's shape: the candidate 3x as spread
        return rng.normal(0.0, 3 * sd_exc, k) - rng.normal(0.0, sd_exc, k)

    def halves(rng: np.random.Generator, k: int) -> np.ndarray:  # arith's shape: a seed learns it or not
        return rng.choice([-0.4, 0.4], k)

    return [
        ("baseline vs itself, deterministic (every gain 0)", lambda rng, k: np.zeros(k), 0.0, "null"),
        (f"baseline vs itself, chat-recall's baseline spread (sd {sd_recall:.3f} a run)",
         normal(0.0, np.sqrt(2) * sd_recall), 0.0, "null"),
        (f"a recipe equal to it, argcount's pair scatter (sd {sd_arg:.3f})", normal(0.0, sd_arg), 0.0, "null"),
        (f"equal, exception's shape: the candidate 3x as spread (sd {sd_exc:.3f}, {3 * sd_exc:.3f})", spread3, 0.0,
         "null"),
        ("equal, arith's shape: half the seeds +0.4, half -0.4", halves, 0.0, "null"),
        ("search.min_gain 0.02, a gain of exactly 0.02, argcount's scatter", normal(0.02, sd_arg), 0.02, "null"),
        (f"the gain the plan states for 8 seeds at 80% ({stated:+.3f}), argcount's scatter", normal(stated, sd_arg),
         0.0, "power"),
    ]


def replay(task: dict, extra: dict[str, list[float]] | None = None) -> dict:
    """The design's looks on a task's stored seeds, in order; where it asks for more than are stored, it stops."""
    base, cand = list(task["baseline"]), list(task["candidate"])
    if extra:
        base, cand = base + extra["baseline"], cand + extra["candidate"]
    gains = [c - b for b, c in zip(base, cand, strict=True)]
    d, looks, missing = design(), [], 0

    def draw(n: int) -> list[float] | None:
        nonlocal missing
        missing = max(n - len(gains), 0)
        return None if missing else gains[:n]

    def seen(look) -> None:
        looks.append({"seeds": look.n, "gain": round(look.mean, 4), "low": round(look.low, 4),
                      "level": round(look.level, 4), "outcome": look.outcome, "planned": look.planned,
                      "chance": None if look.chance is None else round(look.chance, 3)})

    d.run(draw, 3, seen)
    last = looks[-1]
    decided = "APPROVED" if last["outcome"] == "shown" else "KEEP BASELINE" if last["outcome"] != "continue" \
        else f"its next look asks for {len(gains) + missing} seeds, {len(gains)} stored"
    return {"looks": looks, "decision": decided, "seeds_used": last["seeds"], "runs_used": 2 * last["seeds"],
            "seeds_stored": len(gains)}


def extra_seeds(folder: Path) -> dict[str, list[float]]:
    """The per-seed test values run since, by recipe, in seed order: FOLDER/baseline*/final.json and
    FOLDER/candidate*/final.json (one folder, or one a seed run side by side)."""
    out = {}
    for who in ("baseline", "candidate"):
        by_seed = {}
        for f in sorted(folder.glob(f"{who}*/final.json")):
            got = json.loads(f.read_text())
            by_seed.update(zip(got["seeds"], got["values"], strict=True))
        out[who] = [by_seed[k] for k in sorted(by_seed)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--extra", action="append", default=[], help="TASK=FOLDER: seeds run since (ft_decision_run.py)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out: dict = {"reps": a.reps, "cases": [], "tasks": {}, "replays": {}}
    if a.reps:
        print("| case | min_gain | approved | futility | budget | not shown at the plan | seeds, mean | p95 | runs |")
        print("|---|---|---|---|---|---|---|---|---|")
        for i, (name, draw, min_gain, kind) in enumerate(cases()):
            r = rates(draw, a.reps, min_gain, seed=i)
            out["cases"].append({"case": name, "kind": kind, "min_gain": min_gain, **r})
            print(f"| {name} | {min_gain:g} | {r['shown']:.1%} | {r['futility']:.1%} | {r['budget']:.1%} | "
                  f"{r['plan']:.1%} | {r['seeds']:.2f} | {r['seeds_p95']:.0f} | {r['runs']:.1f} |")
        print("\n| task | sd of a seed's gain | its mean gain | approved | seeds, mean | p95 | runs, mean |")
        print("|---|---|---|---|---|---|---|")
        for i, (name, task) in enumerate(stored().items()):
            mean, sd, _ = noise(task)
            at = rates(normal(mean, sd), a.reps, seed=100 + i)
            out["tasks"][name] = {"mean_gain": mean, "sd_gain": sd, "at_its_gain": at}
            print(f"| {name} | {sd:.4f} | {mean:+.4f} | {at['shown']:.1%} | {at['seeds']:.2f} | "
                  f"{at['seeds_p95']:.0f} | {at['runs']:.1f} |")
    extras = {k: extra_seeds(Path(v)) for k, v in (e.split("=", 1) for e in a.extra)}
    print("\n| task | stored seeds | looks (seeds: gain, bound, outcome) | decision | runs |")
    print("|---|---|---|---|---|")
    for name, task in stored().items():
        r = replay(task, extras.get(name))
        out["replays"][name] = r
        looks = "; ".join(f"{x['seeds']}: {x['gain']:+.3f}, {x['low']:+.3f}, {x['outcome']}" for x in r["looks"])
        print(f"| {name} | {r['seeds_stored']} | {looks} | {r['decision']} | {r['runs_used']} |")
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
