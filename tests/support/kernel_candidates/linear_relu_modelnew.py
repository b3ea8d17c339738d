"""KernelBench style: ModelNew for kernel_models.LinearRelu (Triton matmul + bias + relu, IEEE fp32 dot)."""
# ruff: noqa: N803, N806 - Triton style: uppercase sizes and constexpr block names

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _linear_relu(x_ptr, w_ptr, b_ptr, out_ptr, M, N, K, alpha,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=(rn[None, :] < N) & (rk[:, None] < K), other=0.0)
        acc += tl.dot(a, w, input_precision="ieee")
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    y = tl.maximum(acc + bias[None, :], 0.0) * alpha
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], y, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Module()
        self.fc.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.fc.bias = nn.Parameter(torch.empty(out_features))

    def forward(self, x, alpha):
        x = x.contiguous()
        M, K = x.shape
        N = self.fc.weight.shape[0]
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        grid = (triton.cdiv(M, 16), triton.cdiv(N, 16))
        _linear_relu[grid](x, self.fc.weight, self.fc.bias, out, M, N, K, float(alpha), BM=16, BN=16, BK=16)
        return out
