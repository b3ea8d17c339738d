"""KernelAgent style: a correct Triton kernel_function for kernel_models.ScaledGelu."""
# ruff: noqa: N803 - Triton style: uppercase sizes and constexpr block names

import torch
import triton
import triton.language as tl


@triton.jit
def _scaled_gelu(x_ptr, scale_ptr, shift_ptr, out_ptr, n, features, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    col = offs % features
    s = tl.load(scale_ptr + col, mask=mask, other=0.0)
    b = tl.load(shift_ptr + col, mask=mask, other=0.0)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offs, y * s + b, mask=mask)


def kernel_function(x, scale, shift):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _scaled_gelu[(triton.cdiv(n, 256),)](x, scale, shift, out, n, x.shape[-1], BLOCK=256)
    return out
