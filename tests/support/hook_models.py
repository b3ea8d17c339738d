"""Modules with hooks (issue 22, defect 5): hooks a module registers in its own ``__init__`` (a
pre-hook scaling its input, a ``with_kwargs`` pre-hook rewriting a keyword, an ``always_call``
forward hook shifting its output), and a model that gets a hook from outside after construction."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class SelfHooked(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.register_forward_pre_hook(self._scale_input)
        self.register_forward_pre_hook(_double_gate, with_kwargs=True)
        self.register_forward_hook(_shift_output, always_call=True)

    @staticmethod
    def _scale_input(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (args[0] * 3.0,)

    def forward(self, x: torch.Tensor, gate: float = 1.0) -> torch.Tensor:
        return self.lin(x) * gate


def _double_gate(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    return args, {**kwargs, "gate": kwargs.get("gate", 1.0) * 2.0}


def _shift_output(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
    return output + 0.5


class Outer(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.inner = SelfHooked(dim)
        self.head = nn.Linear(dim, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.inner(x, gate=0.5)))


def clip_output(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
    """A hook the job adds from outside, after construction."""
    return output.clamp(-0.1, 0.1)
