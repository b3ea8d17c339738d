"""Mechanical construction for registries of layer classes (torch.nn, torch_geometric.nn, and the
libraries swept by class: kornia, monai, e3nn, normflows, ...).

The classes of a library are the ``nn.Module`` subclasses its packages export (``exported``).
Constructor arguments come from the signature: a required argument takes its value from a table
by name (or from a factory, for module-valued arguments); a class whose required argument is in
neither is reported as not built, naming the argument. Optional arguments keep the library's
defaults, except the size arguments a family shrinks (``sizes``: a smaller width or depth where
the default makes a model of hundreds of millions of parameters, ``pretrained=False`` where the
default downloads weights). Inputs are the first of a list of candidates that the module accepts
when called (without capture).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
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


def exported(packages: Sequence[str], skip: Callable[[str, type], bool] = lambda _n, _c: False,
             labels: Mapping[str, str] | None = None) -> dict[str, type[nn.Module]]:
    """The ``nn.Module`` classes the packages export (``__all__``, else their public names), by
    "<label>.<name>" (one package: by name; a package's label is its last part unless ``labels``
    names another), sorted; each class once, under its first name (monai's ``BasicUnet``,
    ``Basicunet`` are ``BasicUNet``), abstract classes and those ``skip(name, cls)`` names left out."""
    found: dict[str, type[nn.Module]] = {}
    seen: set[type] = set()
    for package in packages:
        module = importlib.import_module(package)
        names = getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]
        for name in names:
            obj = getattr(module, name, None)
            if (not inspect.isclass(obj) or not issubclass(obj, nn.Module) or inspect.isabstract(obj)
                    or obj in seen or skip(name, obj)):
                continue
            seen.add(obj)
            label = (labels or {}).get(package, package.rsplit(".", 1)[-1])
            found[f"{label}.{name}" if len(packages) > 1 else name] = obj
    return dict(sorted(found.items()))


def construct(cls: type[nn.Module], typical: Mapping[str, Any], factories: Mapping[str, Callable[[], Any]],
              given: Mapping[str, Any], sizes: Mapping[str, Any], where: str) -> nn.Module:
    """``cls`` built from its signature (``arguments``), with the optional ``sizes`` it takes."""
    kwargs = arguments(cls, typical, factories, given, where)
    parameters = inspect.signature(cls.__init__).parameters
    for name, value in sizes.items():
        if name in parameters and name not in kwargs:
            kwargs[name] = factories[name]() if name in factories else value
    return cls(**kwargs)


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
