"""The MoE experts' three implementations (trainer/moe_kernels.py) at a fixed expert imbalance: speed and equality.

    python benchmarks/moe_kernels.py --preset tiny-moe --imbalance 1 4 --dtypes fp32 bf16           # CPU
    python benchmarks/moe_kernels.py --preset moe-8x --device cuda --json OUT.json                  # gpu_check.sh
    python benchmarks/moe_kernels.py --preset moe-8x --device cuda --train 8 --json OUT.json        # + the trainer

One expert layer's forward and backward (``loop``, ``grouped``: padded bmm, ``segmented``: no padding, with
torch._grouped_mm in bf16) on the slots one micro-batch routes (``--tokens``; default the micro-batch of
benchmarks/layouts.py times its sequence times top-k). Imbalance r sends every slot to E / r of the E experts,
equally (r = 4 with 8 experts: 2 of them, the H200's moe-8x layer of 2026-12-04); the others get none.
bf16 is autocast over fp32 weights, as the trainer runs ``dtype=bf16``; fp32 on CUDA uses TF32 matmuls.
Each figure is the median of ``--iters`` timed calls after ``--warmup`` (the device synchronised around each);
the implementations run in rotation, the order reversed every other round, so that drift and
the order hit all alike. Equality: each output and gradient against
the loop's, as the largest difference over the largest magnitude of the loop's.

``--train STEPS`` also runs the trainer (1 process, ``dtype=bf16``) with each implementation on the preset:
tokens/s, the loss curve and the expert imbalance the router measured, the end-to-end check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from recipetune.trainer.moe_kernels import IMPLS, grouped_mm_applies
from recipetune.trainer.presets import PRESETS

LAYOUT_SHAPES = {"tiny-moe": (128, 8), "nano-moe": (64, 8), "moe-8x": (1024, 4)}  # seq, micro-batch (layouts.py)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def routing(n_experts: int, slots: int, imbalance: float) -> list[int]:
    """Slots per expert: E / imbalance experts share them equally, the rest get none (busiest / mean = r)."""
    hot = round(n_experts / imbalance)
    if hot < 1 or abs(n_experts / hot - imbalance) > 1e-9:
        raise SystemExit(f"--imbalance {imbalance}: must be n_experts ({n_experts}) over a whole number of experts")
    counts = [slots // hot] * hot + [0] * (n_experts - hot)
    counts[0] += slots - sum(counts)
    return counts


def call(impl: str, x: torch.Tensor, counts: torch.Tensor, ws: list[torch.Tensor], grad: torch.Tensor,
         dtype: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One forward and backward; returns the output and the gradients (x, w1, w3, w2)."""
    for t in (x, *ws):
        t.grad = None
    bf16 = torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=dtype == "bf16")
    with bf16:
        out = IMPLS[impl](x, counts, *ws)
    out.backward(grad.to(out.dtype))
    return out.detach(), [t.grad for t in (x, *ws)]


def measure(impls: list[str], x, counts, ws, grad, dtype: str, warmup: int, iters: int) -> dict[str, dict]:
    sync = torch.cuda.synchronize if x.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {i: [] for i in impls}
    peak: dict[str, int] = {}
    ref = call("loop", x, counts, ws, grad, dtype)
    errors = {}
    for impl in impls:
        out, grads = call(impl, x, counts, ws, grad, dtype)
        errors[impl] = max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30))
                           for a, b in zip([out, *grads], [ref[0], *ref[1]], strict=True))
    for _ in range(warmup):
        for impl in impls:
            call(impl, x, counts, ws, grad, dtype)
    for it in range(iters):
        for impl in impls if it % 2 == 0 else impls[::-1]:  # each goes first as often as last
            if x.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            call(impl, x, counts, ws, grad, dtype)
            sync()
            times[impl].append(time.perf_counter() - t0)
            if x.device.type == "cuda":
                peak[impl] = max(peak.get(impl, 0), torch.cuda.max_memory_allocated())
    out = {}
    for impl in impls:
        s = statistics.median(times[impl])
        out[impl] = {"ms": s * 1e3, "slots_per_s": x.shape[0] / s, "max_rel_error_vs_loop": errors[impl],
                     "peak_mem_mib": peak[impl] / 2**20 if impl in peak else None}
    return out


