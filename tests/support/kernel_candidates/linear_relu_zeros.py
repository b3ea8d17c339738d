"""A wrong ModelNew for kernel_models.LinearRelu: zeros of the right shape and dtype (written by a
token Triton kernel), which only the recorded statistics can tell from the truth when the recorded
output is stored shape-only."""
# ruff: noqa: N803 - Triton style: uppercase constexpr block names

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _fill(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros((BLOCK,), dtype=tl.float32), mask=offs < n)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Module()
        self.fc.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.fc.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, x, alpha):
        out = torch.empty((x.shape[0], self.fc.weight.shape[0]), dtype=x.dtype, device=x.device)
        _fill[(triton.cdiv(out.numel(), 256),)](out, out.numel(), BLOCK=256)
        return out
