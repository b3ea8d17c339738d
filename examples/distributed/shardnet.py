"""The example's model: a small classifier of stacked residual MLP blocks (importable by path,
so a capture of any of its parts can be rebuilt in another process).

It is also the model of the distributed tests (tests/tracing/test_distributed.py and
test_run_distributed.py build it at a smaller size), so keep its class and attribute names:
the tests target ``blocks.0.ff`` and check recorded class paths such as ``shardnet:Block``."""

from __future__ import annotations

import torch
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ff = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.ff(self.norm(x))


class ShardNet(nn.Module):
    def __init__(self, features: int = 16, dim: int = 64, hidden: int = 256, depth: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(features, dim)
        self.blocks = nn.ModuleList(Block(dim, hidden) for _ in range(depth))
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)
