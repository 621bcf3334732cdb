"""How often does the guard approve a candidate identical to the baseline as faster? (target: <= 5%)

    python benchmarks/aa_false_approval.py examples/verify-baseline.yaml -n 40

The baseline is profiled once (as a campaign does), then each repetition decides on the baseline
against itself with the campaign file's guard settings (defaults unless its guard: section says
otherwise). By default a repetition is the throughput decision alone (interleaved pairs, bootstrap
CI, A/A noise margin: exactly what `final_verdict` runs after parity); ``--full`` runs the whole
`final_verdict`, parity over seeds included. Run it on a quiet machine: the figure is the rate of
false approvals under that machine's own noise. Extra ``key=value`` arguments override the file.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from recipetune.config import load_campaign
from recipetune.core import stats
from recipetune.guard.baseline import profile_baseline
from recipetune.guard.speed import measure_speed
from recipetune.guard.verdict import final_verdict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path, nargs="?", default=Path("examples/verify-baseline.yaml"))
    parser.add_argument("overrides", nargs="*", help="key=value, as on the recipetune command line")
    parser.add_argument("-n", "--repetitions", type=int, default=40)
    parser.add_argument("--full", action="store_true", help="each repetition is a whole final_verdict")
    parser.add_argument("--out", type=Path, default=None, help="folder for every run (default runs/aa-TIME)")
    args = parser.parse_args()

    campaign = load_campaign(args.campaign, args.overrides)
    settings, recipe, workload = campaign.config.guard, campaign.baseline, campaign.workload
    out = args.out or Path("runs") / f"aa-{time.strftime('%Y%m%d-%H%M%S')}"
    print(f"A/A on {args.campaign} (recipe {recipe.id}), {args.repetitions} repetitions -> {out}")
    print(f"guard: parity {settings.parity.model_dump()}, speed {settings.speed.model_dump()}")
    profile = profile_baseline(workload, recipe, settings.parity.steps, settings, out / "baseline")
    print(f"baseline: {profile.tokens_per_s:,.0f} tokens/s per device, A/A spread of repeats "
          f"{100 * profile.throughput_noise:.1f}%")

    approved, rows = 0, []
    for i in range(args.repetitions):
        folder = out / f"rep-{i + 1:03d}"
        if args.full:
            v = final_verdict(workload, recipe, recipe, settings, folder, profile=profile)
            row = {"decision": v.decision, "speedup": v.speedup, "ci_low": v.ci_low, "ci_high": v.ci_high,
                   "noise_margin": v.noise_margin}
        else:
            s = measure_speed(workload, recipe, recipe, settings, folder, profile.aa_log_ratios)
            row = {"decision": "APPROVED" if s.faster else "KEEP BASELINE", "speedup": s.speedup,
                   "ci_low": s.ci_low, "ci_high": s.ci_high, "noise_margin": s.noise_margin,
                   "smallest_approvable": s.smallest_approvable}
        approved += row["decision"] == "APPROVED"
        rows.append(row)
        power = row.get("smallest_approvable")
        print(f"{i + 1:4d}  {row['decision']:13s}  speed-up {row['speedup']:.3f}  "
              f"CI [{row['ci_low']:.3f}, {row['ci_high']:.3f}]  margin {100 * row['noise_margin']:.1f}%"
              + (f"  smallest approvable {power:.3f}x" if power else ""), flush=True)

    rate, low, high = stats.proportion_ci(approved, len(rows))
    powers = sorted(r["smallest_approvable"] for r in rows if r.get("smallest_approvable"))
    if powers:
        print(f"\nsmallest approvable speed-up: median {powers[len(powers) // 2]:.3f}x "
              f"(range {powers[0]:.3f}-{powers[-1]:.3f}x)")
    print(f"\nfalse approvals: {approved}/{len(rows)} = {100 * rate:.1f}% "
          f"(95% CI {100 * low:.1f}-{100 * high:.1f}%; target <= 5%)")
    (out / "aa.json").write_text(json.dumps({"campaign": str(args.campaign), "overrides": args.overrides,
                                             "settings": settings.model_dump(), "full": args.full,
                                             "false_approvals": approved, "repetitions": len(rows),
                                             "rate": rate, "ci": [low, high], "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
