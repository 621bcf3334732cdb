"""The maths of a layer's SwiGLU experts over tokens sorted by expert, three ways (the ``expert_impl`` knob).

Each function takes ``x`` [N, d], its rows sorted by expert (``counts[e]`` rows for expert e), and the stacked
weights w1, w3 [E, hidden, d], w2 [E, d, hidden]; it returns each row through its expert, [N, d]. All three
compute the same maths; they differ in how many kernels they launch and how much work they do:

- ``loop``: one pair of matmuls per expert in a Python loop (E launches per matmul, no wasted work);
- ``padded`` (the knob's "grouped"): every group scattered into [E, width, d], width the largest group, and
  three batched matmuls: three launches, but E * width rows of work, ``expert_imbalance`` times the real
  work, which an imbalanced router makes slower than the loop (docs/benchmarks.md, "MoE experts without padding");
- ``segmented``: no padding. In bf16, where torch has it, one grouped GEMM (``torch._grouped_mm``) per
  matmul over the groups' offsets: CUTLASS kernels on CUDA compute capability >= 9.0, torch's own loop of
  matmuls elsewhere. Otherwise (fp32, fp16, an older torch) the loop's matmuls, which are already one per
  segment: ``_grouped_mm`` checks its operands are bf16 under torch.compile, and autocast does not cast them.

An expert with no token keeps its weights in the graph (a zero gradient) in every version: DDP expects a
gradient for every parameter on every rank.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def experts_loop(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                 w2: torch.Tensor) -> torch.Tensor:
    # an expert with no tokens still runs (on an empty batch): its weights stay in the graph
    out = [(F.silu(xe @ w1[e].T) * (xe @ w3[e].T)) @ w2[e].T for e, xe in enumerate(x.split(counts.tolist()))]
    return torch.cat(out)


def experts_padded(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                   w2: torch.Tensor) -> torch.Tensor:
    # scatter the groups into [E, width, d] (zero rows pad the smaller groups), three bmm
    sizes = counts.tolist()
    n, width = len(sizes), max(sizes, default=0)
    starts = torch.cumsum(counts, 0) - counts
    expert = torch.repeat_interleave(torch.arange(n, device=x.device), counts, output_size=x.shape[0])
    slot = expert * width + torch.arange(x.shape[0], device=x.device) - starts[expert]
    # sizes spelled out, not -1: with expert parallelism a rank's experts may receive no token at all
    # (width 0), and a view of 0 elements cannot infer a dimension
    d = x.shape[1]
    padded = x.new_zeros(n * width, d).index_copy(0, slot, x).view(n, width, d)
    h = F.silu(torch.bmm(padded, w1.transpose(1, 2))) * torch.bmm(padded, w3.transpose(1, 2))
    return torch.bmm(h, w2.transpose(1, 2)).view(n * width, d).index_select(0, slot)


def _bf16_compute(x: torch.Tensor) -> bool:
    """Whether this call computes in bf16: bf16 inputs (FSDP2's bf16 policy), or autocast to bf16."""
    if x.dtype == torch.bfloat16:
        return True
    kind = x.device.type
    return torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) == torch.bfloat16


def grouped_mm_applies(x: torch.Tensor, w1: torch.Tensor) -> bool:
    """Whether ``experts_segmented`` takes torch._grouped_mm here: torch has it (2.8+), the compute is bf16,
    and the rows are 16-byte aligned (d and hidden multiples of 8 bf16 values, as its CUDA kernel needs)."""
    return (hasattr(torch, "_grouped_mm") and _bf16_compute(x)
            and x.shape[1] % 8 == 0 and w1.shape[1] % 8 == 0)


def experts_grouped_mm(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                       w2: torch.Tensor) -> torch.Tensor:
    """Three grouped GEMMs over the unpadded groups: ``offs`` holds each group's end row (int32)."""
    # autocast does not cast _grouped_mm's operands: cast here, as autocast would for a linear layer
    dt = torch.bfloat16 if _bf16_compute(x) else x.dtype
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xb = x.to(dt)
    a = torch._grouped_mm(xb, w1.to(dt).transpose(1, 2), offs=offs)
    b = torch._grouped_mm(xb, w3.to(dt).transpose(1, 2), offs=offs)
    return _ContiguousGrad.apply(torch._grouped_mm(F.silu(a) * b, w2.to(dt).transpose(1, 2), offs=offs))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: _grouped_mm's backward (torch 2.13)
    refuses an expanded one (strides 0, as ``out.sum().backward()`` sends)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad.contiguous()


def experts_segmented(x: torch.Tensor, counts: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                      w2: torch.Tensor, grouped_mm: bool | None = None) -> torch.Tensor:
    """No padding: a grouped GEMM where it applies, else one pair of matmuls per segment (the loop's).

    ``grouped_mm`` None decides by ``grouped_mm_applies``; True forces torch._grouped_mm (in eager mode it
    also takes fp32 on CPU: the tests compare it with the loop at fp32 precision)."""
    use = grouped_mm_applies(x, w1) if grouped_mm is None else grouped_mm
    # no row at all (an expert-parallel rank whose experts got no token): _grouped_mm's backward refuses
    # the empty operands' strides in torch 2.13, and the loop's empty matmuls cost nothing
    use = use and x.shape[0] > 0
    return experts_grouped_mm(x, counts, w1, w3, w2) if use else experts_loop(x, counts, w1, w3, w2)


IMPLS = {"loop": experts_loop, "grouped": experts_padded, "segmented": experts_segmented}
