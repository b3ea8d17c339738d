"""Inputs for a replay: check that every recorded input is usable, then take a private copy."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from modulelens.errors import RestoreError
from modulelens.format.layouts import clone, is_plain
from modulelens.format.shape_only import ShapeOnly
from modulelens.format.tree import deep_leaves, map_leaves
from modulelens.format.values import Unrecorded

if TYPE_CHECKING:
    from modulelens.restore.calls import Call


def check_inputs_usable(call: Call, inputs: object) -> None:
    """Raise :class:`RestoreError` naming the first input that was not recorded or has no values."""
    for path, leaf in deep_leaves(inputs):
        where = describe_input_path(path)
        if isinstance(leaf, Unrecorded):
            reason = f": {leaf.reason}" if leaf.reason else ""
            raise RestoreError(
                f"call {call.index} needs input {where} ({leaf.type_name}), which was not recorded{reason}; "
                "pass it yourself: module(*args, **kwargs) with call.args/call.kwargs completed"
            )
        if isinstance(leaf, ShapeOnly):
            raise RestoreError(
                f"call {call.index} input {where} ({leaf.describe()}) was stored shape-only, without values; "
                "load(..., synthesize=True) builds a synthetic input matching its recorded statistics"
            )


def describe_input_path(path: str) -> str:
    """An input path (of ``(args, kwargs)``) as the user wrote the call: ``[0][1]`` -> ``args[1]``;
    ``[1]['mask']`` -> ``kwargs['mask']``."""
    if path.startswith("[0]"):
        return "args" + path[3:]
    if path.startswith("[1]"):
        return "kwargs" + path[3:]
    return path or "<inputs>"


def copy_inputs(inputs: Any, device: torch.device | str | None, dtype: torch.dtype | None) -> Any:
    """Copies of the tensors in ``inputs`` (moved/cast as asked). One tensor passed twice is one
    copy; tensors that shared a storage share one copied storage, so in-place updates through one
    view show through the others."""
    target = torch.device(device) if device is not None else None
    tensors = [leaf for _, leaf in deep_leaves(inputs) if isinstance(leaf, torch.Tensor)]
    shared = _shared_storages(tensors, dtype)
    storages: dict[int, torch.Tensor] = {}
    copies: dict[int, torch.Tensor] = {}  # one copy per recorded tensor: attn(x, x, x) stays aliased

    def copy(_path: str, value: object) -> object:
        if not isinstance(value, torch.Tensor):
            return value
        if id(value) not in copies:
            copies[id(value)] = copy_tensor(value)
        return copies[id(value)]

    def copy_tensor(value: torch.Tensor) -> torch.Tensor:
        key = _storage_ptr(value)
        if key is not None and key in shared:
            if key not in storages:
                flat = value.as_strided((shared[key],), (1,), 0)
                storages[key] = flat.to(target).clone() if target is not None else flat.clone()
            return storages[key].as_strided(value.shape, value.stride(), value.storage_offset())
        out = value.to(target) if target is not None else value
        if dtype is not None and out.dtype.is_floating_point:
            out = out.to(dtype)
        return clone(out) if out is value else out

    return map_leaves(copy, inputs)


def with_recorded_grad(inputs: Any, requires_grad: Callable[[str, torch.Tensor], bool],
                       made: Callable[[torch.Tensor, torch.Tensor], None] | None = None) -> Any:
    """``inputs`` with each tensor for which ``requires_grad(path, tensor)`` is true made to require grad, as
    the recorded input did: some kernels choose their path by it (CPU attention with a bias that
    requires grad rounds differently). Each becomes a non-leaf copy, as an activation is, so in-place
    ops on it work as they did in the job; one tensor passed twice stays one tensor."""
    copies: dict[int, torch.Tensor] = {}

    def mark(path: str, value: object) -> object:
        if not isinstance(value, torch.Tensor) or value.requires_grad or not requires_grad(path, value) \
                or not (value.is_floating_point() or value.is_complex()):
            return value
        if id(value) not in copies:
            with torch.enable_grad():
                copies[id(value)] = value.detach().requires_grad_(True).clone()
            if made is not None:  # (the caller keeps track of what it handed out: payload_of)
                made(value, copies[id(value)])
        return copies[id(value)]

    return map_leaves(mark, inputs)


def _storage_ptr(tensor: torch.Tensor) -> int | None:
    if not is_plain(tensor):  # sparse and nested tensors are copied whole
        return None
    try:
        return tensor.untyped_storage().data_ptr() if tensor.numel() else None
    except (RuntimeError, NotImplementedError):
        return None


def _shared_storages(tensors: list[torch.Tensor], dtype: torch.dtype | None) -> dict[int, int]:
    """Storage pointer -> element count, for storages that several distinct tensors view."""
    groups: dict[int, dict[int, torch.Tensor]] = {}
    for tensor in tensors:
        key = _storage_ptr(tensor)
        if key is not None and type(tensor) is torch.Tensor:
            groups.setdefault(key, {})[id(tensor)] = tensor
    shared = {}
    for key, members in groups.items():
        views = list(members.values())
        dtypes = {v.dtype for v in views}
        if len(views) < 2 or len(dtypes) != 1:
            continue
        only = dtypes.pop()
        if dtype is not None and only.is_floating_point and only != dtype:
            continue  # a cast makes new tensors anyway
        shared[key] = views[0].untyped_storage().nbytes() // only.itemsize
    return shared
