"""Which captured tensors are stored shape-only (see docs/fidelity.md, "Shape-only records").

A *unit* is what a payload would hold: a tensor, or the shared storage span behind several views.
Call tensors (inputs, outputs, gradients) go shape-only when a unit is bigger than
``shape_only_over`` bytes, and then largest first while the capture exceeds ``max_bytes``.
Parameters and buffers are needed to rebuild the module, so they only go shape-only with
``shape_only_params=True``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from modulelens.format.layouts import is_plain
from modulelens.format.tree import deep_leaves
from modulelens.tracing.options import PayloadPolicy
from modulelens.tracing.records import ModuleRecord
from modulelens.tracing.snapshot import BASE_ATTR


def unit_of(tensor: torch.Tensor) -> torch.Tensor:
    base = getattr(tensor, BASE_ATTR, None)
    return tensor if base is None else base


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _units(tensors: Iterable[torch.Tensor]) -> dict[int, torch.Tensor]:
    return {id(unit_of(t)): unit_of(t) for t in tensors}


def call_tensors(record: ModuleRecord) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for call in record.calls:
        trees: list[Any] = [call.args, call.kwargs, call.output, call.mutated_inputs, call.buffers_after]
        if call.backward is not None:
            trees.extend([call.backward.output_grads, call.backward.input_grads, call.backward.param_grads])
        for tree in trees:
            # sparse and nested tensors are stored whole, as their parts (format/layouts.py)
            found.extend(leaf for _, leaf in deep_leaves(tree) if isinstance(leaf, torch.Tensor) and is_plain(leaf))
    return found


def state_tensors(record: ModuleRecord) -> list[torch.Tensor]:
    return [t for s in record.states for t in (*s.parameters.values(), *s.buffers.values())]


def plan_shape_only(record: ModuleRecord, policy: PayloadPolicy) -> set[int]:
    """Ids of the units to store shape-only."""
    if not policy.active:
        return set()
    calls = _units(call_tensors(record))
    states = _units(state_tensors(record))
    candidates = dict(calls)
    if policy.shape_only_params:
        candidates.update(states)
    else:
        for key in states:
            candidates.pop(key, None)  # a tensor that is also a parameter keeps its payload
    chosen: set[int] = set()
    if policy.shape_only_over is not None:
        chosen = {key for key, unit in candidates.items() if _nbytes(unit) > policy.shape_only_over}
    if policy.max_bytes is not None:
        every = {**calls, **states}
        total = sum(_nbytes(u) for key, u in every.items() if key not in chosen)
        for key, unit in sorted(candidates.items(), key=lambda item: -_nbytes(item[1])):
            if total <= policy.max_bytes:
                break
            if key not in chosen:
                chosen.add(key)
                total -= _nbytes(unit)
    return chosen
