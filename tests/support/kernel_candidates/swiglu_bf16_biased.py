"""A wrong Triton kernel_function for kernel_models.SwiGLU in bfloat16: it rounds where the reference
rounds (after each matmul, after SiLU, after the product, to nearest even), then moves every result
one bfloat16 ULP away from zero. Off by one ULP everywhere, it is within KernelBench's fixed
``rtol = atol = 1e-2`` of the reference (one bfloat16 ULP is at most 0.78% of a value): only a
verdict in ULPs sees the bias.
"""
# ruff: noqa: N803, N806 - Triton style: uppercase sizes and constexpr block names

import torch
import triton
import triton.language as tl


@triton.jit
def _round_bf16(v):
    """float32 -> the nearest bfloat16 (ties to even), as float32: done by hand, since the Triton
    interpreter's conversion truncates."""
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _swiglu_biased(x_ptr, w1_ptr, w3_ptr, out_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    gate = tl.zeros((BM, BN), dtype=tl.float32)
    up = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K),
                    other=0.0).to(tl.float32)
        w_mask = (rn[None, :] < N) & (rk[:, None] < K)
        w1 = tl.load(w1_ptr + rn[None, :] * K + rk[:, None], mask=w_mask, other=0.0).to(tl.float32)
        w3 = tl.load(w3_ptr + rn[None, :] * K + rk[:, None], mask=w_mask, other=0.0).to(tl.float32)
        gate += tl.dot(a, w1, input_precision="ieee")
        up += tl.dot(a, w3, input_precision="ieee")
    gate = _round_bf16(gate)
    up = _round_bf16(up)
    y = _round_bf16(_round_bf16(gate * tl.sigmoid(gate)) * up)
    bits = y.to(tl.int32, bitcast=True)
    y = tl.where(y == 0.0, y, (bits + 65536).to(tl.float32, bitcast=True))  # one bfloat16 ULP more magnitude
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], y.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def kernel_function(x, w1, w3):
    x = x.contiguous()
    M, K = x.shape
    N = w1.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _swiglu_biased[(triton.cdiv(M, 16), triton.cdiv(N, 32))](x, w1, w3, out, M, N, K, BM=16, BN=32, BK=32)
    return out
