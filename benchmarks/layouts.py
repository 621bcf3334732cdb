"""Tokens/s, peak memory and loss parity of each parallel layout of the reference trainer.

    python benchmarks/layouts.py --presets tiny small --nproc 2 --steps 20 --repeats 2

Every layout of ``--nproc`` processes (DDP, FSDP2 with and without resharding, TP, TP with sequence
parallelism) trains the same global batch for the same steps; a single process gives the reference
loss curve. Layouts run in rotation, ``--repeats`` times, so that load from other users of the
machine hits all alike; speeds are reported as medians and as ratios to DDP within the same run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from recipetune.workloads.reference import ReferenceWorkload

SHAPES = {  # per preset: sequence length, global batch, micro-batch (per data-parallel rank)
    "nano": (64, 16, 8),
    "tiny": (128, 16, 8),
    "small": (256, 8, 4),
}


def layouts(nproc: int) -> dict[str, dict]:
    return {
        "1 process (reference)": {"nproc": 1},
        f"DDP x{nproc}": {"nproc": nproc},
        f"FSDP2 x{nproc}": {"nproc": nproc, "dp_shard": nproc},
        f"FSDP2 x{nproc}, no reshard": {"nproc": nproc, "dp_shard": nproc, "reshard_after_forward": False},
        f"TP x{nproc}": {"nproc": nproc, "tp": nproc},
        f"TP x{nproc} + SP": {"nproc": nproc, "tp": nproc, "sequence_parallel": True},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"], choices=list(SHAPES))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    w = ReferenceWorkload()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    tables = []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            seq, gbs, mbs = SHAPES[preset]
            base = {"model": preset, "seq_len": seq, "global_batch_size": gbs, "warmup_steps": 5,
                    "num_threads": 1, "eval_batches": 1, "device": "cpu"}
            recipes = {}
            for name, knobs in layouts(args.nproc).items():
                dp = knobs["nproc"] // knobs.get("tp", 1)
                recipe = w.resolve({**base, "micro_batch_size": min(mbs, gbs // dp), **knobs})
                problems = w.check(recipe)
                if problems:
                    raise SystemExit(f"{preset} {name}: {'; '.join(problems)}")
                recipes[name] = recipe
            results: dict[str, list] = {n: [] for n in recipes}
            for rep in range(args.repeats):
                for name, recipe in recipes.items():
                    r = w.run(recipe, args.steps, Path(tmp) / f"{preset}-{rep}-{recipe.id}", timeout_s=1800)
                    if not r.ok:
                        raise SystemExit(f"{preset} {name}: {r.status} {r.cause}\n{r.stderr_tail[-2000:]}")
                    results[name].append(r)
                    print(f"  {preset} {name} #{rep}: {r.summary().tokens_per_s:,.0f} tokens/s", flush=True)
            tables.append(table(preset, seq, gbs, results, args.nproc))
            print("\n" + tables[-1] + "\n", flush=True)  # as soon as a preset is done
    env = r.environment
    print(f"\n{started}: {env.get('cpu')} ({env.get('cpu_count')} cores, shared), torch {env.get('torch')}, "
          f"{args.steps} steps ({r.warmup_steps} warm-up excluded), median of {args.repeats} rotations, "
          "1 thread per process\n")
    print("\n\n".join(tables))


def table(preset: str, seq: int, gbs: int, results: dict[str, list], nproc: int) -> str:
    ref = next(iter(results.values()))[0].losses()  # the single process comes first
    ddp = statistics.median(x.summary().tokens_per_s for x in results[f"DDP x{nproc}"])
    rows = [f"**{preset}** ({results[next(iter(results))][0].summary().measured_steps} measured steps, "
            f"global batch {gbs} x {seq} tokens)", "",
            "| layout | tokens/s | vs DDP | peak memory / process | max loss difference vs 1 process |",
            "|---|---:|---:|---:|---:|"]
    for name, runs in results.items():
        tps = statistics.median(x.summary().tokens_per_s for x in runs)
        mem = max(x.summary().peak_mem_bytes or 0 for x in runs) / 2**20
        diff = max(max(abs(a - b) for a, b in zip(x.losses(), ref, strict=True)) for x in runs)
        rows.append(f"| {name} | {tps:,.0f} | {tps / ddp:.2f} | {mem:,.0f} MiB | {diff:.1e} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
