"""What share of a speed campaign's compute the guard takes: the baseline profile and the final verdicts.

    python benchmarks/guard_share.py campaigns/tiny-campaign [more campaign folders ...]

Every run a campaign made has a result.json with its wall time. This sums them by what they were
for: the search's trials (``trials/``), the baseline profile (``baseline/``), the final verdicts'
parity runs (``final/*/parity``, ``final/*/baseline`` and the stored runs of ``guard-runs/``) and
their interleaved speed pairs (``final/*/speed``). A run reached twice (a link, or a profile run
also stored for reuse) counts once: runs are told apart by the folder they ran in. It prints the
run counts and seconds of each part and the guard's share of the campaign's compute (profile,
parity and speed over everything), with the campaign's wall time where the study recorded it.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def part(folder: Path, ran_in: Path) -> str:
    rel = ran_in.resolve().relative_to(folder.resolve()).parts
    if rel[0] == "trials":
        return "search"
    if rel[0] == "baseline":
        return "profile"
    if rel[0] == "final" and len(rel) > 2 and rel[2] == "speed":
        return "speed"
    return "parity"  # final/*/parity, final/*/baseline (later looks' seeds), guard-runs/


def share(folder: Path) -> dict[str, list[float]]:
    seen: dict[Path, tuple[str, float]] = {}
    for path in folder.rglob("result.json"):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        ran_in = Path(result.get("out_dir") or path.parent).resolve()
        if not ran_in.is_relative_to(folder.resolve()):
            ran_in = path.parent.resolve()
        seen.setdefault(ran_in, (part(folder, ran_in), float(result.get("wall_s") or 0.0)))
    parts: dict[str, list[float]] = defaultdict(list)
    for what, wall in seen.values():
        parts[what].append(wall)
    return parts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folders", nargs="+", type=Path)
    args = p.parse_args()
    print("| campaign | search runs, s | profile runs, s | parity runs, s | speed runs, s | guard share | decision |")
    print("|---|---|---|---|---|---|---|")
    for folder in args.folders:
        parts = share(folder)
        total = sum(sum(v) for v in parts.values())
        guard = sum(sum(parts[k]) for k in ("profile", "parity", "speed"))
        verdict = folder / "verdict.json"
        decision = json.loads(verdict.read_text()).get("decision", "-") if verdict.exists() else "-"
        cells = [f"{len(parts[k])}, {sum(parts[k]):.0f}" for k in ("search", "profile", "parity", "speed")]
        print(f"| {folder} | {' | '.join(cells)} | {100 * guard / total:.0f}% | {decision} |")


if __name__ == "__main__":
    main()
