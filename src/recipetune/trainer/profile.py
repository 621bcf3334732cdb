"""What a run records about itself beyond the loss: run.json, memory, and the figures of MoE and parallel layouts.

``run_info``: run.json, what the run ran on and the figures its throughput is read against (FLOPs, peak).
``moe_figures``: the router's load over the global batch. ``rank_figures``: per-rank seconds in all-to-all,
the pipeline bubble and peak memory per stage. The analyst reads them (speed/facts.py); the fields are
listed in docs/parallel.md, "The metrics stream of these layouts". ``StepProfiler``: on a GPU, where a few
steps' time goes (kernel time by kind, the device idle between launches), in profile.json.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from recipetune.core.measure import (
    MFU_CONVENTION,
    compile_cache_dir,
    environment_fingerprint,
    matmul_dtype,
    peak_flops,
    peak_source,
)
from recipetune.trainer.layout import Layout
from recipetune.trainer.model import ModelConfig, MoE, flops_per_token


def compute_dtype(r: dict[str, Any]) -> str:
    """The dtype the matmuls run in, whose peak MFU is measured against (autocast, FSDP's policy, TF32)."""
    if r["dtype"] == "fp32" and (r["fsdp_param_dtype"] == "bf16" or r["float8"] != "none"):
        return "bf16"  # float8 is counted against the bf16 peak: its gain shows as MFU above the bf16 run's
    return matmul_dtype(r["dtype"], r["matmul_precision"])


def run_info(r: dict[str, Any], device: torch.device, world: int, layout: Layout, cfg: ModelConfig, n_params: int,
             corpus: Any, n_micro: int, start_step: int) -> dict[str, Any]:
    """run.json: what the run ran on and the figures its throughput is read against (FLOPs, peak)."""
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {
        "n_devices": world,
        "layout": layout.describe(),
        "degrees": dataclasses.asdict(layout),
        "device": str(device),
        "device_name": device_name,
        "flops_per_token": flops_per_token(cfg, r["seq_len"]),
        "peak_flops_per_device": peak_flops(device.type, device_name, compute_dtype(r), torch.get_num_threads()),
        "mfu_convention": {"flops": MFU_CONVENTION, "matmul_dtype": compute_dtype(r),
                           "peak_source": peak_source(device.type, device_name)},
        "params": n_params,
        "n_layer": cfg.n_layer,
        "n_experts": cfg.n_experts,
        "corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "vocab_size": corpus.vocab_size},
        "accumulation_steps": n_micro,
        "compile_cache": str(compile_cache_dir()) if r["compile"] != "none" else None,
        "start_step": start_step,
        "environment": environment_fingerprint(),
    }


# torch.compile's own timers (torch._dynamo.utils.compilation_time_metrics): tracing and inductor for the
# forward, and the backward graph that AOT autograd compiles lazily, at the first backward.
COMPILE_TIMERS = ("_compile.compile_inner", "compile_fx.<locals>.bw_compiler")


def use_compile_cache() -> Path:
    """Turn on inductor's FX-graph and AOT-autograd caches in the shared folder, so shapes compiled once (by a
    trial, a guard run, an earlier campaign) are loaded, not compiled again. Returns the folder."""
    folder = compile_cache_dir()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)  # read when inductor first writes or reads its cache
    import torch._functorch.config
    import torch._inductor.config

    torch._inductor.config.fx_graph_cache = True
    with contextlib.suppress(AttributeError):  # a PyTorch without AOT autograd's cache keeps the FX-graph one
        torch._functorch.config.enable_autograd_cache = True
    return folder


def compile_figures() -> dict[str, float]:
    """Seconds compiled so far in this process, and the FX-graph cache's hits and misses (a step's share is
    the difference of two readings)."""
    if "torch._dynamo" not in sys.modules:  # nothing was compiled: do not import dynamo to say so
        return {"compile_s": 0.0, "compile_cache_hits": 0.0, "compile_cache_misses": 0.0}
    from torch._dynamo.utils import compilation_time_metrics, counters

    return {"compile_s": sum(sum(compilation_time_metrics.get(k, ())) for k in COMPILE_TIMERS),
            "compile_cache_hits": float(counters["inductor"]["fxgraph_cache_hit"]),
            "compile_cache_misses": float(counters["inductor"]["fxgraph_cache_miss"])}


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory on a GPU; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def moe_figures(layers: dict[int, MoE], n_layer: int, n_experts: int, device: torch.device,
                world: int) -> dict[str, float]:
    """The router's load over the whole global batch: slots per expert, before and after capacity drops.

    ``expert_imbalance``: the busiest expert's routing slots over the mean, in the worst layer (1.0 =
    balanced); ``expert_drop``: the share of routing slots dropped by the capacity factor.
    """
    counts = torch.zeros(n_layer, 2, n_experts, dtype=torch.float64, device=device)
    for i, moe in layers.items():
        if moe.stats is not None:
            counts[i] = moe.stats
    if world > 1:  # each rank counted its own tokens (and each pipeline stage its own layers)
        dist.all_reduce(counts)
    routed, kept = counts[:, 0], counts[:, 1]
    used = routed.sum(-1) > 0
    imbalance = (routed.max(-1).values / routed.mean(-1))[used]
    return {"expert_imbalance": float(imbalance.max()) if len(imbalance) else 1.0,
            "expert_drop": float(1 - kept.sum() / routed.sum()) if routed.sum() > 0 else 0.0}


