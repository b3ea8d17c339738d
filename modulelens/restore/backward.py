"""``replay(backward=True)``: run a recorded call's backward and collect what to compare.

The replayed outputs get the recorded output gradients; the gradients with respect to the inputs
that had one recorded and to the module's parameters are compared with the recorded ones (see
:mod:`modulelens.tracing.backward` for what was recorded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch

from modulelens.errors import RestoreError
from modulelens.format.shape_only import ShapeOnly
from modulelens.format.tree import deep_leaves

if TYPE_CHECKING:
    from modulelens.restore.calls import Call

_Inputs = TypeVar("_Inputs")


def _recorded(call: Call) -> dict[str, Any]:
    data = call.backward
    if data is None:
        raise RestoreError(f"call {call.index} has no recorded backward (capture with record=Recording(backward=True))")
    return data


def require_recorded_grads(inputs: _Inputs, call: Call) -> _Inputs:
    """Mark the input tensors that have a recorded gradient as requiring grad."""
    grads = dict(deep_leaves(_recorded(call)["input_grads"]))
    for path, value in deep_leaves(inputs):
        if isinstance(grads.get(path), (torch.Tensor, ShapeOnly)) and isinstance(value, torch.Tensor):
            value.requires_grad_(True)
    return inputs


def run_backward(
    call: Call, module: torch.nn.Module, inputs: object, output: object, device: torch.device
) -> tuple[dict[str, dict[str, object]], dict[str, dict[str, object]]]:
    """``(recorded, replayed)`` gradients as ``{"inputs": {path: grad}, "params": {name: grad}}``."""
    recorded = _recorded(call)
    outputs, grad_outputs = [], []
    output_grads = dict(deep_leaves(recorded["output_grads"]))  # None leaves vanish: match by path
    for path, out in deep_leaves(output):
        grad = output_grads.get(path)
        if isinstance(grad, ShapeOnly):
            raise RestoreError(f"the gradient of output{path} ({grad.describe()}) was stored shape-only; "
                               "load(..., synthesize=True) runs backward with a synthetic one")
        if isinstance(grad, torch.Tensor) and isinstance(out, torch.Tensor) and out.requires_grad:
            outputs.append(out)
            grad_outputs.append(grad.to(device=out.device, dtype=out.dtype))
    expected: dict[str, dict[str, object]] = {"inputs": {}, "params": {}}
    targets: list[torch.Tensor] = []
    slots: list[tuple[str, str]] = []
    input_grads = dict(deep_leaves(recorded["input_grads"]))
    for path, value in deep_leaves(inputs):
        grad = input_grads.get(path)
        if isinstance(grad, (torch.Tensor, ShapeOnly)):
            if not isinstance(value, torch.Tensor):
                raise RestoreError(f"input {path} has a recorded gradient but is a {type(value).__name__}, "
                                   "not a tensor: no gradient can be taken for it")
            expected["inputs"][path] = grad
            targets.append(value)
            slots.append(("inputs", path))
    parameters = dict(module.named_parameters(remove_duplicate=False))
    for name, grad in recorded["param_grads"].items():
        if isinstance(grad, (torch.Tensor, ShapeOnly)):
            expected["params"][name] = grad
            if name not in parameters:
                raise RestoreError(f"the rebuilt module has no parameter {name!r} to take a gradient for")
            targets.append(parameters[name])
            slots.append(("params", name))
    unique: dict[int, torch.Tensor] = {id(t): t for t in targets}
    results: dict[int, torch.Tensor | None] = dict.fromkeys(unique)
    if outputs and unique:
        computed = torch.autograd.grad(outputs, list(unique.values()), grad_outputs, allow_unused=True)
        results = dict(zip(unique, computed, strict=True))
    actual: dict[str, dict[str, object]] = {"inputs": {}, "params": {}}
    for (group, key), target in zip(slots, targets, strict=True):
        actual[group][key] = results[id(target)]
    return expected, actual
