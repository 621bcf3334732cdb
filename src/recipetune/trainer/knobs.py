"""The knobs of the reference trainer: one table, read by the trainer and by its workload."""

from __future__ import annotations

from recipetune.core.batch import batch_problem
from recipetune.core.recipe import INVARIANT, SEMANTIC, SPEED, Knob, KnobSet


def reference_knobs() -> KnobSet:
    from recipetune.trainer.presets import PRESETS

    return KnobSet([
        # What the experiment is. Never changes within a campaign.
        Knob("model", "tiny", INVARIANT, choices=tuple(PRESETS), help="model preset"),
        Knob("data", "stdlib", INVARIANT, help="'stdlib', a text file or folder, a .bin file or folder"),
        Knob("seq_len", 128, INVARIANT, low=8, high=131072, integer=True),
        Knob("seed", 0, INVARIANT, low=0, high=2**31 - 1, integer=True),
        # The maths of the update. Changing one changes what is learned.
        Knob("global_batch_size", 16, SEMANTIC, low=1, high=2**24, integer=True,
             help="sequences per optimizer step, across all processes"),
        Knob("lr", 3e-3, SEMANTIC, low=0.0, high=1e9),
        Knob("lr_schedule", "cosine", SEMANTIC, choices=("cosine", "constant")),
        Knob("warmup_steps", 10, SEMANTIC, low=0, high=10**7, integer=True),
        Knob("lr_decay_steps", 1000, SEMANTIC, low=1, high=10**8, integer=True,
             help="cosine horizon; runs may stop earlier"),
        Knob("min_lr_ratio", 0.1, SEMANTIC, low=0.0, high=1.0),
        Knob("weight_decay", 0.1, SEMANTIC, low=0.0, high=10.0),
        Knob("beta1", 0.9, SEMANTIC, low=0.0, high=1.0),
        Knob("beta2", 0.95, SEMANTIC, low=0.0, high=1.0),
        Knob("grad_clip", 1.0, SEMANTIC, low=0.0, high=1e6, help="0 turns clipping off"),
        Knob("ewa_decay", 0.0, SEMANTIC, low=0.0, high=1.0,
             help="exponential weight averaging; 0 = off, validation on the averaged weights otherwise"),
        Knob("capacity_factor", 0.0, SEMANTIC, low=0.0, high=1024.0,
             help="MoE: routing slots an expert takes per sequence, over its fair share T * top_k / n_experts; "
                  "slots beyond it are dropped (changes learning); 0 = no limit"),
        # How fast the same maths runs.
        Knob("micro_batch_size", 16, SPEED, low=1, high=2**20, integer=True,
             help="sequences per forward/backward per process; accumulation makes up the global batch"),
        Knob("dtype", "fp32", SPEED, choices=("fp32", "bf16", "fp16"),
             help="autocast precision; fp16 uses a gradient scaler"),
        Knob("compile", "none", SPEED, choices=("none", "model", "regional"),
             renamed=(("off", "none"), ("default", "model")),
             help="torch.compile the whole model, or each block on its own (regional: faster to compile)"),
        Knob("compile_mode", "default", SPEED, choices=("default", "max-autotune", "reduce-overhead"),
             help="torch.compile's mode when compile is on (the old compile=max-autotune)"),
        Knob("activation_checkpointing", "none", SPEED, choices=("none", "selective", "full"),
             help="recompute blocks in backward: every block (full) or every other block (selective)"),
        Knob("optimizer_impl", "for-loop", SPEED, choices=("for-loop", "foreach", "fused")),
        Knob("attention", "sdpa", SPEED, choices=("sdpa", "math")),
        Knob("matmul_precision", "highest", SPEED, choices=("highest", "high", "medium")),
        Knob("num_threads", 0, SPEED, low=0, high=1024, integer=True, help="0 = PyTorch's default"),
        Knob("dataloader_workers", 0, SPEED, low=0, high=64, integer=True),
        Knob("pin_memory", False, SPEED, choices=(False, True)),
        Knob("nproc", 1, SPEED, low=1, high=4096, integer=True,
             help="processes (torchrun), split as pp * dp_replicate * dp_shard * cp * tp"),
        # The parallel layout (trainer/layout.py, parallel.py): pp * dp_replicate * dp_shard * cp * tp == nproc.
        Knob("dp_shard", 1, SPEED, low=1, high=4096, integer=True,
             help="FSDP2 degree: parameters, gradients and optimizer state sharded over this many processes"),
        Knob("dp_replicate", 0, SPEED, low=0, high=4096, integer=True,
             help="replicated data parallelism (DDP; HSDP with dp_shard > 1); 0 = whatever nproc leaves"),
        Knob("tp", 1, SPEED, low=1, high=4096, integer=True,
             help="tensor-parallel degree over attention heads and MLP units; divides n_head and n_kv_head"),
        Knob("pp", 1, SPEED, low=1, high=4096, integer=True,
             help="pipeline-parallel degree (torch.distributed.pipelining): the blocks split into stages"),
        Knob("pp_schedule", "1F1B", SPEED, choices=("GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble",
                                                    "ZBVZeroBubble"),
             help="pipeline schedule; the interleaved and zero-bubble ones hold 2 stages per rank"),
        Knob("pp_microbatches", 1, SPEED, low=1, high=4096, integer=True,
             help="pipeline micro-batches each micro-batch is split into (at least pp; 1 without pp)"),
        Knob("cp", 1, SPEED, low=1, high=4096, integer=True,
             help="context-parallel degree: the sequence split over ranks, ring attention (dense models, CUDA)"),
        Knob("ep", 1, SPEED, low=1, high=4096, integer=True,
             help="expert-parallel degree (MoE): experts split over this many of the dp_shard ranks, all-to-all"),
        Knob("expert_impl", "loop", SPEED, choices=("loop", "grouped", "segmented"),
             help="MoE experts: a Python loop of matmuls per expert; grouped: batched matmuls over every "
                  "expert's tokens padded to the busiest's; segmented: no padding, grouped GEMMs in bf16 "
                  "(torch._grouped_mm), the loop's matmuls otherwise"),
        Knob("sequence_parallel", False, SPEED, choices=(False, True),
             help="with tp > 1: norms and residual stream split over the sequence"),
        Knob("reshard_after_forward", True, SPEED, choices=(True, False),
             help="FSDP2: free gathered parameters after forward (less memory, one more all-gather)"),
        Knob("fsdp_param_dtype", "fp32", SEMANTIC, choices=("fp32", "bf16"),
             help="FSDP2 mixed precision: the dtype blocks compute in (fp32 master weights stay sharded)"),
        Knob("fsdp_reduce_dtype", "fp32", SEMANTIC, choices=("fp32", "bf16"),
             help="FSDP2 mixed precision: the dtype gradients are reduced in"),
        Knob("float8", "none", SEMANTIC, choices=("none", "tensorwise", "rowwise"),
             help="torchao float8 linear layers (CUDA, compute capability >= 8.9)"),
        Knob("ddp_bucket_cap_mb", 25, SPEED, low=1, high=4096, integer=True),
        Knob("gradient_as_bucket_view", False, SPEED, choices=(False, True)),
        Knob("device", "auto", SPEED, choices=("auto", "cpu", "cuda")),
        # Measurement only.
        Knob("eval_interval", 0, SPEED, low=0, high=10**8, integer=True, help="0 = validate at the end only"),
        Knob("eval_batches", 4, SPEED, low=1, high=10**5, integer=True),
        Knob("noise_scale", False, SPEED, choices=(False, True), help="estimate the gradient noise scale"),
    ])


def check_recipe(recipe: dict) -> list[str]:
    """Relations between knobs that the domains alone cannot express."""
    from recipetune.trainer.layout import Layout, check_layout
    from recipetune.trainer.presets import PRESETS

    problems = []
    gbs, mbs, nproc = recipe["global_batch_size"], recipe["micro_batch_size"], recipe["nproc"]
    layout_problems = check_layout(recipe, PRESETS.get(recipe["model"]))
    # the batch is split over the data-parallel ranks (pp, cp and tp ranks share theirs)
    layout = Layout.of(recipe)
    dp = layout.dp if layout.world == nproc else nproc
    shared = " * ".join(f"{k}={recipe[k]}" for k in ("pp", "cp", "tp") if recipe.get(k, 1) > 1)
    by = f"nproc={nproc}" if dp == nproc else f"the data-parallel degree {dp} (nproc={nproc} / {shared})"
    problem = batch_problem(gbs, dp, mbs, by)
    if problem:
        problems.append(problem)
    return problems + layout_problems
