"""What a speed campaign spent, by what it ran for, and the share of it that proof took.

Every run a campaign made has a result.json with its wall time; the folder it ran in says what it was
for: the search's trials (``trials/``), the baseline profile (``baseline/``), the final verdicts'
parity runs (``final/*/parity``, ``final/*/baseline`` and the stored runs of ``guard-runs/``) and their
interleaved speed pairs (``final/*/speed``). A run reached twice (a trial kept as a verdict's first
parity run, a profile run also stored for reuse) counts once, where it ran: it was trained once.

The decision states it (speed/decide.py) and ``benchmarks/guard_share.py`` tabulates it over campaigns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.core.filenames import BASELINE
from recipetune.core.fmt import fmt_duration

PARTS = ("search", "profile", "parity", "speed")
PROOF = ("profile", "parity", "speed")  # what the guard ran: the search's trials are not proof


@dataclass(frozen=True)
class Part:
    runs: int
    seconds: float

    def text(self) -> str:
        return f"{self.runs} run{'s' if self.runs != 1 else ''}, {fmt_duration(self.seconds)}"


@dataclass(frozen=True)
class Spent:
    parts: dict[str, Part]

    @property
    def total_s(self) -> float:
        return sum(p.seconds for p in self.parts.values())

    @property
    def proof_s(self) -> float:
        return sum(self.parts[k].seconds for k in PROOF)

    @property
    def share(self) -> float:
        """The share of the campaign's run compute the guard's proof took (0 before anything ran)."""
        return self.proof_s / self.total_s if self.total_s > 0 else 0.0

    def text(self) -> str:
        p = self.parts
        return (f"proof took {100 * self.share:.0f}% of the campaign's run compute: profile {p['profile'].text()}, "
                f"parity {p['parity'].text()}, speed {p['speed'].text()}; the search {p['search'].text()}")

    def record(self) -> dict[str, Any]:
        """verdict.json's ``compute``: each part's runs and seconds, and the proof's share."""
        return {**{k: {"runs": v.runs, "seconds": round(v.seconds, 3)} for k, v in self.parts.items()},
                "proof_share": round(self.share, 4)}


def part(folder: Path, ran_in: Path) -> str:
    """What a run in ``ran_in`` (a folder inside the campaign's ``folder``) was for."""
    rel = ran_in.resolve().relative_to(folder.resolve()).parts or ("",)
    if rel[0] == "trials":
        return "search"
    if rel[0] == BASELINE:
        return "profile"
    if rel[0] == "final" and len(rel) > 2 and rel[2] == "speed":
        return "speed"
    return "parity"  # final/*/parity, final/*/baseline (later looks' seeds), guard-runs/


def spent(folder: Path) -> Spent:
    """Every run under ``folder`` once, by the folder it ran in, summed by what it was for."""
    seen: dict[Path, tuple[str, float]] = {}
    for path in sorted(folder.rglob("result.json")):
        try:
            result = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a run cut off before it wrote its result: nothing to count
        ran_in = Path(result.get("out_dir") or path.parent).resolve()
        if not ran_in.is_relative_to(folder.resolve()):
            ran_in = path.parent.resolve()  # a copy of a run made elsewhere (verify --runs): counted here
        seen.setdefault(ran_in, (part(folder, ran_in), float(result.get("wall_s") or 0.0)))
    runs = {k: [s for what, s in seen.values() if what == k] for k in PARTS}
    return Spent({k: Part(len(v), sum(v)) for k, v in runs.items()})
