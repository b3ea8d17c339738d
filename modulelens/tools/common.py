"""Helpers the tools share: the module and inputs to run, JSON-safe numbers (timing: :mod:`.timing`)."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from modulelens.errors import ModulelensError

if TYPE_CHECKING:
    from modulelens.restore.loader import Capture


class ToolError(ModulelensError):
    """A tool (profile, verify, diff) cannot do what it was asked (bad option, nothing to run)."""

    exit_code = 2


def run_device(capture: Capture, device: str | torch.device | None = None) -> torch.device:
    """The device a tool runs on: the requested one, else the capture's, else the CPU."""
    if device is not None:
        return torch.device(device)
    return capture.device or torch.device("cpu")


def pristine_tensor(capture: Capture, tid: str) -> torch.Tensor:
    """Recorded tensor ``tid`` from a fresh copy-on-write mapping of its payload.

    ``Capture.tensor`` returns cached tensors that the rebuilt module also uses as its parameter
    and buffer storage, so switching states (``use_state``) or a training-mode forward (BatchNorm
    running stats) changes them in place. Tools read recorded state from here instead.
    """
    from modulelens.format.tensors import dtype_from_name

    entry = capture.metadata["tensors"][tid]
    return capture.repo.open_tensor(entry["payload"], dtype_from_name(entry["dtype"]), entry["shape"], entry["nbytes"])


def pristine_state_dict(capture: Capture, index: int = 0, *, persistent_only: bool = True) -> dict[str, torch.Tensor]:
    """Parameters and (persistent) buffers of recorded state ``index``, as recorded.

    Example::

        candidate.load_state_dict(pristine_state_dict(cap, cap.calls[3].state_index))
    """
    state = capture.metadata["states"][index]
    result = {name: pristine_tensor(capture, e["tensor"]) for name, e in state["parameters"].items()}
    result.update({name: pristine_tensor(capture, e["tensor"]) for name, e in state["buffers"].items()
                   if e["persistent"] or not persistent_only})
    return result


def load_pristine_state(module: torch.nn.Module, capture: Capture, index: int) -> None:
    """Copy recorded state ``index`` (parameters and all buffers) into ``module``'s own storage."""
    tensors = {**dict(module.named_parameters(remove_duplicate=False)),
               **dict(module.named_buffers(remove_duplicate=False))}
    with torch.no_grad():
        for name, value in pristine_state_dict(capture, index, persistent_only=False).items():
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
    a deep copy gets the recorded state from fresh mappings (see :func:`pristine_tensor`), so
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


def output_tensors(output: Any) -> list[torch.Tensor]:
    """Tensor leaves of an output that autograd can differentiate."""
    return [t for t in pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.requires_grad]


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """Every tensor leaf of a pytree, in flattening order."""
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


def json_safe(value: Any) -> Any:
    """Replace NaN/inf (not valid JSON) by their string names, recursively."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "to_dict"):
        return json_safe(value.to_dict())
    return value


def store_report(capture: Capture, kind: str, data: dict[str, Any]) -> str | None:
    """Store a tool report with the capture's version; returns its path (None if the repo is read-only)."""
    try:
        return str(capture.repo.add_report(capture.ref, kind, json_safe(data)))
    except OSError:
        return None


def environment_facts(device: torch.device) -> dict[str, Any]:
    """torch version, device, CPU threads (and GPU name) for a report."""
    facts: dict[str, Any] = {"torch": torch.__version__, "device": str(device), "threads": torch.get_num_threads()}
    if device.type == "cuda":
        facts["gpu_name"] = torch.cuda.get_device_name(device)
    return facts
