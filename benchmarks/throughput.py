"""Tokens/s and MFU of a campaign file's baseline at a few settings, as a Markdown table.

    python benchmarks/throughput.py examples/tiny.yaml micro_batch_size=1 micro_batch_size=4 micro_batch_size=16

Each argument after the file is one setting (comma-separate several knobs: `nproc=2,micro_batch_size=8`);
every setting runs `--repeats` times, in rotation so that drift of the machine hits all alike.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from recipetune.config import load_campaign


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("campaign", type=Path)
    parser.add_argument("settings", nargs="+", help="knob=value[,knob=value...]")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    campaigns = {s: load_campaign(args.campaign, s.split(",")) for s in args.settings}
    rows: dict[str, list] = {s: [] for s in args.settings}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for setting, c in campaigns.items():
                out = Path(tmp) / f"{rep}-{c.baseline.id}"
                result = c.workload.run(c.baseline, args.steps, out, timeout_s=c.config.run.timeout_s)
                if not result.ok:
                    raise SystemExit(f"{setting}: {result.status} {result.cause}")
                rows[setting].append(result.summary())

    env = result.environment
    print(f"{env.get('cpu')} ({env.get('cpu_count')} cores), torch {env.get('torch')}, "
          f"{args.steps} steps, median of {args.repeats}\n")
    print("| setting | tokens/s | tokens/s per device | MFU | step time (ms) | peak memory (MiB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for setting, summaries in rows.items():
        tps = statistics.median(s.tokens_per_s for s in summaries)
        per_dev = statistics.median(s.tokens_per_s_per_device for s in summaries)
        mfus = [s.mfu for s in summaries if s.mfu is not None]
        mfu = f"{100 * statistics.median(mfus):.1f}%" if mfus else "n/a"
        step_ms = 1000 * statistics.median(s.mean_step_time_s for s in summaries)
        mem = max(s.peak_mem_bytes or 0 for s in summaries) / 2**20
        print(f"| {setting} | {tps:,.0f} | {per_dev:,.0f} | {mfu} | {step_ms:.0f} | {mem:.0f} |")


if __name__ == "__main__":
    main()
