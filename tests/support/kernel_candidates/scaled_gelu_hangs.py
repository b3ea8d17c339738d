"""A broken candidate: kernel_function never returns."""
# ruff: noqa: N803 - Triton style: uppercase sizes and constexpr block names

import triton
import triton.language as tl


@triton.jit
def _noop(x_ptr, n, BLOCK: tl.constexpr):
    pass


def kernel_function(x, scale, shift):
    while x.numel() > 0:
        x = x + 0
    return x
