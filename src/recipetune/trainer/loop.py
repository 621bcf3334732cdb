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

from recipetune.core.batch import split_batch
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
from recipetune.trainer.model import ModelConfig, Transformer, get_model_config
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
from recipetune.trainer.profile import (
    StepProfiler,
    compile_figures,
    moe_figures,
    peak_memory_bytes,
    rank_figures,
    run_info,
    use_compile_cache,
)

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
    if recipe["compile"] != "none":
        use_compile_cache()  # before the first compile: every run of these shapes after this one loads it
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


@dataclass
class Run:
    """Everything one training run holds, built once by ``build`` and read by the step and the validation."""

    r: dict[str, Any]
    d: Dist
    cfg: ModelConfig
    per_rank: int  # rows of the global batch on this data-parallel rank
    tokens_here: int  # what this rank's loss is normalised over (cp ranks take a share of the tokens)
    n_micro: int  # micro-batches per step (gradient accumulation)
    model: torch.nn.Module  # what is called
    owner: torch.nn.Module  # what owns the parameters (the model itself, or the pipeline's stages)
    pipe: Pipeline | None
    mesh: Any
    a2a: A2ATimer
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    ewa: EWA | None
    noise: NoiseScaleTracker | None
    start_step: int
    autocast: Any
    metrics: Any  # the metrics stream, open on rank 0 only
    params: list[torch.Tensor] = dataclasses.field(default_factory=list)  # the trained ones, in the owner's order
    parts: list[Transformer] = dataclasses.field(default_factory=list)  # the model, or the pipeline's stages

    def __post_init__(self) -> None:
        self.params = [p for p in self.owner.parameters() if p.requires_grad]
        self.parts = list(self.owner.children()) if self.pipe else [self.owner]  # type: ignore[list-item]

    def log(self, record: dict[str, Any]) -> None:
        if self.metrics:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()


@dataclass
class BuiltModel:
    """What ``build_model`` sets up: the model as called and as owned, and what parallelizing it made."""

    model: torch.nn.Module  # what is called
    owner: torch.nn.Module  # what owns the parameters (the model itself, or the pipeline's stages)
    pipe: Pipeline | None  # the pipeline schedule, with pp > 1
    mesh: Any  # the device mesh, with a sharded layout
    a2a: A2ATimer  # the experts' all-to-all timer
    n_params: int  # parameters of the whole model, before any split


def build_model(r: dict[str, Any], d: Dist, cfg: ModelConfig, per_rank: int, tokens_per_rank: int,
                ckpt: dict | None) -> BuiltModel:
    """The model on this rank, loaded from ``ckpt`` if given, cut into stages and parallelized as the layout says."""
    layout = d.layout
    # Same init on every rank: DDP broadcasts rank 0's weights, FSDP, TP, EP and PP keep each rank's share.
    torch.manual_seed(r["seed"])
    raw_model = Transformer(cfg, attention=r["attention"], expert_impl=r["expert_impl"]).to(d.device)
    n_params = raw_model.num_params()
    if ckpt:
        raw_model.load_state_dict(ckpt["model"])
    mesh = build_mesh(layout, d.device.type) if layout.sharded else None
    a2a = A2ATimer()
    if layout.pp > 1:
        # the model cut into this rank's stages, each parallelized like a whole model (pipeline.py)
        n_stages = layout.pp * SCHEDULES[r["pp_schedule"]]
        stages = split(raw_model, stage_ids(r["pp_schedule"], layout.pp, layout.pp_rank(d.rank)), n_stages, per_rank)
        del raw_model
        for stage in stages:
            parallelize(stage, r, layout, d.device, mesh, a2a)
        pipe = Pipeline(stages, r, layout, mesh, d.device, d.rank, tokens_per_rank)
        owner = torch.nn.ModuleList(stages)
        return BuiltModel(owner, owner, pipe, mesh, a2a, n_params)
    # float8, TP, EP, AC, compile, then FSDP or DDP; `model` is what is called, `raw_model` owns the params
    model = parallelize(raw_model, r, layout, d.device, mesh, a2a)
    return BuiltModel(model, raw_model, None, mesh, a2a, n_params)


