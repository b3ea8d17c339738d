"""The module a tool runs: the capture's own, or a private copy in a chosen recorded state.

Tools must never change what a capture recorded: the rebuilt module shares its storage with the
capture's cached tensors, so switching states or a training-mode forward (BatchNorm running
statistics) would write into them. A private copy gets its state from fresh copy-on-write mappings
(:meth:`Capture.fresh_state_dict`).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture


def run_device(capture: Capture, device: str | torch.device | None = None) -> torch.device:
    """The device a tool runs on: the requested one, else the capture's, else the CPU."""
    if device is not None:
        return torch.device(device)
    return capture.device or torch.device("cpu")


def load_pristine_state(module: torch.nn.Module, capture: Capture, index: int) -> None:
    """Copy recorded state ``index`` (parameters and all buffers) into ``module``'s own storage."""
    tensors = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    with torch.no_grad():
        for name, value in capture.fresh_state_dict(index, persistent_only=False).items():
            target = tensors.get(name)
            if target is not None:
                target.copy_(value)


def working_module(
    capture: Capture,
    state_index: int = 0,
    *,
    device: torch.device | None = None,
    dtype: torch.dtype | None = None,
    private: bool = False,
) -> torch.nn.Module:
    """The capture's module in recorded state ``state_index``, on ``device``/``dtype``.

    The capture's own module is returned when it can be used as it is: one recorded state, already
    on that device/dtype, and ``private`` not asked (the caller will not change buffers). Otherwise
    a deep copy gets the recorded state from fresh mappings (see :meth:`Capture.fresh_tensor`), so
    switching states never writes into the capture's cached tensors.

    Example::

        module = working_module(cap, cap.calls[2].state_index, device=torch.device("cuda"))
    """
    same_device = device is None or device == (capture.device or torch.device("cpu")) or (
        device.type == "cpu" and capture.device is None)
    same_dtype = dtype is None or dtype == capture.dtype
    single_state = len(capture.metadata.get("states", [])) <= 1
    if same_device and same_dtype and single_state and not private:
        return capture.use_state(state_index)
    module = copy.deepcopy(capture.module)
    if capture.metadata.get("states"):
        load_pristine_state(module, capture, state_index)
    if device is not None:
        module.to(device)
    if dtype is not None:
        module.to(dtype)
    return module


def has_buffers(module: torch.nn.Module) -> bool:
    """Whether ``module`` (or a submodule) has any buffer (e.g. BatchNorm running statistics)."""
    return any(True for _ in module.buffers())
