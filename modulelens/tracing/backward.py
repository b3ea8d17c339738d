"""Record the backward pass of a captured call (``capture(..., backward=True)``).

When a recorded call's outputs require grad, one multi-grad hook on them waits for the gradient
that flows into the outputs during the job's own backward. It then asks autograd, re-entrantly,
for the gradients *of this call alone* with respect to its inputs and the module's parameters
(``torch.autograd.grad(outputs, inputs + params, output_grads, retain_graph=True)``): exactly what
``replay(backward=True)`` recomputes from the recorded output gradients, unaffected by other uses
of the same inputs (residual connections) or parameters (tied weights, other calls) in the job.
The job's own gradients are untouched; the cost is one extra backward through the module for each
recorded call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from modulelens.format.tree import deep_leaves, map_leaves
from modulelens.tracing.records import BackwardRecord, CallRecord
from modulelens.tracing.snapshot import Snapshotter


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for tensor in tensors:
        seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def separate_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    """The call's inputs with each tensor that requires grad replaced by a view of itself, so the
    module's input gradients can be taken alone: two inputs the job derived from one another
    (``gate = sigmoid(h)`` passed with ``h``) would otherwise leak gradient into each other.
    ``None`` when no input requires grad (the call then runs on its own inputs)."""
    if not any(isinstance(t, torch.Tensor) and t.requires_grad for _, t in deep_leaves((args, kwargs))):
        return None
    def view(_path: str, value: Any) -> Any:
        return value.view_as(value) if isinstance(value, torch.Tensor) and value.requires_grad else value
    new_args, new_kwargs = map_leaves(view, (args, kwargs))
    return tuple(new_args), dict(new_kwargs)


def watch_backward(
    call: CallRecord,
    module: torch.nn.Module,
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    output: Any,
    snap: Snapshotter,
    on_done: Callable[[CallRecord, BaseException | None], None],
) -> Any:
    """Hook the outputs of ``call``; returns the hook handle, or ``None`` when nothing needs grad."""
    outputs = _unique([t for _, t in deep_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad])
    if not outputs:
        return None
    input_tensors = _unique([t for _, t in deep_leaves(inputs) if isinstance(t, torch.Tensor) and t.requires_grad])
    named_params = [(n, p) for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad]
    params = _unique([p for _, p in named_params])
    call.backward_pending = True
    state = {"running": False, "done": False}

    def hook(grads: Any) -> None:
        # Our own autograd.grad below reaches these outputs again: ignore that (and any later
        # backward through the same graph); the first backward of the call is the recorded one.
        if state["running"] or state["done"]:
            return
        state["running"] = True
        try:
            reached = [(t, g) for t, g in zip(outputs, grads, strict=True) if g is not None]
            targets = input_tensors + params
            results: tuple[torch.Tensor | None, ...] = (None,) * len(targets)
            if reached and targets:
                with torch.enable_grad():
                    results = torch.autograd.grad([t for t, _ in reached], targets, [g for _, g in reached],
                                                  retain_graph=True, allow_unused=True)
            by_id = {id(t): r for t, r in zip(targets, results, strict=True)}
            out_by_id = {id(t): g for t, g in reached}

            def grad_of(table: dict[int, torch.Tensor | None]) -> Callable[[str, Any], Any]:
                def pick(_path: str, leaf: Any) -> Any:
                    grad = table.get(id(leaf)) if isinstance(leaf, torch.Tensor) else None
                    return snap.tensor(grad) if grad is not None else None
                return pick

            call.backward = BackwardRecord(
                output_grads=map_leaves(grad_of(out_by_id), output),
                input_grads=map_leaves(grad_of(by_id), inputs),
                param_grads={n: (snap.tensor(g) if (g := by_id.get(id(p))) is not None else None)
                             for n, p in named_params},
            )
            error = None
        except Exception as caught:  # fail open: never break the job's backward
            error = caught
        finally:
            state["running"], state["done"] = False, True
        call.backward_pending = False
        on_done(call, error)

    return torch.autograd.graph.register_multi_grad_hook(outputs, hook)