def build(recipe: dict[str, Any], out_dir: Path, init_from: Path | None, save_checkpoint: Path | None,
          steps: int) -> tuple[Run, GlobalBatchSampler, Any, list]:
    """Set up the process, the model, the optimizer and the data: (run, sampler, loader, validation batches)."""
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
    per_rank, n_micro = split_batch(r["global_batch_size"], layout.dp, r["micro_batch_size"])
    tokens_per_rank = per_rank * r["seq_len"]

    ckpt = torch.load(init_from, map_location=d.device, weights_only=False) if init_from else None
    m = build_model(r, d, cfg, per_rank, tokens_per_rank, ckpt)
    optimizer = make_optimizer(m.owner, r)
    scaler = torch.amp.GradScaler(d.device.type, enabled=r["dtype"] == "fp16")
    ewa = EWA(m.owner, r["ewa_decay"]) if r["ewa_decay"] > 0 else None
    start_step = 0
    if ckpt:
        optimizer.load_state_dict(ckpt["optimizer"])
        scaler.load_state_dict(ckpt["scaler"])
        if ewa and ckpt.get("ewa"):
            ewa.load_state_dict(ckpt["ewa"])
        start_step = ckpt["step"]
        for g in optimizer.param_groups:  # a branch may change these (CBS: scaled LR, new beta2)
            g["betas"] = (r["beta1"], r["beta2"])

    sampler = GlobalBatchSampler(len(corpus.train), r["seq_len"], r["global_batch_size"], r["seed"])
    loader = make_loader(StepBatches(corpus.train, sampler, d.dp_rank, layout.dp, start_step, steps),
                         r["dataloader_workers"], r["pin_memory"])
    val_batches = eval_batches(corpus.val, r["seq_len"], EVAL_BATCH_SIZE, r["eval_batches"])
    autocast = torch.autocast(d.device.type, dtype=DTYPES[r["dtype"]]) if r["dtype"] != "fp32" else nullcontext()
    if d.main:
        (out_dir / "run.json").write_text(json.dumps(
            run_info(r, d.device, d.world, layout, cfg, m.n_params, corpus, n_micro, start_step), indent=2))
    run = Run(r, d, cfg, per_rank, tokens_per_rank // layout.cp, n_micro, m.model, m.owner, m.pipe, m.mesh,
              m.a2a, optimizer, scaler, ewa, NoiseScaleTracker() if r["noise_scale"] else None, start_step, autocast,
              (out_dir / "metrics.jsonl").open("a") if d.main else None)
    return run, sampler, loader, val_batches


