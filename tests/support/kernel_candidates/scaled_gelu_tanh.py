"""Subtly wrong: the tanh approximation of GELU (about 4e-4 off the exact erf GELU)."""
# ruff: noqa: N803 - Triton style: uppercase sizes and constexpr block names

import torch
import triton
import triton.language as tl


@triton.jit
def _scaled_gelu_tanh(x_ptr, scale_ptr, shift_ptr, out_ptr, n, features, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    col = offs % features
    s = tl.load(scale_ptr + col, mask=mask, other=0.0)
    b = tl.load(shift_ptr + col, mask=mask, other=0.0)
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    t = 2.0 * tl.sigmoid(2.0 * inner) - 1.0  # tanh approximation of GELU: close, but not exact
    y = 0.5 * x * (1.0 + t)
    tl.store(out_ptr + offs, y * s + b, mask=mask)


def kernel_function(x, scale, shift):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _scaled_gelu_tanh[(triton.cdiv(n, 256),)](x, scale, shift, out, n, x.shape[-1], BLOCK=256)
    return out
