"""A wrong ModelNew for stress.verdict_rows.NanOut: zeros where NaN was recorded."""
# ruff: noqa: N803 - Triton style: uppercase constexpr block names

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _fill(out_ptr, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32) + value, mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.lin = nn.Module()
        self.lin.weight = nn.Parameter(torch.empty(n, n))
        self.lin.bias = nn.Parameter(torch.empty(n))

    def forward(self, x):
        out = torch.empty((x.shape[0], self.lin.weight.shape[0]), dtype=x.dtype, device=x.device)
        _fill[(triton.cdiv(out.numel(), 256),)](out, out.numel(), 0.0, BLOCK=256)
        return out