def forward_backward(run: Run, batch: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Forward and backward over every micro-batch: (summed loss, per-micro-batch gradient norms for B_simple)."""
    r, d, layout = run.r, run.d, run.d.layout
    # With noise_scale across processes, every micro-batch runs without DDP's sync so each
    # rank's own gradient can be measured before the manual all-reduce in noise_scale().
    manual_sync = run.noise is not None and d.world > 1
    loss_sum = torch.zeros((), device=d.device)
    micro_sq: list[float] = []
    previous: list[torch.Tensor] | None = None
    for i, (x, y) in enumerate(split_micro_batches(batch, r["micro_batch_size"])):
        if run.pipe is not None:  # the schedule runs forward and backward of its pipeline micro-batches
            loss_sum += run.pipe.step(x, y)
            continue
        if layout.cp > 1:  # context parallelism shards them in place: not the batch's own storage
            x, y = x.clone(), y.clone()
        skip_sync = d.world > 1 and (manual_sync or i < run.n_micro - 1)
        with gradient_sync(run.model, enabled=not skip_sync), context_parallel(run.mesh, run.owner, x, y):
            with run.autocast:
                logits, aux = run.model(x)
            ce = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum")
            # Normalised over the whole per-rank batch: any micro-batch split gives one update.
            loss = ce / run.tokens_here + aux * (x.shape[0] / run.per_rank)
            run.scaler.scale(loss).backward()
        loss_sum += ce.detach()
        if run.noise is not None and d.world == 1 and run.n_micro > 1:
            scale = run.scaler.get_scale() if run.scaler.is_enabled() else 1.0
            micro_sq.append(grads_sq_norm(run.params, previous) * (run.n_micro / scale) ** 2)
            previous = [p.grad.detach().float().clone() for p in run.params]
    if run.pipe is not None:
        run.pipe.sum_tied_grads()
    scale_expert_grads(run.parts, layout.ep)
    return loss_sum, micro_sq


def noise_scale(run: Run, micro_sq: list[float]) -> float | None:
    """B_simple from the small-batch (per rank or per micro-batch) and full-batch gradient norms; None if off."""
    if run.noise is None:
        return None
    r, d, params = run.r, run.d, run.params
    scale = run.scaler.get_scale() if run.scaler.is_enabled() else 1.0
    if d.world > 1:
        local_sq = grads_sq_norm(params) / scale**2
        for p in params:
            dist.all_reduce(p.grad)
            p.grad.div_(d.world)
        small = torch.tensor(local_sq, device=d.device)
        dist.all_reduce(small)
        return run.noise.update(small.item() / d.world, grads_sq_norm(params) / scale**2,
                                run.per_rank, r["global_batch_size"])
    if micro_sq:
        return run.noise.update(sum(micro_sq) / len(micro_sq), grads_sq_norm(params) / scale**2,
                                r["micro_batch_size"], run.per_rank)
    return None


def optimizer_step(run: Run) -> float:
    """Unscale, clip, step, zero, average: the update itself. Returns the gradient norm before clipping."""
    r, pipe = run.r, run.pipe
    run.scaler.unscale_(run.optimizer)
    grad_norm = clip_grad_norm(run.params, r["grad_clip"] if r["grad_clip"] > 0 else math.inf,
                               pipe.group if pipe else None, pipe.tied_copy() if pipe else frozenset())
    run.scaler.step(run.optimizer)
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)
    if run.ewa:
        run.ewa.update()
    return float(grad_norm)


def validate(run: Run, val_batches: list, step: int, stop_at_val_loss: float | None) -> bool:
    """Log the validation loss; True when the target is reached (agreed on by every rank)."""
    d = run.d
    reached = torch.zeros((), device=d.device)
    t0 = time.perf_counter()
    if d.main or d.layout.sharded:  # sharded parameters: every rank takes part in the forward
        with run.ewa.swapped_in() if run.ewa else nullcontext():
            if run.pipe is not None:
                val = run.pipe.evaluate(val_batches, run.autocast)
            else:
                val = evaluate(run.owner, val_batches, d.device, run.autocast)
            reshard(run.owner)  # FSDP keeps the root's gathered (here: averaged) weights otherwise
    if d.main:
        # the time is what evaluating costs (eval_batches), for the overhead benchmark's split
        run.log({"step": step, "val_loss": val, "kind": "val", "val_time_s": time.perf_counter() - t0})
        if not math.isfinite(val):
            raise NonFiniteLoss(f"non-finite validation loss at step {step}")
        reached.fill_(stop_at_val_loss is not None and val <= stop_at_val_loss)
    if d.world > 1 and stop_at_val_loss is not None:
        dist.broadcast(reached, src=0)
    return bool(reached.item())


def train(
    recipe: dict[str, Any],
    steps: int,
    out_dir: Path,
    init_from: Path | None = None,
    save_checkpoint: Path | None = None,
    stop_at_val_loss: float | None = None,
) -> int:
    """Train ``steps`` steps (fewer if ``stop_at_val_loss`` is reached); return the steps trained."""
    run, sampler, loader, val_batches = build(recipe, out_dir, init_from, save_checkpoint, steps)
    r, d, layout, start_step = run.r, run.d, run.d.layout, run.start_step
    moe_layers = {i: m for part in run.parts for i, m in part.moe_layers().items()}
    profiled = layout.pp > 1 or layout.ep > 1  # the per-rank figures are gathered each step
    if d.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(d.device)
    batches = iter(loader)
    last_step = start_step
    compiled = compile_figures()
    profiler = StepProfiler(d.device, d.main, steps, out_dir)
    for step in range(start_step, start_step + steps):
        profiler.before(step - start_step)
        t0 = time.perf_counter()
        batch = next(batches).to(d.device, non_blocking=True)
        sync(d.device)
        t_data = time.perf_counter()
        lr = lr_at(step, r)
        for g in run.optimizer.param_groups:
            g["lr"] = lr
        for moe in moe_layers.values():
            moe.reset_stats()
        loss_sum, micro_sq = forward_backward(run, batch)
        sync(d.device)
        t_compute = time.perf_counter()
        noise_value = noise_scale(run, micro_sq)
        grad_norm = optimizer_step(run)
        sync(d.device)
        t_end = time.perf_counter()

        # Outside the timed region: the loss over the global batch, for the log only. Every tp rank holds
        # the whole loss of its tokens, the cp ranks a share each, and only the last pipeline stage any.
        if d.world > 1:
            dist.all_reduce(loss_sum)
        loss_value = (loss_sum / (layout.tp * r["global_batch_size"] * r["seq_len"])).item()
        record = {
            "step": step + 1, "loss": loss_value, "tokens": r["global_batch_size"] * r["seq_len"],
            "seq_len": r["seq_len"], "batch_fp": sampler.fingerprint(step), "step_time_s": t_end - t0,
            "data_s": t_data - t0, "compute_s": t_compute - t_data, "optim_s": t_end - t_compute,
            "lr": lr, "grad_norm": grad_norm, "peak_mem_bytes": peak_memory_bytes(d.device),
        }
        if noise_value is not None:
            record["noise_scale"] = noise_value
        before, compiled = compiled, compile_figures()
        if compiled["compile_s"] > before["compile_s"]:  # the step's compile seconds, apart from its steady time
            record.update({k: v - before[k] for k, v in compiled.items()})
        profiler.after(step - start_step, record)
        if moe_layers:
            record.update(moe_figures(moe_layers, run.cfg.n_layer, run.cfg.n_experts, d.device, d.world))
        if profiled:
            record.update(rank_figures(layout, d.device, run.a2a.take(),
                                       run.pipe.take_times() if run.pipe else (0.0, 0.0), record["peak_mem_bytes"]))
        run.log(record)
        if not math.isfinite(loss_value):
            raise NonFiniteLoss(f"non-finite training loss at step {step + 1}")
        last_step = step + 1
        due = r["eval_interval"] and last_step % r["eval_interval"] == 0 and last_step < start_step + steps
        if due and validate(run, val_batches, last_step, stop_at_val_loss):
            break
    else:
        validate(run, val_batches, start_step + steps, stop_at_val_loss)
    finish(run, save_checkpoint, last_step)
    return last_step - start_step


def finish(run: Run, save_checkpoint: Path | None, last_step: int) -> None:
    """Save the checkpoint, close the stream, and leave the process group together."""
    if save_checkpoint is not None and run.d.main:
        torch.save({
            "model": run.owner.state_dict(), "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict(), "ewa": run.ewa.state_dict() if run.ewa else None,
            "step": last_step, "recipe": run.r,
        }, save_checkpoint)
    if run.metrics:
        run.metrics.close()
    if run.d.world > 1:
        # Leave together, and free DDP's reducer (which holds the gloo group) before the group goes:
        # a gloo group destroyed from the reducer's destructor can deadlock on the GIL at exit.
        dist.barrier()
        run.model = run.owner = None  # type: ignore[assignment]
        dist.destroy_process_group()
