"""A KernelAgent-style kernel for the captured ``top_mlp`` (``modulelens kernel verify ranker/top_mlp
--candidate kernel.py``): each layer one Triton kernel, matmul + bias (+ ReLU between layers).
On a CPU, Triton runs it in its interpreter (TRITON_INTERPRET=1): correct, not fast."""
# ruff: noqa: N803, N806 - Triton style: uppercase sizes and constexpr block names

import torch
import triton
import triton.language as tl


@triton.jit
def _linear(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, RELU: tl.constexpr,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
    y = acc + tl.load(b_ptr + rn, mask=rn < N, other=0.0)[None, :]
    if RELU:
        y = tl.maximum(y, 0.0)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], y, mask=(rm[:, None] < M) & (rn[None, :] < N))


def _layer(x, weight, bias, relu):
    x = x.contiguous()
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _linear[(triton.cdiv(M, 16), triton.cdiv(N, 16))](x, weight, bias, out, M, N, K, RELU=relu, BM=16, BN=16, BK=16)
    return out


def kernel_function(x, w0, b0, w1, b1):
    return _layer(_layer(x, w0, b0, True), w1, b1, False)
