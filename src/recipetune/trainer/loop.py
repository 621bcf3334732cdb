"""The training loop of the reference trainer, every knob applied for real.

Runs alone (``python -m recipetune.trainer``) or under torchrun (DDP, FSDP2, tensor, expert, context and
pipeline parallelism). Writes one JSON line per step to ``metrics.jsonl`` and says how it ended in
``status.json``, because a launcher like torchrun folds every child failure into exit code 1.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from recipetune.core.measure import environment_fingerprint, peak_flops
from recipetune.core.recipe import KnobError
from recipetune.trainer.data import (
    GlobalBatchSampler,
    StepBatches,
    eval_batches,
    load_corpus,
    make_loader,
    split_micro_batches,
)
from recipetune.trainer.ewa import EWA
from recipetune.trainer.expert_parallel import A2ATimer
from recipetune.trainer.layout import SCHEDULES, Layout
from recipetune.trainer.model import Transformer, flops_per_token, get_model_config
from recipetune.trainer.noise_scale import NoiseScaleTracker
from recipetune.trainer.parallel import (
    build_mesh,
    clip_grad_norm,
    context_parallel,
    gradient_sync,
    parallelize,
    reshard,
    scale_expert_grads,
)
from recipetune.trainer.pipeline import Pipeline, split, stage_ids
from recipetune.trainer.profile import moe_figures, rank_figures

EVAL_BATCH_SIZE = 8
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    layout: Layout

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank(self.rank)


def setup(recipe: dict[str, Any]) -> Dist:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    want = recipe["device"]
    if want == "cuda" and not torch.cuda.is_available():
        raise ValueError("knob 'device': 'cuda' requested but no CUDA device is available")
    use_cuda = want == "cuda" or (want == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    layout = Layout.of(recipe)
    if layout.world != world:
        raise KnobError("nproc", f"the layout {layout.describe()} needs {layout.world} processes, "
                        f"the launcher started {world}")
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    if recipe["num_threads"] > 0:
        torch.set_num_threads(recipe["num_threads"])
    torch.set_float32_matmul_precision(recipe["matmul_precision"])
    return Dist(rank, world, local_rank, device, layout)


def lr_at(step: int, r: dict[str, Any]) -> float:
    """Linear warm-up, then constant or cosine down to ``min_lr_ratio * lr`` at ``lr_decay_steps``."""
    if step < r["warmup_steps"]:
        return r["lr"] * (step + 1) / r["warmup_steps"]
    if r["lr_schedule"] == "constant":
        return r["lr"]
    progress = min(1.0, (step - r["warmup_steps"]) / max(1, r["lr_decay_steps"] - r["warmup_steps"]))
    return r["lr"] * (r["min_lr_ratio"] + (1 - r["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model: torch.nn.Module, r: dict[str, Any]) -> torch.optim.AdamW:
    # No weight decay on norms (the only 1-D parameters), as in nanoGPT and Llama.
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": r["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    impl = r["optimizer_impl"]
    return torch.optim.AdamW(
        groups, lr=r["lr"], betas=(r["beta1"], r["beta2"]),
        foreach=impl == "foreach", fused=True if impl == "fused" else None,
    )


def compute_dtype(r: dict[str, Any]) -> str:
    """The dtype the matmuls run in, whose peak MFU is measured against (autocast or FSDP's policy)."""
    if r["dtype"] != "fp32":
        return r["dtype"]
    return "bf16" if r["fsdp_param_dtype"] == "bf16" or r["float8"] != "none" else "fp32"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def grads_sq_norm(params: list[torch.Tensor], minus: list[torch.Tensor] | None = None) -> float:
    grads = [p.grad.float() for p in params]
    if minus is not None:
        grads = torch._foreach_sub(grads, minus)
    return float(sum(g.pow(2).sum() for g in grads))


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list, device: torch.device, autocast) -> float:
    model.eval()
    total, count = 0.0, 0
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with autocast:
            logits, _ = model(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train()
    return total / count


def train(
    recipe: dict[str, Any],
    steps: int,
    out_dir: Path,
    init_from: Path | None = None,
    save_checkpoint: Path | None = None,
    stop_at_val_loss: float | None = None,
) -> int:
    """Train ``steps`` steps (fewer if ``stop_at_val_loss`` is reached); return the steps trained."""
    r = recipe
    d = setup(r)
    out_dir.mkdir(parents=True, exist_ok=True)

    corpus = load_corpus(str(r["data"]))
    cfg = dataclasses.replace(get_model_config(r["model"], vocab_size=corpus.vocab_size), max_seq_len=r["seq_len"],
                              capacity_factor=r["capacity_factor"])
    layout = d.layout
    if layout.sharded and (init_from or save_checkpoint):
        knob = next(k for k in ("dp_shard", "tp", "pp", "cp", "ep") if getattr(layout, k) > 1)
        raise KnobError(knob, "checkpoints (--init-from, --save-checkpoint) are only written and read with "
                              "dp_shard=1, tp=1, pp=1, cp=1 and ep=1 (plain or DDP runs)")
    # The batch is split over the data-parallel ranks; the pp, cp and tp ranks of one data-parallel rank
    # share it (cp ranks each take a share of its sequences' tokens).
    dp = layout.dp
    per_rank = r["global_batch_size"] // dp
    tokens_per_rank = per_rank * r["seq_len"]
    tokens_here = tokens_per_rank // layout.cp  # what this rank's loss is normalised over
    n_micro = per_rank // r["micro_batch_size"]

    # Same init on every rank: DDP broadcasts rank 0's weights, FSDP, TP, EP and PP keep each rank's share.
    torch.manual_seed(r["seed"])
    raw_model = Transformer(cfg, attention=r["attention"], expert_impl=r["expert_impl"]).to(d.device)
    n_params = raw_model.num_params()
    ckpt = torch.load(init_from, map_location=d.device, weights_only=False) if init_from else None
    if ckpt:
        raw_model.load_state_dict(ckpt["model"])
    mesh = build_mesh(layout, d.device.type) if layout.sharded else None
    a2a = A2ATimer()
    pipe: Pipeline | None = None
    if layout.pp > 1:
        # the model cut into this rank's stages, each parallelized like a whole model (pipeline.py)
        n_stages = layout.pp * SCHEDULES[r["pp_schedule"]]
        stages = split(raw_model, stage_ids(r["pp_schedule"], layout.pp, layout.pp_rank(d.rank)), n_stages, per_rank)
        del raw_model
        for stage in stages:
            parallelize(stage, r, layout, d.device, mesh, a2a)
        pipe = Pipeline(stages, r, layout, mesh, d.device, d.rank, tokens_per_rank)
        owner: torch.nn.Module = torch.nn.ModuleList(stages)
        model = owner
    else:
        # float8, TP, EP, AC, compile, then FSDP or DDP; `model` is what is called, `owner` owns the params
        owner = raw_model
        model = parallelize(raw_model, r, layout, d.device, mesh, a2a)
    optimizer = make_optimizer(owner, r)
    scaler = torch.amp.GradScaler(d.device.type, enabled=r["dtype"] == "fp16")
    ewa = EWA(owner, r["ewa_decay"]) if r["ewa_decay"] > 0 else None
    noise = NoiseScaleTracker() if r["noise_scale"] else None

    start_step = 0
    if ckpt:
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        if ewa and ckpt.get("ewa"):
            ewa.load_state_dict(ckpt["ewa"])
        start_step = ckpt["step"]
        for g in optimizer.param_groups:  # a branch may change these (CBS: scaled LR, new beta2)
            g["betas"] = (r["beta1"], r["beta2"])
    params = [p for p in owner.parameters() if p.requires_grad]
    parts: list[Transformer] = list(owner.children()) if pipe else [owner]  # type: ignore[list-item]
    moe_layers = {i: m for part in parts for i, m in part.moe_layers().items()}
    profiled = layout.pp > 1 or layout.ep > 1  # the per-rank figures are gathered each step

    sampler = GlobalBatchSampler(len(corpus.train), r["seq_len"], r["global_batch_size"], r["seed"])
    loader = make_loader(
        StepBatches(corpus.train, sampler, d.dp_rank, dp, start_step, steps),
        r["dataloader_workers"], r["pin_memory"],
    )
    val_batches = eval_batches(corpus.val, r["seq_len"], EVAL_BATCH_SIZE, r["eval_batches"])
    autocast = (
        torch.autocast(d.device.type, dtype=DTYPES[r["dtype"]]) if r["dtype"] != "fp32" else nullcontext()
    )

    metrics = (out_dir / "metrics.jsonl").open("a") if d.main else None
    if d.main:
        device_name = torch.cuda.get_device_name(d.device) if d.device.type == "cuda" else "cpu"
        (out_dir / "run.json").write_text(json.dumps({
            "n_devices": d.world,
            "layout": layout.describe(),
            "degrees": dataclasses.asdict(layout),
            "device": str(d.device),
            "device_name": device_name,
            "flops_per_token": flops_per_token(cfg, r["seq_len"]),
            "peak_flops_per_device": peak_flops(d.device.type, device_name, compute_dtype(r), torch.get_num_threads()),
            "params": n_params,
            "n_layer": cfg.n_layer,
            "n_experts": cfg.n_experts,
            "corpus": {"name": corpus.name, "fingerprint": corpus.fingerprint, "vocab_size": corpus.vocab_size},
            "accumulation_steps": n_micro,
            "start_step": start_step,
            "environment": environment_fingerprint(),
        }, indent=2))

    def log(record: dict[str, Any]) -> None:
        if metrics:
            metrics.write(json.dumps(record) + "\n")
            metrics.flush()

    def validate(step: int) -> bool:
        """Log the validation loss; True when the target is reached (agreed on by every rank)."""
        reached = torch.zeros((), device=d.device)
        t0 = time.perf_counter()
        if d.main or layout.sharded:  # sharded parameters: every rank takes part in the forward
            with ewa.swapped_in() if ewa else nullcontext():
                if pipe is not None:
                    val = pipe.evaluate(val_batches, autocast)
                else:
                    val = evaluate(owner, val_batches, d.device, autocast)
                reshard(owner)  # FSDP keeps the root's gathered (here: averaged) weights otherwise
        if d.main:
            # the time is what evaluating costs (eval_batches), for the overhead benchmark's split
            log({"step": step, "val_loss": val, "kind": "val", "val_time_s": time.perf_counter() - t0})
            if not math.isfinite(val):
                raise NonFiniteLoss(f"non-finite validation loss at step {step}")
            reached.fill_(stop_at_val_loss is not None and val <= stop_at_val_loss)
        if d.world > 1 and stop_at_val_loss is not None:
            dist.broadcast(reached, src=0)
        return bool(reached.item())

    if d.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(d.device)
    batches = iter(loader)
    last_step = start_step
    for step in range(start_step, start_step + steps):
        t0 = time.perf_counter()
        batch = next(batches).to(d.device, non_blocking=True)
        sync(d.device)
        t_data = time.perf_counter()

        lr = lr_at(step, r)
        for g in optimizer.param_groups:
            g["lr"] = lr
        for moe in moe_layers.values():
            moe.reset_stats()
        # With noise_scale across processes, every micro-batch runs without DDP's sync so each
        # rank's own gradient can be measured before the manual all-reduce below.
        manual_sync = noise is not None and d.world > 1
        loss_sum = torch.zeros((), device=d.device)
        micro_sq: list[float] = []
        previous: list[torch.Tensor] | None = None
        for i, (x, y) in enumerate(split_micro_batches(batch, r["micro_batch_size"])):
            if pipe is not None:  # the schedule runs forward and backward of its pipeline micro-batches
                loss_sum += pipe.step(x, y)
                continue
            if layout.cp > 1:  # context parallelism shards them in place: not the batch's own storage
                x, y = x.clone(), y.clone()
            skip_sync = d.world > 1 and (manual_sync or i < n_micro - 1)
            with gradient_sync(model, enabled=not skip_sync), context_parallel(mesh, owner, x, y):
                with autocast:
                    logits, aux = model(x)
                ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
                # Normalised over the whole per-rank batch: any micro-batch split gives one update.
                loss = ce / tokens_here + aux * (x.shape[0] / per_rank)
                scaler.scale(loss).backward()
            loss_sum += ce.detach()
            if noise is not None and d.world == 1 and n_micro > 1:
                scale = scaler.get_scale() if scaler.is_enabled() else 1.0
                micro_sq.append(grads_sq_norm(params, previous) * (n_micro / scale) ** 2)
                previous = [p.grad.detach().float().clone() for p in params]
        if pipe is not None:
            pipe.sum_tied_grads()
        scale_expert_grads(parts, layout.ep)
        sync(d.device)
        t_compute = time.perf_counter()

        noise_value = None
        if noise is not None:
            scale = scaler.get_scale() if scaler.is_enabled() else 1.0
            if d.world > 1:
                local_sq = grads_sq_norm(params) / scale**2
                for p in params:
                    dist.all_reduce(p.grad)
                    p.grad.div_(d.world)
                small = torch.tensor(local_sq, device=d.device)
                dist.all_reduce(small)
                noise_value = noise.update(small.item() / d.world, grads_sq_norm(params) / scale**2,
                                           per_rank, r["global_batch_size"])
            elif micro_sq:
                noise_value = noise.update(sum(micro_sq) / len(micro_sq), grads_sq_norm(params) / scale**2,
                                           r["micro_batch_size"], per_rank)
        scaler.unscale_(optimizer)
        grad_norm = clip_grad_norm(params, r["grad_clip"] if r["grad_clip"] > 0 else math.inf,
                                   pipe.group if pipe else None, pipe.tied_copy() if pipe else frozenset())
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if ewa:
            ewa.update()
        sync(d.device)
        t_end = time.perf_counter()

        # Outside the timed region: the loss over the global batch, for the log only. Every tp rank holds
        # the whole loss of its tokens, the cp ranks a share each, and only the last pipeline stage any.
        if d.world > 1:
            dist.all_reduce(loss_sum)
        loss_value = (loss_sum / (layout.tp * r["global_batch_size"] * r["seq_len"])).item()
        record = {
            "step": step + 1,
            "loss": loss_value,
            "tokens": r["global_batch_size"] * r["seq_len"],
            "seq_len": r["seq_len"],
            "batch_fp": sampler.fingerprint(step),
            "step_time_s": t_end - t0,
            "data_s": t_data - t0,
            "compute_s": t_compute - t_data,
            "optim_s": t_end - t_compute,
            "lr": lr,
            "grad_norm": float(grad_norm),
            "peak_mem_bytes": peak_memory_bytes(d.device),
        }
        if noise_value is not None:
            record["noise_scale"] = noise_value
        if moe_layers:
            record.update(moe_figures(moe_layers, cfg.n_layer, cfg.n_experts, d.device, d.world))
        if profiled:
            record.update(rank_figures(layout, d.device, a2a.take(), pipe.take_times() if pipe else (0.0, 0.0),
                                       record["peak_mem_bytes"]))
        log(record)
        if not math.isfinite(loss_value):
            raise NonFiniteLoss(f"non-finite training loss at step {step + 1}")
        last_step = step + 1
        due = r["eval_interval"] and last_step % r["eval_interval"] == 0 and last_step < start_step + steps
        if due and validate(last_step):
            break
    else:
        validate(start_step + steps)
    if save_checkpoint is not None and d.main:
        torch.save({
            "model": owner.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(), "ewa": ewa.state_dict() if ewa else None,
            "step": last_step, "recipe": r,
        }, save_checkpoint)
    if metrics:
        metrics.close()
    if d.world > 1:
        # Leave together, and free DDP's reducer (which holds the gloo group) before the group goes:
        # a gloo group destroyed from the reducer's destructor can deadlock on the GIL at exit.
        dist.barrier()
        del model
        dist.destroy_process_group()
    return last_step - start_step


def peak_memory_bytes(device: torch.device) -> int:
    """Peak allocated memory on a GPU; on CPU the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
