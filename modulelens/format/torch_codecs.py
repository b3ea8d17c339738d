"""Codecs for values torch's own tools put into constructor arguments (issue 34, defect 3).

Installed lazily (``format/values.py``) once ``torch.ao.quantization`` is imported (torch imports it).

* **Quantization configs.** Eager-mode QAT and PTQ (``prepare_qat``, ``prepare``) build their
  modules from a ``QConfig`` (a namedtuple, stored as one) of ``_PartialWrapper`` factories: a
  ``functools.partial`` of an observer or fake-quantize class (the built-in partial codec) and
  ``callable_args``, each a class or function by import path. ``prepare`` adds one more, a
  function it makes over the module (``get_factory_kwargs_based_on_module_device``: the device
  of the module's weights, where the observers go); it is stored as that rule and rebuilt as the
  default device (a rebuilt module is built on the CPU and moved where ``load(device=)`` says).
  Rebuilt without calling anything but ``_PartialWrapper(partial)``.
* **``torch.qscheme``** (``torch.per_tensor_affine``, ``torch.per_channel_symmetric``...), which
  observers take as ``qscheme=``: stored by name, rebuilt as the ``torch`` attribute of that name
  and only if it is a qscheme.
"""

from __future__ import annotations

from typing import Any

import torch

from modulelens.errors import UnsupportedValueError
from modulelens.format.values import register_codec

# prepare()'s closure over the module being prepared (torch/ao/quantization/qconfig.py)
_MODULE_DEVICE = "_add_module_to_qconfig_obs_ctr.<locals>.get_factory_kwargs_based_on_module_device"


def _default_device() -> None:
    """What ``get_factory_kwargs_based_on_module_device`` returns for a module without weights:
    no ``factory_kwargs``, so observers are made on the default device."""
    return None


def _encode_partial_wrapper(wrapper: Any) -> dict[str, object]:
    arguments = {name: "module device" if getattr(value, "__qualname__", None) == _MODULE_DEVICE else value
                 for name, value in wrapper.callable_args.items()}
    return {"p": wrapper.p, "callable_args": arguments, "module": vars(wrapper).get("__module__")}


def _decode_partial_wrapper(cls: type, data: dict[str, Any]) -> object:
    wrapper = cls(data["p"])
    wrapper.callable_args = {name: _default_device if value == "module device" else value
                             for name, value in data["callable_args"].items()}
    if isinstance(data.get("module"), str):  # with_args() names the wrapped class's module (its repr)
        wrapper.__module__ = data["module"]
    return wrapper


def _decode_qscheme(_cls: type, name: str) -> torch.qscheme:
    scheme = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(scheme, torch.qscheme):
        raise UnsupportedValueError(f"torch has no qscheme {name!r}")
    return scheme


def install() -> None:
    from torch.ao.quantization.observer import _PartialWrapper

    register_codec(_PartialWrapper, _encode_partial_wrapper, _decode_partial_wrapper,
                   name="torch.ao.quantization._PartialWrapper", subclasses=False)
    register_codec(torch.qscheme, lambda scheme: str(scheme).removeprefix("torch."), _decode_qscheme,
                   name="torch.qscheme", subclasses=False)
