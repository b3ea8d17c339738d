"""A cheat: runs the reference class itself and copies its result with a token Triton kernel."""
# ruff: noqa: N803 - Triton style: uppercase sizes and constexpr block names

import torch
import triton
import triton.language as tl
from kernel_models import ScaledGelu


@triton.jit
def _copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


def kernel_function(x, scale, shift):
    module = ScaledGelu(x.shape[-1])
    with torch.no_grad():
        module.scale.copy_(scale)
        module.shift.copy_(shift)
    y = module(x)
    out = torch.empty_like(y)
    _copy[(triton.cdiv(y.numel(), 256),)](y, out, y.numel(), BLOCK=256)
    return out
