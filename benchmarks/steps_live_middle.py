"""The steps design's middle look read from the pair as it runs, against a middle pair of its own,
simulated: the same worlds, the outcome and the steps each trains.

    python benchmarks/steps_live_middle.py --worlds 12

Each world is tests/test_guard_live_looks.py's ``verdict``: an equivalent (or a poison of ``--size`` T)
on other batches, 32 x 1 against 2 x 16, no training; the live runs advance only when read (``Live``), so
the outcomes do not depend on the machine's load; a stopped run's steps past its middle vary by a read or
two with the order its threads run in. Steps trained count a stopped run's steps up to its stop.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_guard_live_looks import spent, verdict  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=12)
    ap.add_argument("--size", type=float, default=0.0, help="the candidate's offset, in T (0: an equivalent)")
    args = ap.parse_args()
    print("| world | separate: outcome, steps | read as it runs: outcome, steps | runs stopped (side, length, at) |")
    print("|---|---|---|---|")
    total = [0, 0]
    for w in range(args.worlds):
        (old, wo), (new, wn) = verdict(w, args.size, live=False), verdict(w, args.size, live=True)
        total[0], total[1] = total[0] + spent(wo), total[1] + spent(wn)
        print(f"| {w} | {old.evidence.outcome}, {spent(wo):,} | {new.evidence.outcome}, {spent(wn):,} | "
              f"{wn.stopped or '-'} |")
    print(f"\nin all: {total[0]:,} steps separate, {total[1]:,} read as it runs ({total[1] / total[0]:.2f}x)")


if __name__ == "__main__":
    main()
