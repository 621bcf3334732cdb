"""How large the fixtures' edge poisons are against the baseline's seed-to-seed spread.

For each trainer (tests/fixtures/edge_trainer.py at the run length of tests/fixtures/edge-campaign.yaml,
tests/fixtures/nanogpt_trainer.py at that of examples/nanogpt-campaign.yaml) it runs the baseline
over N seeds and every case (an equivalent split, another sample order, an A/A rerun, each poison)
over the same seeds, and prints:

- the baseline's seed-to-seed standard deviation of M, the loss measure of the parity rule: the mean
  logged training loss over the records in the last 50% of the run's tokens;
- for each case, the mean over seeds of (case M - baseline M of the same seed), its ratio to that
  std, the std of the paired differences, and the same three for the final validation loss.

An edge poison is one whose ratio lies between 1 and 3. The nanoGPT-style trainer has no seed in
its campaign; its hidden --seed flag is used here only to draw independent repeats, and it runs
with --eval_interval=<steps> (an evaluation at iteration 0 and at the end, nanoGPT's
estimate_loss over --eval_iters batches of the run's batch_size) to get a validation loss. Run:

    OMP_NUM_THREADS=1 python benchmarks/poison_calibration.py --seeds 8 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
EDGE, NANOGPT = FIXTURES / "edge_trainer.py", FIXTURES / "nanogpt_trainer.py"
QUIET = FIXTURES / "quiet_trainer.py"


def edge_cases(steps: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
    base = ["--micro-batch=4", "--grad-accum=16", f"--steps={steps}"]
    fast = ["--micro-batch=16", "--grad-accum=4", f"--steps={steps}"]
    return base, [
        ("split 16x4", fast),
        ("split 64x1", ["--micro-batch=64", "--grad-accum=1", f"--steps={steps}"]),
        ("another order", base + ["--order-seed={order}"]),
        ("A/A", base),
        ("drop 16x4", fast + ["--poison=drop"]),
        ("short 16x4", fast + ["--poison=short"]),
        ("stale 16x4", fast + ["--poison=stale"]),
        ("lr10 16x4", fast + ["--poison=lr10"]),
    ]


def nanogpt_cases(steps: int) -> tuple[list[str], list[tuple[str, list[str]]]]:
    common = [f"--max_iters={steps}", f"--eval_interval={steps}", "--eval_iters=20"]
    base = ["--batch_size=2", "--gradient_accumulation_steps=16", *common]
    b8 = ["--batch_size=8", "--gradient_accumulation_steps=4", *common]
    b32 = ["--batch_size=32", "--gradient_accumulation_steps=1", *common]
    return base, [
        ("split 8x4 (other stream)", b8),
        ("split 32x1 (other stream)", b32),
        ("A/A", base),
        ("drop4 8x4", b8 + ["--poison=drop4"]),
        ("short2 8x4", b8 + ["--poison=short2"]),
        ("stale4 8x4", b8 + ["--poison=stale4"]),
        ("lr10 8x4", b8 + ["--poison=lr10"]),
        ("lr10 32x1", b32 + ["--poison=lr10"]),
    ]


def quiet_cases(steps: int, drop_every: list[int]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    base = ["--micro=4", "--accum=8", f"--steps={steps}"]
    split = ["--micro=8", "--accum=4", f"--steps={steps}"]
    return base, [
        ("split 8x4", split),
        ("split 32x1", ["--micro=32", "--accum=1", f"--steps={steps}"]),
        ("another order", base + ["--order-seed={order}"]),
        ("A/A", base),
        *[(f"drop 8x4 every {k}", split + ["--poison=drop", f"--drop-every={k}"]) for k in drop_every],
    ]


def run_quiet(args: list[str], seed: int, out: Path) -> dict:
    argv = [sys.executable, str(QUIET), f"--seed={seed}", f"--out={out}",
            *[a.replace("{order}", str(seed + 1000)) for a in args]]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    m = tail_mean([(x["loss"], x["tokens"]) for x in steps])
    return {"m": m, "val": m, "wall": wall}  # no validation loss: the training measure stands in


def run_edge(args: list[str], seed: int, out: Path) -> dict:
    argv = [sys.executable, str(EDGE), f"--seed={seed}", f"--out={out}",
            *[a.replace("{order}", str(seed + 1000)) for a in args]]
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - t0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x]
    val = [x["val_loss"] for x in lines if "val_loss" in x][-1]
    return {"m": tail_mean([(x["loss"], x["tokens"]) for x in steps]), "val": val, "wall": wall}


def run_nanogpt(args: list[str], seed: int, out: Path) -> dict:
    argv = [sys.executable, str(NANOGPT), f"--seed={seed}", f"--out_dir={out}", *args]
    t0 = time.perf_counter()
    text = subprocess.run(argv, check=True, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    wall = time.perf_counter() - t0
    losses = [float(x) for x in re.findall(r"^iter \d+: loss ([\d.e+-]+|nan)", text, re.M)]
    val = float(re.findall(r"val loss ([\d.e+-]+|nan)", text)[-1])
    return {"m": tail_mean([(x, 1) for x in losses]), "val": val, "wall": wall}


def tail_mean(records: list[tuple[float, int]]) -> float:
    """The mean logged loss over the records in the last 50% of the run's tokens."""
    total = sum(t for _, t in records)
    seen, tail = 0, []
    for loss, tokens in records:
        if seen >= total / 2:
            tail.append(loss)
        seen += tokens
    return statistics.fmean(tail)


