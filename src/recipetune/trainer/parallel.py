"""How the model is executed, kept apart from what it computes (torchtitan style).

Each function takes a built Transformer and changes how it runs: activation checkpointing (in place),
torch.compile and DDP (returned wrappers). Apply them in that order: checkpointing, compile, DDP.
"""

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from recipetune.trainer.model import MoE, Transformer

AC_MODES = ("none", "selective", "full")
COMPILE_MODES = ("off", "default", "max-autotune")


class CheckpointedBlock(nn.Module):
    """Stores only the block's input and recomputes its activations during backward.

    The state_dict hooks drop the extra "block." level from the keys, so a checkpoint saved with
    activation checkpointing on loads into a model without it, and the other way round.
    """

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block
        self.register_state_dict_post_hook(_strip_block_prefix)
        self.register_load_state_dict_pre_hook(_add_block_prefix)

    def forward(self, *args: torch.Tensor) -> Any:
        # non-reentrant: works with outputs that need no grad (the dense aux loss) and with DDP
        return checkpoint(self.block, *args, use_reentrant=False)


def _strip_block_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix + "block.")]:
        state_dict[prefix + key[len(prefix + "block.") :]] = state_dict.pop(key)


def _add_block_prefix(module: nn.Module, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(prefix + "block.")]:
        state_dict[prefix + "block." + key[len(prefix) :]] = state_dict.pop(key)


def apply_activation_checkpointing(model: Transformer, mode: str) -> None:
    """Trade compute for memory: "full" recomputes every block in backward, "selective" every other one.

    Idempotent and reversible: blocks are unwrapped first, so "none" undoes an earlier call.
    """
    if mode not in AC_MODES:
        raise ValueError(f"activation checkpointing mode must be one of {AC_MODES}, got {mode!r}")
    for i, layer in enumerate(model.layers):
        block = layer.block if isinstance(layer, CheckpointedBlock) else layer
        wrap = mode == "full" or (mode == "selective" and i % 2 == 0)
        model.layers[i] = CheckpointedBlock(block) if wrap else block


def apply_compile(model: nn.Module, mode: str) -> nn.Module:
    """torch.compile the whole model; "default" is torch's default mode (mode=None).

    Returns a wrapper and leaves `model` eager: keep using the unwrapped model for state_dict (the
    wrapper's keys carry an "_orig_mod." prefix) and wherever eager execution is wanted.
    """
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    if mode == "off":
        return model
    return torch.compile(model, mode=None if mode == "default" else mode)


def wrap_ddp(
    model: nn.Module, device: torch.device | str, bucket_cap_mb: float, gradient_as_bucket_view: bool
) -> nn.Module:
    """DistributedDataParallel when running under torch.distributed with world size > 1, else the model."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return model
    device = torch.device(device)
    device_ids = None
    if device.type == "cuda":
        device_ids = [device.index if device.index is not None else torch.cuda.current_device()]
    # MoE experts run even on zero tokens (see MoE.forward), so every param gets a grad; this is a
    # safety net against a hang should a future router skip experts, at the cost of a graph walk per step
    moe = any(isinstance(m, MoE) for m in model.modules())
    return DistributedDataParallel(
        model,
        device_ids=device_ids,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=gradient_as_bucket_view,
        find_unused_parameters=moe,
    )
