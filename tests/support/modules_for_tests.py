"""Modules used by the tests; importable by fresh subprocesses (tests/support is on their PYTHONPATH)."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class KeywordModule(nn.Module):
    """Keyword-only and defaulted constructor arguments."""

    def __init__(self, d_in: int, d_out: int = 8, *, activation: type[nn.Module] = nn.ReLU, scale: float = 1.0,
                 dtype: torch.dtype = torch.float32, layers: tuple[int, ...] = (16,)) -> None:
        super().__init__()
        sizes = [d_in, *layers, d_out]
        self.layers = nn.ModuleList(nn.Linear(a, b, dtype=dtype) for a, b in itertools.pairwise(sizes))
        self.act = activation()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.act(layer(x))
        return self.layers[-1](x) * self.scale


class DictToTuple(nn.Module):
    """Takes a dict of tensors (and a flag), returns a tuple (tensor, dict, int)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)

    def forward(self, batch: dict[str, torch.Tensor], normalise: bool = True) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        q = self.query(batch["q"])
        k = self.key(batch["k"])
        scores = q @ k.transpose(-1, -2)
        if normalise:
            scores = scores.softmax(-1)
        return scores, {"q": q, "norm": q.norm(dim=-1)}, int(q.shape[0])


class Wrapper(nn.Module):
    """Receives another module as a constructor argument."""

    def __init__(self, inner: nn.Module, residual: bool = True) -> None:
        super().__init__()
        self.inner = inner
        self.residual = residual
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)
        return self.out(y + x if self.residual else y)


class InPlace(nn.Module):
    """Mutates its input in place (recorded inputs must not see that)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2).add_(1)
        return self.lin(x)


class Opaque:
    """A constructor argument modulelens has no codec for."""

    def __init__(self, value: int) -> None:
        self.value = value


class TakesOpaque(nn.Module):
    def __init__(self, thing: Opaque, dim: int = 4) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.factor = thing.value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.factor


class Tower(nn.Module):
    """A small model with several submodules for target matching."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(3))
        self.head = KeywordModule(8, 2, scale=0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x) + x
        return self.head(x)
