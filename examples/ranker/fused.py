"""A rewrite of ``ranker.model.MLP`` to check against the captured one (``modulelens verify``,
``assert_matches``): its weights packed into one tensor per layer (weight and bias together), built
from the original by ``from_original``."""

from __future__ import annotations

import torch
from ranker.model import MLP
from torch import nn


class FusedMLP(nn.Module):
    def __init__(self, packed: list[torch.Tensor]) -> None:
        super().__init__()
        self.packed = nn.ParameterList(nn.Parameter(p) for p in packed)

    @classmethod
    def from_original(cls, mlp: MLP) -> FusedMLP:
        linears = [layer for layer in mlp.layers if isinstance(layer, nn.Linear)]
        return cls([torch.cat([lin.weight.detach(), lin.bias.detach()[:, None]], 1).clone() for lin in linears])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, packed in enumerate(self.packed):
            x = torch.addmm(packed[:, -1], x, packed[:, :-1].t())
            if i < len(self.packed) - 1:
                x = x.clamp_min(0)
        return x
