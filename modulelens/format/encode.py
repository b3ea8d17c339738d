"""Turn an in-memory :class:`ModuleRecord` into capture metadata (JSON) plus payloads."""

from __future__ import annotations

import time
from typing import Any

import torch

from modulelens.capture.distributed import original_class
from modulelens.capture.init_tracking import get_init_record
from modulelens.capture.records import CallRecord, ModuleRecord, StateSnapshot
from modulelens.errors import UnsupportedValueError
from modulelens.format.spec import FORMAT_NAME, FORMAT_VERSION
from modulelens.format.tensors import check_storable, dtype_name, tensor_bytes
from modulelens.format.tree import encode_tree
from modulelens.format.values import EncodeContext, encode_value


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class TensorTable:
    """Tensors of one capture: each distinct tensor object gets an id and a payload to store.

    Payloads are hashed by the repo when it stores them (hashing overlaps with writing there), which
    fills in each entry's ``"payload"``; identical contents then share one blob."""

    def __init__(self) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self.payloads: dict[str, memoryview] = {}  # tensor id -> bytes
        self._ids: dict[int, str] = {}
        self._keepalive: list[torch.Tensor] = []

    def add(self, tensor: torch.Tensor, path: str) -> str:
        existing = self._ids.get(id(tensor))
        if existing is not None:
            return existing
        check_storable(tensor, path)
        data = tensor_bytes(tensor)
        tid = f"t{len(self.entries)}"
        self.payloads[tid] = data
        self.entries[tid] = {
            "dtype": dtype_name(tensor.dtype),
            "shape": list(tensor.shape),
            "stride": list(tensor.stride()),
            "device": str(getattr(tensor, "_modulelens_device", tensor.device)),
            "payload": None,  # content hash, filled in by Repo.save_version
            "nbytes": len(data),
        }
        self._ids[id(tensor)] = tid
        self._keepalive.append(tensor)
        return tid


class ConstructionTable:
    """Constructor records of the target and of every module passed to a constructor."""

    def __init__(self, tensors: TensorTable) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self._tensors = tensors
        self._ids: dict[int, str] = {}

    def add(self, module: torch.nn.Module, path: str) -> str:
        existing = self._ids.get(id(module))
        if existing is not None:
            return existing
        record = get_init_record(module)
        if record is None:
            raise UnsupportedValueError(
                f"{path}: {type(module).__qualname__} was built before modulelens.track_init() "
                "was on, so its constructor arguments are unknown"
            )
        cls = original_class(type(module))  # the user's class, not FSDP2's FSDP<Cls>
        return self.add_record(cls, record.args, record.kwargs, path, key=id(module))

    def add_record(self, cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], path: str, key: int) -> str:
        ctx = EncodeContext(add_tensor=self._tensors.add, add_module=self.add)
        mid = f"m{len(self.entries)}"
        self._ids[key] = mid
        self.entries[mid] = {}  # reserve the id (a module cannot contain itself, but stay safe)
        try:
            entry = {
                "class": class_path(cls),
                "args": [encode_value(a, ctx, f"{path}args[{i}]") for i, a in enumerate(args)],
                "kwargs": {k: encode_value(v, ctx, f"{path}kwargs[{k!r}]") for k, v in kwargs.items()},
            }
        except BaseException:
            del self.entries[mid]
            del self._ids[key]
            raise
        self.entries[mid] = entry
        return mid


def encode_record(
    record: ModuleRecord,
    *,
    environment: dict[str, Any],
    settings: dict[str, Any],
    tags: list[str] | None = None,
    metadata: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, memoryview]]:
    """Capture metadata and the payloads it references (tensor id -> bytes)."""
    tensors = TensorTable()
    constructions = ConstructionTable(tensors)
    module_info: dict[str, Any] = {
        "class": class_path(record.module_class),
        "qualified_name": record.qualified_name,
        "construction": None,
    }
    if record.construction is None:
        module_info["construction_missing"] = "the module was built before modulelens.track_init() was on"
    else:
        # An unsupported constructor argument is an error naming it; the caller decides whether
        # to fail (strict) or to save without a constructor record and warn.
        module_info["construction"] = constructions.add_record(
            record.module_class, record.construction.args, record.construction.kwargs, "", key=id(record.module)
        )
    call_ctx = EncodeContext(add_tensor=tensors.add, lenient=True)
    calls = [_encode_call(call, call_ctx) for call in record.calls]
    states = [_encode_state(state, tensors, i) for i, state in enumerate(record.states)]
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "name": None,
        "version": None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tags": list(tags or []),
        "metadata": dict(metadata or {}),
        "module": module_info,
        "constructions": constructions.entries,
        "states": states,
        "calls": calls,
        "unrecorded": call_ctx.unrecorded,
        "capture": {**settings, "complete": record.complete, "calls_seen": record.seen_calls},
        "environment": environment,
        "tensors": tensors.entries,
    }
    return meta, tensors.payloads


def _encode_call(call: CallRecord, ctx: EncodeContext) -> dict[str, Any]:
    return {
        "index": call.index,
        "state": call.state_index,
        "training": call.training,
        "grad_enabled": call.grad_enabled,
        "autocast": call.autocast,
        "rng": {device: ctx.add_tensor(state, f"rng[{device}]") for device, state in call.rng.items()},
        "inputs": encode_tree((tuple(call.args), dict(call.kwargs)), ctx, f"call{call.index}.inputs"),
        "output": encode_tree(call.output, ctx, f"call{call.index}.output") if call.finished else None,
        "finished": call.finished,
        "error": call.error,
    }


def _encode_state(state: StateSnapshot, tensors: TensorTable, index: int) -> dict[str, Any]:
    ctx = EncodeContext(add_tensor=tensors.add)
    return {
        "parameters": {
            name: {"tensor": tensors.add(t, f"state{index}.{name}"), "requires_grad": state.requires_grad[name]}
            for name, t in state.parameters.items()
        },
        "buffers": {
            name: {"tensor": tensors.add(t, f"state{index}.{name}"), "persistent": state.persistent[name]}
            for name, t in state.buffers.items()
        },
        "extra_state": {name: encode_value(v, ctx, f"state{index}.{name}") for name, v in state.extra_state.items()},
    }
