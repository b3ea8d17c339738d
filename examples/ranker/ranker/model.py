"""The model: sparse features through embeddings, a bottom MLP, attention blocks, a top MLP."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class MLP(nn.Module):
    """Linear layers with a ReLU between them."""

    def __init__(self, dims: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (d_in, d_out) in enumerate(itertools.pairwise(dims)):
            layers.append(nn.Linear(d_in, d_out))
            if i < len(dims) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class GatedMLP(nn.Module):
    """A gated feed-forward layer (as in Llama): down(silu(gate(x)) * up(x))."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm = nn.LayerNorm(dim)
        self.mlp = GatedMLP(dim, 2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, x, x, need_weights=False)[0]
        return x + self.mlp(self.norm(x))


class Ranker(nn.Module):
    """Scores a user/item pair from its sparse features (one id per field) and dense features."""

    def __init__(self, vocab: int = 1000, fields: int = 4, dense: int = 8, dim: int = 16, blocks: int = 2,
                 heads: int = 2) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(vocab, dim)
        self.bottom_mlp = MLP([dense, 32, dim])
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(blocks))
        self.top_mlp = MLP([(fields + 1) * dim, 32, 1])

    def forward(self, ids: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        tokens = torch.cat([self.embeddings(ids), self.bottom_mlp(dense)[:, None]], dim=1)
        for block in self.blocks:
            tokens = block(tokens)
        return self.top_mlp(tokens.flatten(1)).squeeze(1)


def build_model(**config: int) -> Ranker:
    """The model, sized by ``config`` (``dim``, ``blocks``...; defaults are small)."""
    return Ranker(**config)
