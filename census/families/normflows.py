"""normflows: every flow layer, base distribution and flow model class it exports (normalizing
flows; probabilistic models).

Classes are what ``normflows.flows``, ``normflows.distributions`` and ``normflows`` (the flow
models) export, base classes left out. Constructor arguments come from the signature by name
(``TYPICAL``: 2-dimensional densities, 4-channel 8 px images for the Glow layers) with
module-valued ones from ``FACTORIES`` (normflows' own ``nets.MLP`` as coupling networks, a
diagonal Gaussian as the base of a flow model, a Planar flow where a flow is wrapped). Inputs: the
first of ``_candidates`` a module accepts: a batch of 8 points in 2D, images, a number of samples
(the base distributions sample when called), class labels or a context. Sampling draws from
torch's generator, recorded by the capture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

D, N = 2, 8  # dimensions, points
IMAGE = (4, 8, 8)


def _nf():  # type: ignore[no-untyped-def]
    import normflows

    return normflows


TYPICAL: dict[str, Any] = {
    "shape": (D,), "num_classes": 3, "num_input_channels": D, "num_blocks": 1, "num_hidden_channels": 8, "ind_circ": [0],
    "channels": IMAGE[0], "hidden_channels": 8, "steps": 2, "log_step_size": torch.zeros(D), "log_mass": torch.zeros(D),
    "num_channels": D, "features": D, "hidden_features": 8, "b": torch.tensor([0.0, 1.0]), "ind": [0],
    "affine_shape": (D,), "n_modes": 2, "dim": D, "ndim": D, "image": torch.rand(8, 8), "scale": 0.1,
}
FACTORIES: dict[str, Callable[[], Any]] = {
    "param_map": lambda: _nf().nets.MLP([1, 8, 2], init_zeros=True),
    "t": lambda: _nf().nets.MLP([D, 8, D], init_zeros=True),
    "s": lambda: _nf().nets.MLP([D, 8, D], init_zeros=True),
    "net": lambda: _nf().nets.LipschitzMLP([D, 8, D]),
    "flow": lambda: _nf().flows.Planar((D,)),
    "flows": lambda: [_nf().flows.Planar((D,)), _nf().flows.Radial((D,))],
    "q0": lambda: _nf().distributions.DiagGaussian(D),
    "prior": lambda: _nf().distributions.DiagGaussian(D),
    "target": lambda: _nf().distributions.TwoMoons(),
    "proposal": lambda: _nf().distributions.DiagGaussianProposal((D,), 0.1),
}
GIVEN: dict[str, dict[str, Any]] = {
    "flows.ActNorm": {"shape": (D,)},
    "flows.Invertible1x1Conv": {"num_channels": IMAGE[0]},
    "distributions.GlowBase": {"shape": IMAGE},
}
# module-valued arguments of one class (built inside ``build``, so under the capture's init tracking)
CLASS_FACTORIES: dict[str, dict[str, Callable[[], Any]]] = {
    "distributions.NNDiagGaussian": {"net": lambda: _mlp(2 * D)},
    "distributions.NNDiagGaussianDecoder": {"net": lambda: _mlp(2 * D)},
    "distributions.NNBernoulliDecoder": {"net": lambda: _mlp(D)},
}


def _mlp(width_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(D, 8), nn.Tanh(), nn.Linear(8, width_out))


def _skip(name: str, cls: type) -> bool:
    return name in ("Flow", "BaseDistribution", "BaseEncoder", "BaseDecoder", "Target", "MHProposal")


def _classes() -> dict[str, type[nn.Module]]:
    return exported(["normflows.flows", "normflows.distributions", "normflows"], _skip)


def _build(key: str, cls: type[nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        given = GIVEN.get(key, {})
        if key == "normflows.MultiscaleFlow":
            raise CannotBuildError("not a target: a multiscale Glow needs per-level flow lists and merges, built by "
                                   "hand in normflows' examples (its layers are targets)")
        factories = {**FACTORIES, **CLASS_FACTORIES.get(key, {})}
        return construct(cls, TYPICAL, factories, given, {}, "census/families/normflows.py TYPICAL")
    return build


def _candidates() -> list[Inputs]:
    def g() -> torch.Generator:
        return torch.Generator().manual_seed(15)

    points = lambda: torch.randn(N, D, generator=g())  # noqa: E731
    image = lambda: torch.randn(2, *IMAGE, generator=g())  # noqa: E731
    return [lambda: (points(),), lambda: (image(),), lambda: (N,), lambda: (points(), torch.randint(0, 3, (N,), generator=g())),
            lambda: (N, torch.randint(0, 3, (N,), generator=g())), lambda: (points(), 2),
            lambda: ([image()[:, :2], image()[:, 2:]],), lambda: (points(), points())]


def _job(model: nn.Module) -> Job:
    return first_accepted(model, _candidates())


def targets(sample: Sample) -> list[Target]:
    classes = _classes()
    keys = sample.pick(list(classes), str, quick_count=2)
    return [Target(key, _build(key, classes[key]), _job, submodules=lambda _m: {"model": ""}) for key in keys]
