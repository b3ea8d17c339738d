"""KernelAgent style: a correct fused Triton kernel_function for kernel_models.SwiGLU in bfloat16.

Both matmuls, SiLU and the product stay in float32 and are rounded to bfloat16 once, where the
reference rounds after every op: the two differ by a few bfloat16 ULPs on some elements, more than
KernelBench's fixed ``rtol = atol = 1e-2`` allows, while this kernel is the more accurate of the two.
"""
# ruff: noqa: N803, N806 - Triton style: uppercase sizes and constexpr block names

import torch
import triton
import triton.language as tl


@triton.jit
def _swiglu(x_ptr, w1_ptr, w3_ptr, out_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    gate = tl.zeros((BM, BN), dtype=tl.float32)
    up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        # bfloat16 products are exact in float32, so widening the operands changes no result
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                    other=0.0).to(tl.float32)
        w_mask = (rn[None, :] < N) & (rk[:, None] < K)
        w1 = tl.load(w1_ptr + rn[None, :] * K + rk[:, None], mask=w_mask, other=0.0).to(tl.float32)
        w3 = tl.load(w3_ptr + rn[None, :] * K + rk[:, None], mask=w_mask, other=0.0).to(tl.float32)
        gate += tl.dot(a, w1, input_precision="ieee")
        up += tl.dot(a, w3, input_precision="ieee")
    y = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel_function(x, w1, w3):
    x = x.contiguous()
    M, K = x.shape
    N = w1.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _swiglu[(triton.cdiv(M, 16), triton.cdiv(N, 32))](x, w1, w3, out, M, N, K, BM=16, BN=32, BK=32)
    return out
