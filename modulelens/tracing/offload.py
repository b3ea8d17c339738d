"""Weights that accelerate keeps off the module between calls (``cpu_offload``, ``disk_offload``,
``dispatch_model`` with offloading; issue 34, defect 3).

An offloading ``AlignDevicesHook`` leaves the module's parameters on the meta device and puts the
real ones in place only inside ``forward``, from its ``weights_map``. The tracer's pre-hook runs
before that, so it saw meta tensors ("a meta tensor has no data to store": the capture was
dropped). Here a meta parameter or buffer of a module with such a hook is read from the hook's
``weights_map``: the values its forward uses. The hooks themselves only move tensors between
devices, so a rebuilt module, which holds its weights, does without them.
"""

from __future__ import annotations

import weakref

import torch

# offloaded tensor -> the view of it given to the tracer, requiring grad as the module's parameter
# does (one view per tensor, so the tracer's state key sees the same tensor call after call)
_VIEWS: dict[tuple[int, bool], tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}


def offloaded(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` (a parameter or buffer ``name`` of ``module``), or, when it is a meta tensor
    that an accelerate offloading hook keeps elsewhere, the tensor its forward will use."""
    if not tensor.is_meta:
        return tensor
    for hook in _hooks(vars(module).get("_hf_hook")):
        weights = getattr(hook, "weights_map", None) if getattr(hook, "offload", False) else None
        if weights is None:
            continue
        try:
            found = weights[name]
        except (KeyError, TypeError):
            continue
        if isinstance(found, torch.Tensor) and not found.is_meta:
            return _view(found, tensor.requires_grad)
    return tensor


def _hooks(hook: object) -> list[object]:
    """The hooks in an accelerate hook (a ``SequentialHook`` holds several)."""
    if hook is None:
        return []
    inner = getattr(hook, "hooks", None)
    return [h for part in inner for h in _hooks(part)] if isinstance(inner, (list, tuple)) else [hook]


def _view(found: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    key = (id(found), requires_grad)
    cached = _VIEWS.get(key)
    if cached is not None and cached[0]() is found:
        return cached[1]
    view = found.detach().requires_grad_(requires_grad) if found.is_floating_point() or not requires_grad \
        else found.detach()
    _VIEWS[key] = (weakref.ref(found), view)
    return view
