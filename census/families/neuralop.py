"""neuraloperator (``neuralop``): every model of ``neuralop.models`` and every layer class of the
``neuralop.layers`` modules (neural operators for PDEs).

Models (``MODELS``) from small configs (4 Fourier modes a dimension, 8 hidden channels, two
layers), on a 16x16 grid of one channel; the geometry models (``GINO``, ``FNOGNO``) on 20 points
in the unit square with a 8x8 latent grid. Layers: every ``nn.Module`` class defined in a
``neuralop.layers`` module that imports without optional dependencies (the spherical and DISCO
convolutions need torch-harmonics: listed as not built, with the import error), built from their
signature by name (``TYPICAL``) and fed the first input of ``_candidates`` they accept. Captured:
the model or layer and, by rule, a model's first repeated block.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from census.construct import Inputs, construct, exported, first_accepted
from census.targets import CannotBuildError, Job, Sample, Target

B, S, C = 2, 16, 4  # batch, grid side, layer channels
POINTS, LATENT = 20, 8


def _fno(**extra: Any) -> dict[str, Any]:
    return dict(n_modes=(4, 4), in_channels=1, out_channels=1, hidden_channels=8, n_layers=2, **extra)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(14)


def _grid() -> tuple[torch.Tensor, ...]:
    return (torch.rand(B, 1, S, S, generator=_gen()),)


def _geometry() -> dict[str, torch.Tensor]:
    side = torch.linspace(0, 1, LATENT)
    latent = torch.stack(torch.meshgrid(side, side, indexing="ij"), dim=-1)
    points = torch.rand(POINTS, 2, generator=_gen())
    return {"latent": latent, "points": points, "f": torch.randn(POINTS, 1, generator=_gen())}


def _gino_inputs() -> dict[str, torch.Tensor]:
    g = _geometry()
    return {"input_geom": g["points"].unsqueeze(0), "latent_queries": g["latent"].unsqueeze(0),
            "output_queries": g["points"][:10].unsqueeze(0), "x": g["f"].unsqueeze(0)}


def _fnogno_inputs() -> dict[str, torch.Tensor]:
    g = _geometry()
    return {"in_p": g["latent"], "out_p": g["points"], "f": torch.randn(LATENT, LATENT, 1, generator=_gen())}


# model -> (constructor arguments, inputs)
MODELS: dict[str, tuple[Callable[[], dict[str, Any]], Callable[[], Any]]] = {
    "FNO": (_fno, _grid),
    "TFNO": (_fno, _grid),
    "UNO": (lambda: dict(in_channels=1, out_channels=1, hidden_channels=8, n_layers=2, uno_out_channels=[8, 8],
                         uno_n_modes=[[4, 4], [4, 4]], uno_scalings=[[1, 1], [1, 1]]), _grid),
    "UQNO": (lambda: dict(base_model=__import__("neuralop").models.FNO(**_fno())), _grid),
    "CODANO": (lambda: dict(n_layers=2, n_modes=[[4, 4], [4, 4]], hidden_variable_codimension=2, lifting_channels=4,
                            projection_channels=4, per_layer_scaling_factors=[[1, 1], [1, 1]], n_heads=[1, 1],
                            attention_scaling_factors=[1, 1]), _grid),
    "GINO": (lambda: dict(in_channels=1, out_channels=1, gno_coord_dim=2, fno_n_modes=(4, 4), fno_hidden_channels=8,
                          fno_n_layers=1, in_gno_radius=0.3, out_gno_radius=0.3, latent_feature_channels=None),
             _gino_inputs),
    "FNOGNO": (lambda: dict(in_channels=1, out_channels=1, gno_coord_dim=2, fno_n_modes=(4, 4), fno_hidden_channels=8,
                            fno_n_layers=1, gno_radius=0.3), _fnogno_inputs),
}
TYPICAL: dict[str, Any] = {
    "in_channels": C, "out_channels": C, "n_modes": (4, 4), "n_heads": 2, "head_n_channels": 2, "layers": [C, 8, C],
    "n_dim": 2, "dim": C, "embed_dim": C, "num_features": C, "in_features": C, "kernel_size": 3, "coord_dim": 2,
    "radius": 0.3, "domain_padding": 0.25,
}
FACTORIES: dict[str, Callable[[], Any]] = {"module": lambda: nn.Linear(C, C)}


def _layers() -> dict[str, type[nn.Module] | str]:
    """Layer name -> class, or -> the import error of its module."""
    import neuralop.layers

    found: dict[str, type[nn.Module] | str] = {}
    for info in pkgutil.iter_modules(neuralop.layers.__path__):
        if info.name == "tests":
            continue
        name = f"neuralop.layers.{info.name}"
        try:
            importlib.import_module(name)
        except Exception as error:  # an optional dependency (torch-harmonics)
            found[f"layers.{info.name}"] = f"{type(error).__name__}: {error}"
            continue
        for key, cls in exported([name]).items():
            if cls.__module__ == name and not inspect.isabstract(cls) and not key.startswith("Base"):
                found.setdefault(f"layers.{key}", cls)
    return found


def _build_model(name: str) -> Callable[[], nn.Module]:
    return lambda: getattr(importlib.import_module("neuralop.models"), name)(**MODELS[name][0]())


def _build_layer(name: str, found: type[nn.Module] | str) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        if isinstance(found, str):
            raise CannotBuildError(f"its module does not import: {found}")
        return construct(found, TYPICAL, FACTORIES, {}, {}, "census/families/neuralop.py TYPICAL")
    return build


def _layer_candidates() -> list[Inputs]:
    def rand(*shape: int) -> Callable[[], tuple[torch.Tensor]]:
        return lambda: (torch.randn(*shape, generator=_gen()),)

    return [rand(B, C, S, S), rand(B, C, S), rand(B, S, C), rand(S, S, C), rand(B, C, 8, 8, 8), rand(B, S * S, C),
            lambda: (torch.randn(B, C, S, S, generator=_gen()), torch.randn(B, C, S, S, generator=_gen()))]


def _model_job(name: str) -> Callable[[nn.Module], Job]:
    def job(model: nn.Module) -> Job:
        inputs = MODELS[name][1]
        return first_accepted(model, [inputs])
    return job


def _layer_job(model: nn.Module) -> Job:
    return first_accepted(model, _layer_candidates())


def targets(sample: Sample) -> list[Target]:
    layers = _layers()
    names = sample.pick([*MODELS, *layers], str, quick_count=2)
    found: list[Target] = []
    for name in names:
        if name in MODELS:
            found.append(Target(name, _build_model(name), _model_job(name)))
        else:
            found.append(Target(name, _build_layer(name, layers[name]), _layer_job, submodules=lambda _m: {"model": ""}))
    return found
