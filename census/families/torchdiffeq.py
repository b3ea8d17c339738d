"""torchdiffeq: a neural ODE block through every solver torchdiffeq registers, with ``odeint``
and with ``odeint_adjoint``.

torchdiffeq has no module classes of its own: users write an ``nn.Module`` for the dynamics
(``f(t, y)``) and a block whose forward integrates it, as in torchdiffeq's examples. The census
does the same (``ODEFunc``, ``ODEBlock`` below, importable, so a replay rebuilds them) once per
entry of torchdiffeq's solver registry (``torchdiffeq._impl.odeint.SOLVERS``: the adaptive
Dormand-Prince, Bogacki-Shampine, Fehlberg and Heun methods, the fixed-grid Euler, midpoint,
RK4, Heun and Adams methods, ``scipy_solver``) and each of the two entry points (``odeint``, and
``odeint_adjoint``, which integrates the adjoint system for gradients). Each block integrates a
batch of 4 states of width 6 over 3 time points with torchdiffeq's default tolerances (the
fixed-grid methods step on the time points; ``scipy_solver`` uses SciPy's RK45). Captured: the
block and the dynamics ``func`` (its first call).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torchdiffeq  # at the top, as in torchdiffeq's examples: a replay imports it when it resolves ODEBlock
from torch import nn
from torchdiffeq._impl.odeint import SOLVERS

from census.targets import Job, Sample, Target

WIDTH = 6
OPTIONS: dict[str, dict[str, Any]] = {"scipy_solver": {"solver": "RK45"}}


class ODEFunc(nn.Module):
    """The dynamics ``dy/dt = f(t, y)``: a small MLP of the state and the time."""

    def __init__(self, width: int, hidden: int = 16) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width + 1, hidden), nn.Tanh(), nn.Linear(hidden, width))

    def forward(self, t: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([y, t.expand(*y.shape[:-1], 1)], dim=-1))


class ODEBlock(nn.Module):
    """Integrates ``func`` from the input state over ``times`` with one torchdiffeq method."""

    def __init__(self, width: int, method: str, adjoint: bool = False, options: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.func = ODEFunc(width)
        self.method, self.adjoint, self.options = method, adjoint, options
        self.register_buffer("times", torch.tensor([0.0, 0.5, 1.0]))

    def forward(self, y0: torch.Tensor) -> torch.Tensor:
        solve = torchdiffeq.odeint_adjoint if self.adjoint else torchdiffeq.odeint
        return solve(self.func, y0, self.times, method=self.method, options=self.options)


def _methods() -> list[str]:
    return sorted(SOLVERS)


def _build(method: str, adjoint: bool) -> Callable[[], nn.Module]:
    return lambda: ODEBlock(WIDTH, method, adjoint, OPTIONS.get(method))


def _job(model: nn.Module) -> Job:
    y0 = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(10))
    return lambda m: m(y0.clone())


def targets(sample: Sample) -> list[Target]:
    names = [f"{method}{'-adjoint' if adjoint else ''}" for method in _methods() for adjoint in (False, True)]
    chosen = sample.pick(names, str, quick_count=2)
    return [Target(name, _build(name.removesuffix("-adjoint"), name.endswith("-adjoint")), _job,
                   submodules=lambda _m: {"model": "", "func": "func"}) for name in chosen]
