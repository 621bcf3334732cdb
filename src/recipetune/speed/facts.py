"""The speed job's facts of a node, for the Researcher: knob values (an outside trainer's under the
reference names their meanings give), the run's profile (step time and its data/compute/optimizer
shares, accumulation, memory headroom, MFU, tokens/s; for the layouts of MoE and pipelined models,
all-to-all time, pipeline bubble, expert load and memory per stage) and the device. The speed
playbook's conditions (speed/playbook.yaml) are written in this vocabulary."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

from recipetune.core.expr import ExprError
from recipetune.engine.researcher import SearchContext
from recipetune.engine.tree import Node

PLAYBOOK = "recipetune.speed:playbook.yaml"
GOAL = "raise training tokens/s per device without changing what the model learns"
PROFILE = ("device", "step_s", "data_share", "compute_share", "optim_share", "accum_steps", "mem_headroom", "mfu",
           "tokens_per_s", "n_devices", "n_experts", "a2a_share", "pp_bubble", "expert_imbalance", "expert_drop",
           "stage_mem_gb", "gpu_busy", "launch_gap_share", "attention_share", "matmul_share", "optimizer_kernel_share",
           "compile_s")
# profile.json of a CUDA run (trainer/profile.py: kernel_summary) -> fact
GPU_PROFILE_FIGURES = {"gpu_busy": "gpu_busy", "launch_gap_share": "launch_gap_share",
                       "attention_share": "attention_share", "matmul_share": "matmul_share",
                       "optimizer_share": "optimizer_kernel_share", "other_share": "other_kernel_share",
                       "kernel_s": "kernel_s"}
# Per-step figures of the reference trainer's metrics stream beyond StepRecord's (trainer/loop.py), averaged
# over the measured steps: name in the stream -> fact
STREAM_FIGURES = {"a2a_s": "a2a_s", "a2a_s_max": "a2a_max_s", "pp_bubble": "pp_bubble",
                  "pp_bubble_max": "pp_bubble_max", "expert_imbalance": "expert_imbalance",
                  "expert_drop": "expert_drop"}



@cache
def device_memory_bytes(device: str) -> int | None:
    """Memory of one device: the smallest GPU's (nvidia-smi), or the machine's RAM for a CPU."""
    if device == "cuda":
        # nvidia-smi rather than torch.cuda: a CUDA context in the campaign process would hold GPU
        # memory for as long as the trials run.
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20, check=True).stdout
            return min(int(float(x)) for x in out.split()) * 2**20  # MiB
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
        try:
            import torch

            return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None
        except Exception:  # no usable GPU here: the fact stays unknown
            return None
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _run_info(node: Node) -> dict[str, Any]:
    if node.result is None or not node.result.out_dir:
        return {}
    try:
        return json.loads((Path(node.result.out_dir) / "run.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def gpu_profile_facts(node: Node) -> dict[str, Any]:
    """Where a GPU step's time went, from the few steps the trainer profiled (profile.json; none on a CPU):
    the share of the step some kernel ran (gpu_busy) and the rest, the device waiting on launches
    (launch_gap_share); attention, matmul and optimizer kernels' seconds as shares of the step."""
    if node.result is None or not node.result.out_dir:
        return {}
    try:
        figures = json.loads((Path(node.result.out_dir) / "profile.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {fact: float(figures[name]) for name, fact in GPU_PROFILE_FIGURES.items() if name in figures}


def stream_facts(node: Node) -> dict[str, Any]:
    """The run's per-rank figures from its metrics stream (``metrics.jsonl``), measured steps only:
    all-to-all seconds per rank (mean and slowest), the pipeline bubble (the share of the schedule's
    time a rank's stages idle, mean and worst), expert load imbalance and drops, peak memory per stage."""
    result = node.result
    if result is None or not result.out_dir:
        return {}
    try:
        lines = (Path(result.out_dir) / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return {}
    steps = []
    for line in lines:
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if "loss" in record:
                steps.append(record)
    measured = steps[result.warmup_steps:] or steps
    facts: dict[str, Any] = {}
    for field, fact in STREAM_FIGURES.items():
        values = [float(s[field]) for s in measured if s.get(field) is not None]
        if values:
            facts[fact] = sum(values) / len(values)
    stages = [s["stage_mem_bytes"] for s in measured if s.get("stage_mem_bytes")]
    if stages:
        per_stage = [max(col) for col in zip(*stages, strict=True)]
        facts["stage_mem_gb"] = max(per_stage) / 2**30
        facts["stage_mem_spread"] = max(per_stage) / max(min(per_stage), 1)
    return facts


def profile_facts(node: Node, context: SearchContext) -> dict[str, Any]:
    """Knob values, baseline values and the figures of the node's run, by name."""
    recipe = node.recipe
    # An outside trainer's knobs count under the reference names their meanings give (meanings.py).
    glossary = context.glossary
    facts: dict[str, Any] = {f"baseline_{k}": v for k, v in context.baseline.items()}
    facts.update({f"baseline_{k}": v for k, v in glossary.facts(context.baseline).items()})
    facts.update(recipe)
    facts.update(glossary.facts(recipe))
    facts.update(speedup=node.score, cpu_count=os.cpu_count() or 1)
    if "nproc" not in facts:
        with contextlib.suppress(ExprError, TypeError, ValueError, KeyError, AttributeError):
            facts["nproc"] = context.workload.n_devices(recipe)  # type: ignore[attr-defined]
    info = _run_info(node)
    env = node.result.environment if node.result else {}
    device = str(info.get("device") or ("cuda" if "gpu" in env and recipe.get("device") != "cpu" else "cpu"))
    facts["device"] = device.split(":")[0]
    accum = info.get("accumulation_steps", facts.get("accum_steps"))
    nproc = int(facts.get("nproc", 1))
    if accum is None and {"global_batch_size", "micro_batch_size"} <= facts.keys():
        accum = max(1, int(facts["global_batch_size"]) // (nproc * int(facts["micro_batch_size"])))
    facts["accum_steps"] = accum
    if "global_batch_size" not in facts and accum is not None and "micro_batch_size" in facts:
        facts["global_batch_size"] = int(facts["micro_batch_size"]) * int(accum) * nproc
    if node.result is None or not node.result.steps:
        return facts
    s = node.result.summary()
    facts["memory_reported"] = s.peak_mem_bytes is not None
    facts.update(tokens_per_s=s.tokens_per_s_per_device, step_s=s.mean_step_time_s, mfu=s.mfu,
                 n_devices=node.result.n_devices, compile_s=s.compile_s)
    facts.update(gpu_profile_facts(node))
    for part in ("data_s", "compute_s", "optim_s"):
        value = s.breakdown_s.get(part)
        facts[part] = value
        if value is not None and s.mean_step_time_s > 0:
            facts[part.replace("_s", "_share")] = value / s.mean_step_time_s
    if info.get("n_experts") is not None:
        facts["n_experts"] = info["n_experts"]
    stream = stream_facts(node)
    facts.update(stream)
    for fact in ("a2a_s", "a2a_max_s"):
        if fact in stream and s.mean_step_time_s > 0:
            facts[fact.replace("_s", "_share")] = stream[fact] / s.mean_step_time_s
    total = device_memory_bytes(facts["device"])
    # a pipeline runs out of memory on its fullest stage, not necessarily rank 0's
    peak = max(s.peak_mem_bytes or 0, int(stream.get("stage_mem_gb", 0) * 2**30)) or s.peak_mem_bytes
    if peak is not None:
        facts["peak_mem_gb"] = peak / 2**30
        if total:
            facts["mem_total_gb"] = total / 2**30
            facts["mem_headroom"] = 1.0 - peak / total
    return facts


# What the Researcher is told of the speed job (engine/researcher.py: SearchContext).
BRIEFING: dict[str, Any] = {"facts": profile_facts, "goal": GOAL, "score_name": "speedup", "profile": PROFILE}
