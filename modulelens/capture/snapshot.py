"""Copy tensors out of a running job: detached, off the accelerator, safe from later in-place ops.

Copies are memoised by (tensor identity, version counter): a tensor seen twice unchanged (the
output of one target fed into another, tied weights) is copied once and stays one tensor in the
capture, while an in-place change bumps the version counter and forces a new copy.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import ModulelensError


class Snapshotter:
    def __init__(self) -> None:
        self._memo: dict[tuple[int, int], tuple[weakref.ref[torch.Tensor], torch.Tensor]] = {}
        self.pending_device_copies = False
        # id(DTensor) -> its full tensor, gathered by the tracer on every rank of its mesh before
        # the snapshot (a gather here, on the recording rank only, would hang the job).
        self.gathered: dict[int, torch.Tensor] = {}

    def tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        key = (id(tensor), tensor._version)
        hit = self._memo.get(key)
        if hit is not None and hit[0]() is tensor:
            return hit[1]
        copy = self._copy(tensor)
        if tensor.device.type != "cpu":
            copy._modulelens_device = str(tensor.device)  # type: ignore[attr-defined]
        try:
            self._memo[key] = (weakref.ref(tensor), copy)
        except TypeError:  # some tensor subclasses refuse weak references: just don't memoise
            pass
        return copy

    def _copy(self, tensor: torch.Tensor) -> torch.Tensor:
        source = self.gathered.get(id(tensor), tensor).detach()
        if type(source) is not torch.Tensor and hasattr(source, "full_tensor"):
            raise ModulelensError("a sharded tensor (DTensor) was not gathered on every rank of its mesh; "
                                  "not recorded")
        if source.device.type == "cpu":
            return source.clone(memory_format=torch.preserve_format)
        if source.device.type == "meta":
            return source.clone()
        pinned = torch.cuda.is_available() and source.device.type == "cuda"
        target = torch.empty_strided(source.size(), source.stride(), dtype=source.dtype, device="cpu", pin_memory=pinned) \
            if _is_dense(source) else torch.empty(source.size(), dtype=source.dtype, device="cpu", pin_memory=pinned)
        target.copy_(source, non_blocking=pinned)
        self.pending_device_copies |= pinned
        return target

    def tree(self, tree: Any) -> Any:
        return pytree.tree_map_only(torch.Tensor, self.tensor, tree)

    def synchronize(self) -> None:
        """Wait for non-blocking device-to-host copies before anything reads them."""
        if self.pending_device_copies:
            torch.cuda.synchronize()
            self.pending_device_copies = False

    def clear(self) -> None:
        self._memo.clear()


def _is_dense(tensor: torch.Tensor) -> bool:
    return tensor.is_contiguous() or tensor.is_contiguous(memory_format=torch.channels_last)
