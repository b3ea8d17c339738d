"""Cheat: torch.nn.functional imported with importlib under a computed name."""
# ruff: noqa: N803 - Triton style: uppercase constexpr block names
import importlib

import torch
import triton
import triton.language as tl


@triton.jit
def _bias_relu_scale(h_ptr, b_ptr, out_ptr, n, N, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    h = tl.load(h_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs % N, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(h + b, 0.0) * alpha, mask=mask)


def _finish(h, bias, alpha):
    """The token Triton part: bias + relu + scale on a matmul PyTorch already computed."""
    h = h.contiguous()
    out = torch.empty_like(h)
    _bias_relu_scale[(triton.cdiv(h.numel(), 256),)](h, bias, out, h.numel(), h.shape[-1], float(alpha), BLOCK=256)
    return out


def kernel_function(x, alpha, weight, bias):
    functional = importlib.import_module("torch.nn." + "functional")
    return _finish(functional.linear(x, weight), bias, alpha)
