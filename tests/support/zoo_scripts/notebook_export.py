# A notebook exported to a script: top-level cells, a module defined between them, evaluation
# at the end, no main guard.
import math

import torch
from torch import nn

SCALE = math.sqrt(8)


class TinyAttention(nn.Module):
    def __init__(self, dim, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        attn = (q @ k.transpose(-1, -2) / SCALE).softmax(-1)
        return self.out((attn @ v).transpose(1, 2).reshape(b, t, d))


layer = TinyAttention(8).eval()
with torch.no_grad():
    out = layer(torch.randn(2, 5, 8))
print(out.shape)
