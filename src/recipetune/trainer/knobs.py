"""The knobs of the reference trainer: one table, read by the trainer and by its workload."""

from __future__ import annotations

from recipetune.recipe import INVARIANT, SEMANTIC, SPEED, Knob, KnobSet


def reference_knobs() -> KnobSet:
    from recipetune.trainer.model import PRESETS

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
        # How fast the same maths runs.
        Knob("micro_batch_size", 16, SPEED, low=1, high=2**20, integer=True,
             help="sequences per forward/backward per process; accumulation makes up the global batch"),
        Knob("dtype", "fp32", SPEED, choices=("fp32", "bf16", "fp16"),
             help="autocast precision; fp16 uses a gradient scaler"),
        Knob("compile", "off", SPEED, choices=("off", "default", "max-autotune")),
        Knob("activation_checkpointing", "none", SPEED, choices=("none", "selective", "full")),
        Knob("optimizer_impl", "for-loop", SPEED, choices=("for-loop", "foreach", "fused")),
        Knob("attention", "sdpa", SPEED, choices=("sdpa", "math")),
        Knob("matmul_precision", "highest", SPEED, choices=("highest", "high", "medium")),
        Knob("num_threads", 0, SPEED, low=0, high=1024, integer=True, help="0 = PyTorch's default"),
        Knob("dataloader_workers", 0, SPEED, low=0, high=64, integer=True),
        Knob("pin_memory", False, SPEED, choices=(False, True)),
        Knob("nproc", 1, SPEED, low=1, high=4096, integer=True, help="data-parallel processes (torchrun)"),
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
    problems = []
    gbs, mbs, nproc = recipe["global_batch_size"], recipe["micro_batch_size"], recipe["nproc"]
    if gbs % nproc:
        problems.append(f"global_batch_size={gbs} is not divisible by nproc={nproc}")
    elif (gbs // nproc) % mbs:
        problems.append(
            f"micro_batch_size={mbs} does not divide the per-process batch {gbs // nproc} "
            f"(global_batch_size={gbs} / nproc={nproc})"
        )
    return problems
