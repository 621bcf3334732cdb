"""The guard against the cases built to fool it: poisons at the edge of detection beside equivalent recipes.

    python benchmarks/guard_poisons.py tests/fixtures/edge-campaign.yaml \\
        equiv:micro_batch=16,grad_accum=4 order:order_seed=7 aa: \\
        drop:micro_batch=16,grad_accum=4,poison=drop short:micro_batch=16,grad_accum=4,poison=short \\
        stale:micro_batch=16,grad_accum=4,poison=stale lr10:micro_batch=16,grad_accum=4,poison=lr10

Each case is ``name:knob=value,...`` (empty: the baseline itself, an A/A). The baseline is profiled
once, as a campaign does; every case then gets the whole ``final_verdict`` at the file's guard
settings (defaults unless its guard: section or ``--set section.field=value`` says otherwise), and
a markdown row: the parity mode, the verdict, the loss difference, T, the smallest detectable
difference, and the cost (runs and seconds). Verdicts are kept under ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import yaml

from recipetune.config import load_campaign
from recipetune.guard.baseline import profile_baseline
from recipetune.guard.verdict import final_verdict


def parse_case(text: str) -> tuple[str, dict[str, str]]:
    name, _, edits = text.partition(":")
    return name, {k: yaml.safe_load(v) for k, v in (e.split("=", 1) for e in edits.split(",") if e)}


def measures(parity: dict) -> str:
    """Each loss measure's outcome with its T: ``train holds (T 0.0053), val fails (T 0.0111)``."""
    return ", ".join(f"{m['measure'].split()[0]} {m['outcome']} (T {m['tolerance']:.4f})"
                     for m in parity.get("measures") or []) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path)
    parser.add_argument("cases", nargs="+", help="name:knob=value,... (empty edits: A/A)")
    parser.add_argument("--set", nargs="*", default=[], help="section.field=value overrides of the file")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    campaign = load_campaign(args.campaign, args.set)
    settings, base, workload = campaign.config.guard, campaign.baseline, campaign.workload
    out = args.out or Path("runs") / f"poisons-{time.strftime('%Y%m%d-%H%M%S')}"
    t0 = time.monotonic()
    profile = profile_baseline(workload, base, settings.parity.steps, settings, out / "baseline")
    print(f"{args.campaign}: baseline profiled in {time.monotonic() - t0:.0f} s; T = {profile.loss_tolerance:.4f} "
          f"({profile.loss_reference_kind}); runs under {out}\n")
    print("| case | change | mode | verdict | loss diff | T | detectable | measures | parity runs | speed-up | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for text in args.cases:
        name, edits = parse_case(text)
        cand = workload.resolve({**dict(base), **edits})
        t0 = time.monotonic()
        v = final_verdict(workload, base, cand, settings, out / name, profile=profile)
        p = v.parity
        det = p.get("detectable")
        print(f"| {name} | {cand.describe_diff(base) or 'none (A/A)'} | {p.get('mode', '-')} | {v.decision} | "
              f"{p.get('mean_diff', float('nan')):+.4f} | {p.get('tolerance', float('nan')):.4f} | "
              f"{'-' if det is None else f'{det:.4f}'} | {measures(p)} | {int(v.cost.get('parity_runs', 0))} | "
              f"{'-' if v.speedup is None else f'{v.speedup:.2f}x'} | {time.monotonic() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
