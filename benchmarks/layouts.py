"""Tokens/s, peak memory, loss parity and per-rank profile of each parallel layout of the reference trainer.

    python benchmarks/layouts.py --presets tiny small --nproc 2 --steps 20 --repeats 2
    python benchmarks/layouts.py --suite moe --presets tiny-moe --nproc 2 --steps 16 --repeats 2
    python benchmarks/layouts.py --suite moe --presets moe-8x --device cuda --json OUT.json   # gpu_check.sh

Every layout of ``--nproc`` processes trains the same global batch for the same steps; a single process
gives the reference loss curve. The dense suite: DDP, FSDP2 with and without resharding, TP, TP with
sequence parallelism, and on CUDA context and pipeline parallelism. The moe suite: the experts' loop
against batched matmuls, FSDP2 with and without expert parallelism, pipeline schedules; its table adds
the profile the analyst reads (all-to-all share of the step, pipeline bubble, expert load imbalance,
memory per stage). Layouts that need more devices than there are GPUs are left out, and say so. Layouts
run in rotation, ``--repeats`` times, so that load from other users of the machine hits all alike;
speeds are reported as medians and as ratios to the first multi-process layout within the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from recipetune.core.measure import RunResult
from recipetune.trainer.presets import PRESETS
from recipetune.workloads.reference import ReferenceWorkload

SHAPES = {  # per preset: sequence length, global batch, micro-batch (per data-parallel rank)
    "nano": (64, 16, 8),
    "tiny": (128, 16, 8),
    "small": (256, 8, 4),
    "nano-moe": (64, 16, 8),
    "tiny-moe": (128, 16, 8),
    "gpt2-124m": (1024, 16, 8),
    "moe-8x": (1024, 16, 4),
}
# The learning rate of the presets a GPU runs: the knob's default (3e-3) is the tiny presets'. On an H200
# (2026-12-04) the 1.2B-parameter moe-8x at 3e-3 left the loop and the grouped experts 1.1 nats apart by
# step 7 (TF32 rounding grown through a loss spike at step 3), at 3e-4 0.05. The spike itself stays at
# either rate (Adam's first steps over a 5-step warm-up), and so does a layer whose router sends its
# tokens to 2 of the 8 experts (expert imbalance 4.00), which the grouped experts pay for in padding.
LR = {"gpt2-124m": 6e-4, "moe-8x": 3e-4}


def dense_layouts(nproc: int, cuda: bool) -> dict[str, dict]:
    out = {
        "1 process (reference)": {"nproc": 1},
        f"DDP x{nproc}": {"nproc": nproc},
        f"FSDP2 x{nproc}": {"nproc": nproc, "dp_shard": nproc},
        f"FSDP2 x{nproc}, no reshard": {"nproc": nproc, "dp_shard": nproc, "reshard_after_forward": False},
        f"TP x{nproc}": {"nproc": nproc, "tp": nproc},
        f"TP x{nproc} + SP": {"nproc": nproc, "tp": nproc, "sequence_parallel": True},
    }
    if cuda:  # context parallelism needs the CUDA SDPA kernels (docs/parallel.md)
        out[f"CP x{nproc}"] = {"nproc": nproc, "cp": nproc}
        out[f"PP x{nproc} 1F1B"] = {"nproc": nproc, "pp": nproc, "pp_microbatches": 2 * nproc}
    return out


def moe_layouts(nproc: int, n_layer: int) -> dict[str, dict]:
    out = {
        "1 process, experts in a loop (reference)": {"nproc": 1},
        "1 process, grouped experts": {"nproc": 1, "expert_impl": "grouped"},
        f"FSDP2 x{nproc}, grouped": {"nproc": nproc, "dp_shard": nproc, "expert_impl": "grouped"},
        f"FSDP2 x{nproc}, experts over ep={nproc}, loop": {"nproc": nproc, "dp_shard": nproc, "ep": nproc},
        f"FSDP2 x{nproc}, experts over ep={nproc}, grouped": {"nproc": nproc, "dp_shard": nproc, "ep": nproc,
                                                            "expert_impl": "grouped"},
    }
    for micro in (nproc, 2 * nproc):
        out[f"PP x{nproc} 1F1B, {micro} micro-batches, grouped"] = {
            "nproc": nproc, "pp": nproc, "pp_microbatches": micro, "expert_impl": "grouped"}
    if n_layer % (2 * nproc) == 0:
        for schedule in ("Interleaved1F1B", "ZBVZeroBubble"):
            out[f"PP x{nproc} {schedule}, {2 * nproc} micro-batches, grouped"] = {
                "nproc": nproc, "pp": nproc, "pp_schedule": schedule, "pp_microbatches": 2 * nproc,
                "expert_impl": "grouped"}
    return out


def profile(run: RunResult) -> dict[str, float]:
    """The per-rank figures of the run's metrics stream, averaged over its measured steps (speed/facts.py)."""
    lines = [json.loads(x) for x in (Path(run.out_dir) / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "loss" in x][run.warmup_steps:]
    out: dict[str, float] = {}
    for field in ("a2a_s", "a2a_s_max", "pp_bubble", "pp_bubble_max", "expert_imbalance", "expert_drop",
                  "step_time_s"):
        values = [x[field] for x in steps if field in x]
        if values:
            out[field] = sum(values) / len(values)
    stages = [x["stage_mem_bytes"] for x in steps if "stage_mem_bytes" in x]
    if stages:
        out["stage_mem_mib"] = [max(col) / 2**20 for col in zip(*stages, strict=True)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=("dense", "moe"), default="dense")
    parser.add_argument("--presets", nargs="+", default=None, choices=list(SHAPES))
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--json", type=Path, help="also write every figure here (gpu_check.sh reads it)")
    parser.add_argument("--check", action="store_true",
                        help="only resolve and check every layout's recipe, run nothing (gpu_check.sh --dry-run)")
    args = parser.parse_args()
    presets = args.presets or (["tiny", "small"] if args.suite == "dense" else ["tiny-moe"])
    cuda = args.device == "cuda"
    gpus = _gpu_count() if cuda else 0

    w = ReferenceWorkload()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    tables, figures, skipped = [], {}, []
    with tempfile.TemporaryDirectory() as tmp:
        for preset in presets:
            seq, gbs, mbs = SHAPES[preset]
            base = {"model": preset, "seq_len": seq, "global_batch_size": gbs, "warmup_steps": 5,
                    "eval_batches": 1, "device": args.device, **({"lr": LR[preset]} if preset in LR else {})}
            # fp32 (TF32 matmuls on a GPU) for every layout: a pipeline schedule takes no autocast (layout.py)
            base.update({"matmul_precision": "high"} if cuda else {"num_threads": 1})
            candidates = (moe_layouts(args.nproc, PRESETS[preset].n_layer) if args.suite == "moe"
                          else dense_layouts(args.nproc, cuda))
            recipes = {}
            for name, knobs in candidates.items():
                if cuda and knobs["nproc"] > gpus and not args.check:
                    skipped.append(f"{preset} {name}: needs {knobs['nproc']} GPUs, {gpus} here")
                    continue
                dp = knobs["nproc"] // (knobs.get("tp", 1) * knobs.get("pp", 1) * knobs.get("cp", 1))
                recipe = w.resolve({**base, "micro_batch_size": min(mbs, gbs // dp), **knobs})
                problems = w.check(recipe)
                if problems:
                    raise SystemExit(f"{preset} {name}: {'; '.join(problems)}")
                recipes[name] = recipe
            if args.check:
                print(f"{preset}: {len(recipes)} layouts check: {', '.join(recipes)}")
                continue
            results: dict[str, list[RunResult]] = {n: [] for n in recipes}
            for rep in range(args.repeats):
                for name, recipe in recipes.items():
                    r = w.run(recipe, args.steps, Path(tmp) / f"{preset}-{rep}-{recipe.id}", timeout_s=1800)
                    if not r.ok:
                        raise SystemExit(f"{preset} {name}: {r.status} {r.cause}\n{r.stderr_tail[-2000:]}")
                    results[name].append(r)
                    print(f"  {preset} {name} #{rep}: {r.summary().tokens_per_s:,.0f} tokens/s", flush=True)
            tables.append(table(preset, seq, gbs, results))
            figures[preset] = {name: figure(runs) for name, runs in results.items()}
            print("\n" + tables[-1] + "\n", flush=True)  # as soon as a preset is done
    if args.check:
        return
    env = r.environment
    where = (str(env.get("gpu")) if cuda
             else f"{env.get('cpu')} ({env.get('cpu_count')} cores, shared), 1 thread per process")
    print(f"\n{started}: {where}, torch {env.get('torch')}, {args.steps} steps ({r.warmup_steps} warm-up excluded), "
          f"median of {args.repeats} rotations\n")
    print("\n\n".join(tables))
    for line in skipped:
        print(f"left out: {line}")
    if args.json:
        args.json.write_text(json.dumps({"date": started, "environment": env, "steps": args.steps,
                                         "repeats": args.repeats, "figures": figures, "skipped": skipped}, indent=2))


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def figure(runs: list[RunResult]) -> dict:
    return {"tokens_per_s": statistics.median(x.summary().tokens_per_s for x in runs),
            "peak_mem_mib": max(x.summary().peak_mem_bytes or 0 for x in runs) / 2**20,
            "losses": runs[0].losses(), "profile": profile(runs[0])}


def table(preset: str, seq: int, gbs: int, results: dict[str, list[RunResult]]) -> str:
    names = list(results)
    ref = results[names[0]][0].losses()  # the single process comes first
    multi = next((n for n in names if results[n][0].n_devices > 1), names[0])
    base = statistics.median(x.summary().tokens_per_s for x in results[multi])
    moe = any("expert_imbalance" in profile(runs[0]) for runs in results.values())
    rows = [f"**{preset}** ({results[names[0]][0].summary().measured_steps} measured steps, "
            f"global batch {gbs} x {seq} tokens)", ""]
    head = ["layout", "tokens/s", f"vs {multi}", "peak memory / process", "max loss difference vs 1 process"]
    extra = ["all-to-all share (mean / slowest rank)", "pipeline bubble (mean / worst rank)", "memory per stage"]
    if moe:
        extra.append("expert imbalance")
    rows += ["| " + " | ".join(head + extra) + " |", "|---|" + "---:|" * (len(head) + len(extra) - 1)]
    for name, runs in results.items():
        tps = statistics.median(x.summary().tokens_per_s for x in runs)
        mem = max(x.summary().peak_mem_bytes or 0 for x in runs) / 2**20
        diff = max(max(abs(a - b) for a, b in zip(x.losses(), ref, strict=True)) for x in runs)
        p = profile(runs[0])
        step = p.get("step_time_s") or 1.0
        a2a = f"{p['a2a_s'] / step:.0%} / {p['a2a_s_max'] / step:.0%}" if "a2a_s" in p else ""
        bubble = f"{p['pp_bubble']:.0%} / {p['pp_bubble_max']:.0%}" if "pp_bubble" in p else ""
        stages = " / ".join(f"{m:,.0f}" for m in p["stage_mem_mib"]) + " MiB" if "stage_mem_mib" in p else ""
        cells = [name, f"{tps:,.0f}", f"{tps / base:.2f}", f"{mem:,.0f} MiB", f"{diff:.1e}", a2a, bubble, stages]
        if moe:
            cells.append(f"{p['expert_imbalance']:.2f}" if "expert_imbalance" in p else "")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
