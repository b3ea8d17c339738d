"""e3nn: every module class of ``e3nn.o3`` and ``e3nn.nn`` (E(3)-equivariant networks).

Constructor arguments come from the signature by name (``TYPICAL``: irreps of scalars and
vectors, ``lmax`` 2, activations as torch functions; ``GIVEN`` where a class needs matching ones:
a tensor product's instructions, a gate's three irreps). e3nn compiles most of these modules
(``torch.fx`` code generation, ``opt_einsum_fx``) when they are built; they are run as built.
Inputs follow the module's own irreps (``irreps_in``, ``irreps_in1``/``irreps_in2``, ``irreps``):
8 points of features of that width; then points in 3D, angles, and grids on the sphere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import Job, Sample, Target

N = 8  # points
IN, OUT, IN1, IN2 = "4x0e + 2x1o", "2x0e + 1x1o", "2x0e + 1x1o", "1x0e + 1x1o"

TYPICAL: dict[str, Any] = {
    "irreps_in": IN, "irreps_out": OUT, "irreps_in1": IN1, "irreps_in2": IN2, "irreps": IN, "lmax": 2, "l": 2,
    "ls": [0, 1, 2], "normalize": True, "resolution": 6, "res": 8, "hs": [4, 8, 2], "p": 0.1, "ir": "0e",
    "lmax_in": 1, "lmax_out": 1, "act": torch.tanh, "acts": [torch.tanh], "scalar_nonlinearity": torch.sigmoid,
    "irreps_outs": ["4x0e", "2x1o"], "instructions": [(0,), (1,)], "formula": "ij=ji",
}
GIVEN: dict[str, dict[str, Any]] = {
    # 2x0e+1x1o times 1x0e+1x1o into 2x0e+1x1o: the paths 0e.0e->0e, 1o.1o->0e, 0e.1o->1o, 1o.0e->1o
    "o3.TensorProduct": {"instructions": [(0, 0, 0, "uvw", True), (1, 1, 0, "uvw", True), (0, 1, 1, "uvw", True),
                                          (1, 0, 1, "uvw", True)]},
    "o3.ElementwiseTensorProduct": {"irreps_in1": IN1, "irreps_in2": "2x0e + 1x1e"},  # the same multiplicities
    "o3.SphericalHarmonics": {"irreps_out": "1x0e + 1x1o + 1x2e"},
    "o3.ReducedTensorProducts": {"i": "1o"},
    "o3.ToS2Grid": {"lmax": 2, "res": (6, 8)}, "o3.FromS2Grid": {"res": (6, 8), "lmax": 2},
    "o3.SO3Grid": {"lmax": 1, "resolution": 4},
    "nn.Gate": {"irreps_scalars": "2x0e", "act_scalars": [torch.relu], "irreps_gates": "1x0e",
                "act_gates": [torch.sigmoid], "irreps_gated": "1x1o"},
    "nn.Activation": {"irreps_in": "4x0e", "acts": [torch.tanh]},
    "nn.Identity": {"irreps_in": IN, "irreps_out": IN},
    "nn.S2Activation": {"irreps": "1x0e + 1x1e + 1x2e", "act": torch.relu, "res": 10},
    "nn.SO3Activation": {"lmax_in": 1, "lmax_out": 1, "act": torch.relu, "resolution": 6},
}


def _classes() -> dict[str, type[nn.Module]]:
    return exported(["e3nn.o3", "e3nn.nn"])


def _build(key: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        return construct(cls, TYPICAL, {}, GIVEN.get(key, {}), {}, "census/families/e3nn.py TYPICAL")
    return build


def _dim(irreps: Any) -> int | None:
    """The width of features of these irreps, None if they are not one set of irreps (a list)."""
    from e3nn import o3

    try:
        return o3.Irreps(irreps).dim
    except (ValueError, TypeError, AssertionError):
        return None


def _candidates(model: nn.Module) -> list[Inputs]:
    def rand(*shape: int) -> Callable[[], torch.Tensor]:
        return lambda: torch.randn(*shape, generator=torch.Generator().manual_seed(8))

    candidates: list[Inputs] = []
    first, second = _dim(getattr(model, "irreps_in1", None)), _dim(getattr(model, "irreps_in2", None))
    if first is not None and second is not None:
        candidates.append(lambda: (rand(N, first)(), rand(N, second)()))
    for attribute in ("irreps_in", "irreps"):
        width = _dim(getattr(model, attribute, None))
        if width is not None:
            candidates.append(lambda width=width: (rand(N, width)(),))
    candidates += [lambda: (rand(N, 3)(),), lambda: (rand(N)(), rand(N)()), lambda: (rand(N)().tanh(), rand(N)()),
                   lambda: (rand(N, 3)(), rand(N, 3)()), lambda: (rand(N, 9)(),), lambda: (rand(N, 6, 8)(),),
                   lambda: (rand(N, 10)(),), lambda: (rand(N, 4)(),), lambda: ()]
    return candidates


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates(model))


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    keys = sample.pick(list(classes), str, quick_count=2)
    return [Target(key, _build(key, classes[key]), _job, submodules=lambda _m: {"model": ""}) for key in keys]
