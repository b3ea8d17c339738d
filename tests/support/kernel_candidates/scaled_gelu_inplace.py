"""A cheat: correct values, but written over the input tensor (an in-place kernel)."""
# ruff: noqa: N803 - Triton style: uppercase sizes and constexpr block names

import triton
import triton.language as tl


@triton.jit
def _scaled_gelu_inplace(x_ptr, scale_ptr, shift_ptr, n, features, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    col = offs % features
    s = tl.load(scale_ptr + col, mask=mask, other=0.0)
    b = tl.load(shift_ptr + col, mask=mask, other=0.0)
    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(x_ptr + offs, y * s + b, mask=mask)  # writes the result over the input


def kernel_function(x, scale, shift):
    n = x.numel()
    _scaled_gelu_inplace[(triton.cdiv(n, 256),)](x, scale, shift, n, x.shape[-1], BLOCK=256)
    return x
