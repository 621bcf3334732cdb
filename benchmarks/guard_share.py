"""What share of a speed campaign's compute the guard takes: the baseline profile and the final verdicts.

    python benchmarks/guard_share.py campaigns/tiny-campaign [more campaign folders ...]

The parts are summed as the campaign's own decision states them (speed/spent.py: every run once, by the
folder it ran in: the search's trials, the baseline profile, the final verdicts' parity runs and their
interleaved speed pairs). It prints the run counts and seconds of each part and the guard's share of the
campaign's compute (profile, parity and speed over everything), with the decision.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recipetune.speed.spent import PARTS, spent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args()
    print("| campaign | search runs, s | profile runs, s | parity runs, s | speed runs, s | guard share | decision |")
    print("|---|---|---|---|---|---|---|")
    for folder in args.folders:
        cost = spent(folder)
        verdict = folder / "verdict.json"
        decision = json.loads(verdict.read_text()).get("decision", "-") if verdict.exists() else "-"
        cells = [f"{cost.parts[k].runs}, {cost.parts[k].seconds:.0f}" for k in PARTS]
        print(f"| {folder} | {' | '.join(cells)} | {100 * cost.share:.0f}% | {decision} |")


if __name__ == "__main__":
    main()
