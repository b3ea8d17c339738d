"""Lazy modules (``nn.LazyLinear``, ``nn.LazyConv2d``, ``nn.LazyBatchNorm1d``...): built without the
sizes their first call infers, after which they become their non-lazy class (``cls_to_become``).

Two consequences for a capture (found by the census: all 13 of torch's lazy modules failed to load):

* The recorded constructor arguments are the lazy class's (``LazyLinear(6)``), but the module that
  ran is a ``Linear(4, 6)``. A capture records the non-lazy construction: the lazy arguments by
  name plus the inferred sizes, read from the materialised module (:func:`materialised_arguments`).
* Before its first call such a module has no parameters to snapshot. A target that is itself lazy
  has its first call recorded by a second tracer pre-hook that runs after the module's own
  initialisation hook (weights and random state as its forward sees them, inputs as the parent
  passed them); a target with lazy submodules records from the first call after they materialised.
  (Running the module's own hook early instead is not possible: torch has already listed the hooks
  of the call, so it would run again on the materialised class, which lacks ``initialize_parameters``.)
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.parameter import UninitializedTensorMixin  # type: ignore[attr-defined]  # torch's parameter.pyi omits it

from modulelens.errors import UnsupportedValueError


def is_lazy_class(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, LazyModuleMixin)


def is_unmaterialised_lazy(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a lazy module whose own pre-hook will infer its parameters at its next call."""
    return (isinstance(module, LazyModuleMixin) and getattr(module, "_initialize_hook", None) is not None
            and module.has_uninitialized_params())


def uninitialised(module: torch.nn.Module) -> str | None:
    """The name of the first parameter or buffer of ``module`` (or a submodule) that a lazy
    module has not materialised yet, or ``None``."""
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        if isinstance(tensor, UninitializedTensorMixin):
            return name
    return None


def materialised_arguments(lazy: type, now: type, module: torch.nn.Module, args: tuple[object, ...],
                           kwargs: Mapping[str, object]) -> tuple[tuple[object, ...], dict[str, object]]:
    """The arguments of ``now`` (the class a lazy module became) that build ``module`` as it is:
    the arguments of the ``lazy`` class by name (its defaults included: ``LazyInstanceNorm2d`` is
    affine by default, ``InstanceNorm2d`` is not), and each required argument of ``now``
    they lack (``in_features``, ``in_channels``, ``num_features``) from the module's attribute
    of that name, which its first call set.

    Raises:
        UnsupportedValueError: a required argument of ``now`` is neither given nor an attribute.
    """
    try:
        bound = inspect.signature(lazy).bind(*args, **kwargs)
        bound.apply_defaults()  # the lazy class's defaults may differ (LazyInstanceNorm2d: affine=True)
        given = bound.arguments
        wanted = inspect.signature(now).parameters
    except (TypeError, ValueError) as error:
        raise UnsupportedValueError(f"the arguments of lazy {lazy.__qualname__} do not map onto "
                                    f"{now.__qualname__}: {error}") from None
    result: dict[str, object] = {}
    for name, parameter in wanted.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if name in given:
            result[name] = given[name]
        elif parameter.default is parameter.empty:
            if name not in vars(module):
                raise UnsupportedValueError(f"{now.__qualname__}() needs {name!r}, which lazy "
                                            f"{lazy.__qualname__} inferred but does not keep as an attribute")
            result[name] = vars(module)[name]
    return (), result