def rank_figures(layout: Layout, device: torch.device, a2a_s: float, pipe_times: tuple[float, float],
                 peak_mem_bytes: int) -> dict[str, Any]:
    """Per-rank figures gathered to rank 0: all-to-all seconds, pipeline bubble, peak memory per stage."""
    busy, wall = pipe_times
    mine = torch.tensor([a2a_s, busy, wall, float(peak_mem_bytes)], dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(layout.world)]
    dist.all_gather(every, mine)
    table = torch.stack(every)
    out: dict[str, Any] = {}
    if layout.ep > 1:
        out.update(a2a_s=float(table[:, 0].mean()), a2a_s_max=float(table[:, 0].max()))
    if layout.pp > 1:
        bubble = 1 - table[:, 1] / table[:, 2].clamp(min=1e-9)
        stage_of = torch.tensor([layout.pp_rank(r) for r in range(layout.world)], device=device)
        out.update(pp_bubble=float(bubble.mean()), pp_bubble_max=float(bubble.max()),
                   stage_mem_bytes=[int(table[stage_of == s, 3].max()) for s in range(layout.pp)])
    return out


# ---------------------------------------------------------------------------------------------
# Where a GPU step's time goes: torch.profiler over a few steps of a CUDA run, summed up for the analyst.

PROFILED_STEPS = 3  # few: the profiler's own CPU cost slows the steps it records, which throughput then leaves out
# Kernel kinds by name, first match wins. Math attention's QK^T and AV are batched GEMMs and count as matmul
# (its softmax and masking count as attention); a for-loop optimizer's kernels are plain elementwise ones and
# count as other (its share is read from the Optimizer.step range instead).
KERNEL_KINDS = (
    ("attention", re.compile(r"flash|fmha|attention|attn|softmax|sdpa", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|cutlass|cublas|nvjet|wgmma|xmma|matmul|splitk|sm\d+_|ampere_|hopper_", re.IGNORECASE)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach", re.IGNORECASE)),
)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval (kernels of several streams overlap)."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def kernel_summary(kernels: list[tuple[str, float, float]], optimizer_s: float, wall_s: float,
                   steps: int) -> dict[str, float]:
    """The figures the analyst reads (speed/facts.py), from the device's events over ``steps`` profiled steps.

    kernels: (name, start_s, end_s) of every kernel and copy on the device; optimizer_s: device seconds under
    the optimizer's step; wall_s: the steps' wall time. ``gpu_busy``: the share of wall time some kernel ran;
    ``launch_gap_share``: the rest, when the device waited for the CPU to launch work; ``<kind>_share``: a
    kind's kernel seconds over the wall time; ``kernel_s``: kernel seconds per step.
    """
    if wall_s <= 0 or steps < 1:
        return {}
    busy = min(1.0, busy_seconds([(a, b) for _, a, b in kernels]) / wall_s)
    by_kind = dict.fromkeys(["matmul", "attention", "optimizer", "other"], 0.0)
    for name, a, b in kernels:
        by_kind[kernel_kind(name)] += b - a
    by_kind["optimizer"] = max(by_kind["optimizer"], optimizer_s)  # a for-loop step's kernels hide in "other"
    figures = {"gpu_busy": busy, "launch_gap_share": 1.0 - busy, "kernel_s": sum(b - a for _, a, b in kernels) / steps,
               "profiled_steps": float(steps)}
    figures.update({f"{kind}_share": seconds / wall_s for kind, seconds in by_kind.items()})
    return figures


class StepProfiler:
    """torch.profiler over the last PROFILED_STEPS steps of a CUDA run on rank 0, written to profile.json.

    Nothing happens on a CPU, on other ranks, or in a run too short to leave steady steps before the window.
    The profiled steps are marked in the metrics stream (``profiled``) and left out of throughput.
    """

    def __init__(self, device: torch.device, main: bool, steps: int, out_dir: Path) -> None:
        on = device.type == "cuda" and main and steps >= 4 * PROFILED_STEPS
        self.window = range(steps - PROFILED_STEPS, steps) if on else range(0)
        self.out, self.prof, self.wall_s = out_dir / "profile.json", None, 0.0

    def before(self, k: int) -> None:
        if self.window and k == self.window.start:
            from torch.profiler import ProfilerActivity, profile

            self.prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            self.prof.__enter__()

    def after(self, k: int, record: dict[str, Any]) -> None:
        if self.prof is None:
            return
        record["profiled"] = True
        self.wall_s += record["step_time_s"]
        if k == self.window[-1]:
            self.prof.__exit__(None, None, None)
            events = self.prof.events()
            self.prof = None
            from torch.autograd import DeviceType

            # the device's kernels and copies; a record_function range is mirrored on the device as an annotation
            kernels = [(e.name, e.time_range.start / 1e6, e.time_range.end / 1e6) for e in events
                       if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)]
            optimizer_s = sum(getattr(e, "device_time_total", 0.0) for e in events
                              if e.device_type == DeviceType.CPU and e.name.startswith("Optimizer.step")) / 1e6
            self.out.write_text(json.dumps(kernel_summary(kernels, optimizer_s, self.wall_s, len(self.window)),
                                           indent=2))
