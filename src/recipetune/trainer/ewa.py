"""Exponential weight averaging (EWA), the stand-in for learning-rate decay in CBS runs.

``w_avg <- t * w_avg + (1 - t) * theta`` after every optimizer step, starting from zero, and
evaluated with Adam-style bias correction ``w_avg / (1 - t**step)``: without it the average of a
short run would be pulled towards zero.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


class EWA:
    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"ewa decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.step = 0
        self.params = [p for p in model.parameters() if p.requires_grad]
        # fp32 shadow copies: the average of many small updates is lost in low precision.
        self.avg = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]

    @torch.no_grad()
    def update(self) -> None:
        self.step += 1
        torch._foreach_mul_(self.avg, self.decay)
        torch._foreach_add_(self.avg, [p.float() for p in self.params], alpha=1.0 - self.decay)

    def averaged(self) -> list[torch.Tensor]:
        correction = 1.0 - self.decay**self.step
        return [a / correction for a in self.avg]

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """Evaluate under the averaged weights; the training weights come back afterwards."""
        if self.step == 0:
            yield
            return
        with torch.no_grad():
            saved = [p.detach().clone() for p in self.params]
            _copy_all(self.params, self.averaged())
        try:
            yield
        finally:
            with torch.no_grad():
                _copy_all(self.params, saved)

    def state_dict(self) -> dict:
        return {"decay": self.decay, "step": self.step, "avg": self.avg}

    def load_state_dict(self, state: dict) -> None:
        self.decay, self.step = state["decay"], state["step"]
        for a, s in zip(self.avg, state["avg"], strict=True):
            a.copy_(s)


def _copy_all(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
    # one copy per tensor: DTensor parameters (FSDP, tensor parallelism) have no _foreach_copy_
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)
