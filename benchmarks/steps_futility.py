"""Futility in the steps design (guard/looks_steps.py: ``_steps_chance``), simulated: what a trainer without
a seed knob spends on verdicts with and without the rule, and whether any verdict changes.

    python benchmarks/steps_futility.py --worlds 100 --caps 2 4 16

Each world is tests/test_guard_independent.py's ``ReplicaWorkload`` (a nanoGPT-like trainer whose logged
loss averages one micro-batch: 2 x 16 against 32 x 1 on other batches, no training) with its own fixed seed;
the candidate is an equivalent or a poison of 1, 1.5 or 3 T. Per cap (guard.parity.max_steps_factor) and
size: the verdicts' outcomes and stops, and the steps trained in runs of the profile's length, with
parity.futility 0 (the rule off) and at its default 0.1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_guard_independent import BASE, CAND, ReplicaWorkload, settings  # noqa: E402

from recipetune.guard.baseline import build_profile  # noqa: E402
from recipetune.guard.looks import gather  # noqa: E402


def verdict(world: int, size: float, cap: int, futility: float, folder: Path) -> tuple[str, str, float]:
    cfg = settings(seeds=3, max_steps_factor=cap, futility=futility)
    wl = ReplicaWorkload(world, jitter=0.0)
    profile = build_profile(wl, BASE, [wl.run(BASE, 100, None) for _ in range(3)], [None] * 3, 100, cfg)
    wl.offset, wl.launched = size * profile.loss_tolerance / 0.75, []
    got = gather(wl, profile, BASE, CAND, 100, cfg, folder / f"{world}-{size}-{cap}-{futility}", equal_tokens=False)
    return str(got.evidence.outcome), str(got.stop), sum(steps for _, steps in wl.launched) / 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, default=100)
    parser.add_argument("--caps", type=int, nargs="+", default=[2, 4, 16])
    args = parser.parse_args()
    print("| cap | candidate | futility | outcomes | stops | runs (profile lengths) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for cap in args.caps:
            for size in (0.0, 1.0, 1.5, 3.0):
                for futility in (0.0, 0.1):
                    rows = [verdict(w, size, cap, futility, Path(scratch)) for w in range(args.worlds)]
                    outcomes, stops = Counter(o for o, _, _ in rows), Counter(s for _, s, _ in rows)
                    name = "equivalent" if size == 0 else f"poison {size:g} T"
                    print(f"| {cap}x | {name} | {futility:g} | {dict(outcomes)} | {dict(stops)} | "
                          f"{sum(c for _, _, c in rows):.0f} |", flush=True)


if __name__ == "__main__":
    main()