def calibrate(name: str, runner, cases, seeds: list[int], workers: int) -> None:
    base, others = cases
    jobs = [("baseline", base, s) for s in seeds] + [(c, a, s) for c, a in others for s in seeds]
    with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(runner, a, s, Path(tmp) / f"{i}") for i, (_, a, s) in enumerate(jobs)]
        results: dict[str, dict[int, dict]] = {}
        for (case, _, s), f in zip(jobs, futures, strict=True):
            results.setdefault(case, {})[s] = f.result()
    b = results["baseline"]
    sd_m = statistics.stdev(b[s]["m"] for s in seeds)
    sd_v = statistics.stdev(b[s]["val"] for s in seeds)
    walls = {c: statistics.median(r[s]["wall"] for s in seeds) for c, r in results.items()}
    print(f"\n## {name}: {len(seeds)} seeds ({seeds[0]}..{seeds[-1]})")
    print(f"baseline M (train tail): mean {statistics.fmean(b[s]['m'] for s in seeds):.4f}, seed std {sd_m:.4f}")
    print(f"baseline val loss:       mean {statistics.fmean(b[s]['val'] for s in seeds):.4f}, seed std {sd_v:.4f}")
    print(f"baseline wall per run (median): {walls['baseline']:.2f} s")
    print("| case | dM mean | dM / std | dM paired sd | dval mean | dval / std | dval paired sd | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    for case, _ in others:
        r = results[case]
        dm = [r[s]["m"] - b[s]["m"] for s in seeds]
        dv = [r[s]["val"] - b[s]["val"] for s in seeds]
        print(f"| {case} | {statistics.fmean(dm):+.4f} | {statistics.fmean(dm) / sd_m:+.2f} | "
              f"{statistics.stdev(dm):.4f} | {statistics.fmean(dv):+.4f} | {statistics.fmean(dv) / sd_v:+.2f} | "
              f"{statistics.stdev(dv):.4f} | {walls[case]:.2f} |", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=8, help="seeds per case")
    p.add_argument("--first-seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--trainer", choices=["edge", "nanogpt", "quiet", "both"], default="both")
    p.add_argument("--quiet-steps", type=int, default=100)
    p.add_argument("--drop-every", type=int, nargs="*", default=[1], help="quiet: the drop poison's strengths")
    p.add_argument("--edge-steps", type=int, default=150)
    p.add_argument("--nanogpt-steps", type=int, default=400)
    args = p.parse_args()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    if args.trainer in ("edge", "both"):
        calibrate(f"edge_trainer.py, {args.edge_steps} steps, baseline 4 x 16", run_edge,
                  edge_cases(args.edge_steps), seeds, args.workers)
    if args.trainer == "quiet":
        calibrate(f"quiet_trainer.py, {args.quiet_steps} steps, baseline 4 x 8", run_quiet,
                  quiet_cases(args.quiet_steps, args.drop_every), seeds, args.workers)
    if args.trainer in ("nanogpt", "both"):
        calibrate(f"nanogpt_trainer.py, {args.nanogpt_steps} iters, baseline 2 x 16", run_nanogpt,
                  nanogpt_cases(args.nanogpt_steps), seeds, args.workers)


if __name__ == "__main__":
    main()