def train(preset: str, device: str, steps: int) -> dict[str, dict]:
    """The trainer with each implementation, 1 process, bf16: tokens/s, losses, the measured imbalance."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from layouts import LR, SHAPES, profile

    from recipetune.workloads.reference import ReferenceWorkload

    w = ReferenceWorkload()
    seq, gbs, mbs = SHAPES[preset]
    base = {"model": preset, "seq_len": seq, "global_batch_size": gbs, "micro_batch_size": mbs, "warmup_steps": 5,
            "eval_batches": 1, "device": device, "dtype": "bf16", **({"lr": LR[preset]} if preset in LR else {})}
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for impl in IMPLS:
            r = w.run(w.resolve({**base, "expert_impl": impl}), steps, Path(tmp) / impl, timeout_s=1800)
            if not r.ok:
                raise SystemExit(f"{preset} expert_impl={impl}: {r.status} {r.cause}\n{r.stderr_tail[-2000:]}")
            out[impl] = {"tokens_per_s": r.summary().tokens_per_s, "peak_mem_mib": (r.summary().peak_mem_bytes or 0)
                         / 2**20, "losses": r.losses(), "profile": profile(r)}
            print(f"  train {preset} {impl}: {out[impl]['tokens_per_s']:,.0f} tokens/s, "
                  f"imbalance {out[impl]['profile'].get('expert_imbalance', float('nan')):.2f}", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=list(LAYOUT_SHAPES), default="tiny-moe")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--imbalance", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--dtypes", nargs="+", choices=list(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--tokens", type=int, help="routing slots per call (default: one layouts.py micro-batch)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (the shared CPU's fair share)")
    parser.add_argument("--train", type=int, default=0, metavar="STEPS", help="also run the trainer per impl")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--check", action="store_true", help="only check the arguments, run nothing (--dry-run)")
    args = parser.parse_args()
    cfg = PRESETS[args.preset]
    seq, micro = LAYOUT_SHAPES[args.preset]
    slots = args.tokens or seq * micro * cfg.top_k
    plan = {r: routing(cfg.n_experts, slots, r) for r in args.imbalance}  # refuses an impossible imbalance
    if args.check:
        print(f"{args.preset}: {len(args.dtypes)} dtypes x {len(plan)} routings x {len(IMPLS)} implementations, "
              f"{slots} slots" + (f"; then the trainer, {args.train} steps per implementation" if args.train else ""))
        return
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    else:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 as layouts.py runs it (matmul_precision=high)
    g = torch.Generator().manual_seed(0)
    shapes = [(cfg.n_experts, cfg.ffn_hidden, cfg.d_model)] * 2 + [(cfg.n_experts, cfg.d_model, cfg.ffn_hidden)]
    ws = [(torch.randn(s, generator=g) * cfg.init_std).to(device).requires_grad_() for s in shapes]
    x = torch.randn(slots, cfg.d_model, generator=g).to(device).requires_grad_()
    grad = torch.randn(slots, cfg.d_model, generator=g).to(device)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    print(f"{started}: {args.preset} experts ({cfg.n_experts} x SwiGLU {cfg.d_model}->{cfg.ffn_hidden}), {slots} "
          f"routing slots a call, {where}, torch {torch.__version__}; median of {args.iters} forward+backward\n")
    print("| dtype | imbalance | slots per expert | implementation | ms | slots/s | vs loop | max rel. error vs loop "
          "| peak memory |\n|---|---:|---|---|---:|---:|---:|---:|---:|")
    figures = []
    for dtype in args.dtypes:
        for r, counts in plan.items():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
                gmm = grouped_mm_applies(x, ws[0])
            res = measure(list(IMPLS), x, torch.tensor(counts, device=device), ws, grad, dtype, args.warmup,
                          args.iters)
            for impl, f in res.items():
                name = f"segmented ({'torch._grouped_mm' if gmm else 'loop matmuls'})" if impl == "segmented" else impl
                mem = f"{f['peak_mem_mib']:,.0f} MiB" if f["peak_mem_mib"] is not None else ""
                print(f"| {dtype} | {r:g} | {'/'.join(map(str, counts))} | {name} | {f['ms']:.2f} | "
                      f"{f['slots_per_s']:,.0f} | {res['loop']['ms'] / f['ms']:.2f}x | "
                      f"{f['max_rel_error_vs_loop']:.1e} | {mem} |", flush=True)
                figures.append({"dtype": dtype, "imbalance": r, "counts": counts, "impl": impl,
                                "grouped_mm": gmm and impl == "segmented", **f})
    trained = train(args.preset, args.device, args.train) if args.train else None
    if args.json:
        args.json.write_text(json.dumps({"date": started, "device": where, "torch": torch.__version__,
                                         "preset": args.preset, "slots": slots, "iters": args.iters,
                                         "kernels": figures, "train": trained}, indent=2))


if __name__ == "__main__":
    main()
