"""Modules whose load must leave the process as it found it (issue 34, defect 1).

* ``NeuralODE`` (in the script clean_load_script.py, rebuilt from its stored source, which imports
  torchdiffeq): torchdiffeq's Dormand-Prince tableau is a module-level tensor (a load that imported
  it on the meta device broke every later ``dopri5`` solve in the process).
* e3nn's own ``FullyConnectedTensorProduct``: its constructor fills e3nn's ``lru_cache`` of
  Clebsch-Gordan tables (a load on the meta device cached meta tensors, and every later e3nn
  model failed).
* ``Stateful`` (this file's own): a module-level table and an ``lru_cache`` that its constructor
  fills, and initial weights drawn from torch's, numpy's and Python's generators before they are
  registered.

Captured and checked by ``clean_load_worker.py``, which imports none of this (nor torchdiffeq or
e3nn) before the load does.
"""

from __future__ import annotations

import functools
import random

import numpy
import torch
from torch import nn

# a module-level tensor of this file, made when it is first imported (by the load, in `check`)
TABLE = torch.linspace(0.0, 1.0, 5)


@functools.cache
def basis(size: int) -> torch.Tensor:
    """A table its constructor asks for, cached for every later instance (as e3nn's are)."""
    return torch.cos(torch.arange(size, dtype=torch.float32)[:, None] * TABLE[None, : min(size, 5)])


class Stateful(nn.Module):
    def __init__(self, size: int = 6) -> None:
        super().__init__()
        self.basis = basis(size)  # a plain attribute: not state the capture records
        noise = float(numpy.random.rand()) + random.random()
        self.weight = nn.Parameter(torch.randn(size, 5) * noise)  # drawn before it is registered
        self.register_buffer("scale", torch.full((5,), 2.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.basis) * self.scale + x @ self.weight


IRREPS = ("1x0e + 1x1o", "1x1o", "1x0e + 1x1e")  # 1o x 1o: Clebsch-Gordan tables of l = 1


def e3nn_model() -> nn.Module:
    from e3nn import o3

    return o3.FullyConnectedTensorProduct(*IRREPS)


def e3nn_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    from e3nn import o3

    generator = torch.Generator().manual_seed(3)
    return (torch.randn(5, o3.Irreps(IRREPS[0]).dim, generator=generator),
            torch.randn(5, o3.Irreps(IRREPS[1]).dim, generator=generator))


SCENARIOS = {
    "e3nn": (e3nn_model, lambda m: m(*e3nn_inputs())),
    "stateful": (lambda: Stateful(), lambda m: m(torch.randn(2, 6))),
}
