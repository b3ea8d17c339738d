"""Mechanical construction for registries of layer classes (torch.nn, torch_geometric.nn).

Constructor arguments come from the signature: a required argument takes its value from a table
by name (or from a factory, for module-valued arguments); a class whose required argument is in
neither is reported as not built, naming the argument. Inputs are the first of a list of
candidates that the module accepts when called (without capture).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from census.targets import CannotBuildError, CannotBuildInputsError, Job

Inputs = Callable[[], "tuple[Any, ...] | dict[str, Any]"]  # positional arguments, or keyword arguments


def arguments(cls: type[nn.Module], typical: Mapping[str, Any], factories: Mapping[str, Callable[[], Any]],
              given: Mapping[str, Any], where: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = dict(given)
    for name, parameter in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or name in kwargs or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.default is inspect.Parameter.empty:
            if name in factories:
                kwargs[name] = factories[name]()
            elif name in typical:
                kwargs[name] = typical[name]
            else:
                raise CannotBuildError(f"no typical value for required argument {name!r} ({where})")
    return kwargs


def first_accepted(model: nn.Module, candidates: list[Inputs]) -> Job:
    """The job calling ``model`` with the first candidate it accepts (copies each time, so an
    in-place module never changes what the next call gets)."""
    errors = []
    for candidate in candidates:
        inputs = candidate()
        try:
            with torch.no_grad():
                _call(model, inputs)
        except Exception as error:
            errors.append(f"{_shapes(inputs)}: {type(error).__name__}: {str(error)[:120]}")
            continue

        def run(module: nn.Module, inputs: tuple[Any, ...] | dict[str, Any] = inputs) -> None:
            _call(module, inputs)
        return run
    raise CannotBuildInputsError("no candidate input was accepted: " + "; ".join(errors[:2] + errors[-1:]))


def _call(model: nn.Module, inputs: tuple[Any, ...] | dict[str, Any]) -> Any:
    copies = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, inputs)
    return model(**copies) if isinstance(copies, dict) else model(*copies)


def _shapes(inputs: tuple[Any, ...] | dict[str, Any]) -> Any:
    def shape(x: Any) -> Any:
        return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
    return {k: shape(v) for k, v in inputs.items()} if isinstance(inputs, dict) else [shape(x) for x in inputs]
