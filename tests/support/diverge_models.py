"""A small decoder-only transformer whose attention spells out its mask and softmax (so one op of
one block can be planted wrong), and the rewrites the first-divergence tests check.

``TinyGPT(planted=...)`` plants one bug in ``blocks.<planted_block>.attn``: ``"softmax_half"`` (the
softmax computed in float16) or ``"mask_off_by_one"`` (the causal mask lets each position see one
token ahead). ``PLANTED`` in the environment does the same for a model built without the argument
(a replay in another process "runs the edited code").
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, planted: str | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.planted = planted

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(dim // self.heads)
        bug = self.planted or os.environ.get("PLANTED_BUG_" + str(getattr(self, "block_index", -1)))
        diagonal = 2 if bug == "mask_off_by_one" else 1
        mask = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(diagonal)
        scores = scores.masked_fill(mask, float("-inf"))
        if bug == "softmax_half":
            weights = torch.softmax(scores.half(), dim=-1).float()
        else:
            weights = torch.softmax(scores, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, dim)
        return self.proj(out)


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, planted: str | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, planted)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, depth: int = 4,
                 planted: str | None = None, planted_block: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, planted if i == planted_block else None) for i in range(depth))
        for i, block in enumerate(self.blocks):
            block.attn.block_index = i
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class SoftmaxHalfGPT(TinyGPT):
    """A rewrite whose block 2 computes its softmax in float16 (a dtype change in one block)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.blocks[2].attn.planted = "softmax_half"


class MaskOffByOneGPT(TinyGPT):
    """A rewrite whose block 2 builds its causal mask one diagonal off."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.blocks[2].attn.planted = "mask_off_by_one"


class FusedMLP(nn.Module):
    """``MLP`` as one fused function (its submodules are gone: ``up``/``act``/``down`` are one region)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w_up = nn.Parameter(torch.empty(4 * dim, dim))
        self.b_up = nn.Parameter(torch.empty(4 * dim))
        self.w_down = nn.Parameter(torch.empty(dim, 4 * dim))
        self.b_down = nn.Parameter(torch.empty(dim))
        self.bias_shift = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.addmm(self.b_up, x.reshape(-1, x.shape[-1]), self.w_up.t())
        bias = self.b_down
        if self.bias_shift:  # on one feature: a shift of all of them would vanish in the next LayerNorm
            bias = bias + self.bias_shift * (torch.arange(bias.numel(), device=bias.device) == 0)
        out = torch.addmm(bias, nn.functional.gelu(hidden), self.w_down.t())
        return out.view(*x.shape[:-1], -1)


class FusedBlockGPT(TinyGPT):
    """Every block's MLP fused (``FusedMLP``); ``shift`` makes block 2's fused MLP add a wrong bias."""

    shift = 0.0

    @classmethod
    def from_original(cls, original: TinyGPT) -> FusedBlockGPT:
        fused = cls(vocab=original.embed.num_embeddings, dim=original.embed.embedding_dim,
                    heads=original.blocks[0].attn.heads, depth=len(original.blocks))
        fused.load_state_dict(original.state_dict())
        for i, block in enumerate(fused.blocks):
            mlp = block.mlp
            block.mlp = FusedMLP(mlp.up.in_features)
            with torch.no_grad():
                block.mlp.w_up.copy_(mlp.up.weight)
                block.mlp.b_up.copy_(mlp.up.bias)
                block.mlp.w_down.copy_(mlp.down.weight)
                block.mlp.b_down.copy_(mlp.down.bias)
            block.mlp.bias_shift = cls.shift if i == 2 else 0.0
        return fused.train(original.training)


class WrongFusedGPT(FusedBlockGPT):
    shift = 0.5


def tokens(batch: int = 2, length: int = 12, vocab: int = 64, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=generator)
