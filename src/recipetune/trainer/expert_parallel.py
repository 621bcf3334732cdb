"""Expert parallelism: each MoE layer's experts sharded over the ``ep`` ranks, tokens sent to them by all-to-all.

The model sorts a rank's routed tokens by expert and calls ``MoE.experts(x, counts)`` (model.py). Here that
module becomes a torchtitan-style ``ExpertParallel`` module: its stacked weights are DTensors sharded
over the experts on the ``ep`` mesh (rank i holds experts ``i * E/ep .. (i+1) * E/ep - 1``), the call is
preceded by the dispatch (an all-to-all of the counts, then of the tokens, which arrive grouped by source
rank and are regrouped by local expert) and followed by the combine (the inverse permutation and the
inverse all-to-all). Both all-to-alls are autograd functions, so the backward sends the gradients back
the same way. Every all-to-all is timed (``A2ATimer``): the per-rank seconds the metrics stream reports.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle


class A2ATimer:
    """Seconds this rank spent in all-to-all since the last ``take()`` (forward, backward and recomputation).

    On a GPU the collective runs on its own stream: the device is synchronised around it so that the
    time is the collective's (with its wait for the slowest peer), at the cost of that overlap.
    """

    def __init__(self) -> None:
        self.seconds = 0.0

    def run(self, fn: Any, device: torch.device) -> Any:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.seconds += time.perf_counter() - t0
        return out

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


def _all_to_all(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup,
                timer: A2ATimer) -> torch.Tensor:
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    timer.run(lambda: dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group), x.device)
    return out


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with row splits; its backward is the inverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, out_splits: list[int], in_splits: list[int],  # type: ignore[override]
                group: dist.ProcessGroup, timer: A2ATimer) -> torch.Tensor:
        ctx.splits, ctx.group, ctx.timer = (out_splits, in_splits), group, timer
        return _all_to_all(x, out_splits, in_splits, group, timer)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group, ctx.timer), None, None, None, None


class ExpertParallel(ParallelStyle):
    """Shard an ``Experts`` module over a 1-D ``ep`` mesh and route tokens to their experts' ranks.

    The dispatch keeps what the combine needs (splits, permutation) on the style until the module's
    output comes back; a module's forward runs its input and output hooks back to back, so two calls
    (micro-batches, a recomputation) never interleave.
    """

    def __init__(self, timer: A2ATimer) -> None:
        super().__init__()
        self.timer = timer
        self._pending: tuple[torch.Tensor, list[int], list[int]] | None = None

    def _partition(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for pname, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(distribute_tensor(p, mesh, [Shard(0)])))

    def _dispatch(self, module: nn.Module, inputs: tuple[torch.Tensor, torch.Tensor], mesh: DeviceMesh) -> tuple:
        x, counts = inputs  # x sorted by global expert, counts [E]
        ep, group = mesh.size(), mesh.get_group()
        # counts[e] for the experts of rank j go to rank j; recv[i, le]: tokens rank i sends local expert le
        recv = torch.empty_like(counts)
        self.timer.run(lambda: dist.all_to_all_single(recv, counts, group=group), counts.device)
        recv = recv.view(ep, -1)
        in_splits = counts.view(ep, -1).sum(1).tolist()
        out_splits = recv.sum(1).tolist()
        x = _AllToAll.apply(x, out_splits, in_splits, group, self.timer)
        # arrived grouped (source rank, local expert); the experts want (local expert, source rank)
        n_local = recv.shape[1]
        segment = torch.repeat_interleave(torch.arange(recv.numel(), device=x.device), recv.flatten(),
                                          output_size=x.shape[0])
        key = (segment % n_local) * ep + segment // n_local
        order = torch.argsort(key, stable=True)
        self._pending = (order, in_splits, out_splits)
        return x.index_select(0, order), recv.sum(0)

    def _combine(self, module: nn.Module, y: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
        assert self._pending is not None, "combine without a dispatch"
        order, in_splits, out_splits = self._pending
        self._pending = None
        y = torch.empty_like(y).index_copy(0, order, y)  # back to (source rank, local expert)
        return _AllToAll.apply(y, in_splits, out_splits, mesh.get_group(), self.timer)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, partition_fn=self._partition,
                                 input_fn=self._dispatch, output_fn=self._combine)
